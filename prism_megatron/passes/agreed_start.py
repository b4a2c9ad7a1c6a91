"""Real ranks begin every iteration at one agreed time.

Between two iterations each real rank does host work of its own length: it reads the iteration's
marks, re-simulates the job with what it measured and loads the next schedule (milliseconds, and not
the same on every rank). A rank that started the next iteration as soon as it was done would reach
the first op it shares with a slower rank early and wait there, so its iteration would carry the
other rank's host work; and its replay schedule, which counts every virtual peer's arrival from its
own start, would place its virtual peers earlier than the other rank's. In the simulated job every
rank starts the iteration at time zero, so the real ranks agree on one start instead: each publishes
when it is ready in the rendezvous store, reads every real rank's, and all wait until the latest
ready time plus a margin. The host work between iterations is then in no iteration's time, and the
time each rank waited for the start is reported.

The margin covers the exchange itself: the last rank to be ready must still learn every value
before the start. Each rank publishes how long its last exchange took after the last rank was
ready, and the margin is twice the longest of those (at least `MIN_MARGIN_NS`, at most
`MAX_MARGIN_NS`), so every rank computes the same start from the same values. A rank that learns
the start after it has passed, or that the host wakes late from its wait, starts late;
`StartRecord.late_ns` says by how much.

Times are the host's CLOCK_MONOTONIC, so the start is exact for real ranks on one machine (the CPU
emulation, several ranks per GPU host); real ranks on several machines need clocks synchronised to
well under the margin.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Sequence
from typing import Any

from prism_megatron import replay
from prism_megatron.replay import clock

MIN_MARGIN_NS = 300_000
"""The least margin: a store round trip on a loaded host takes a few hundred microseconds."""
FIRST_MARGIN_NS = 5_000_000
"""The margin before any exchange has been timed."""
MAX_MARGIN_NS = 50_000_000
"""A bound on the margin, so one descheduled exchange cannot idle every later start for long."""
KEY_PREFIX = "prism-megatron/start"


@dataclasses.dataclass(frozen=True, kw_only=True)
class StartRecord:
    """One iteration's agreed start, seen from this rank (host CLOCK_MONOTONIC ns)."""

    number: int
    """The iteration's number in this pass, from 0."""
    ready_ns: int
    """When this rank was ready (its host work since the last iteration done)."""
    start_ns: int
    """The agreed start: the latest ready time of all real ranks plus the margin."""
    margin_ns: int
    late_ns: int
    """How far past the agreed start this rank returned from its wait: it learned the start late,
    or the host woke it late (a loaded machine); it starts this late."""
    all_matched: bool
    """Every real rank's program has matched the execution graph in every iteration it compared."""

    @property
    def waited_ns(self) -> int:
        """This rank's time between being ready and the start: in no iteration's time."""
        return self.start_ns + self.late_ns - self.ready_ns


class StartAgreement:
    """The agreed start of every iteration among `real_ranks`, through the rendezvous `store`
    (any torch.distributed Store: set, wait, multi_get). Every real rank calls `agree` once per
    iteration, in the same order."""

    def __init__(self, *, store: Any, real_ranks: Sequence[int], virtual_rank: int) -> None:
        if virtual_rank not in real_ranks:
            raise ValueError(f"virtual rank {virtual_rank} is not one of the real ranks {list(real_ranks)}")
        self.store = store
        self.real_ranks = tuple(real_ranks)
        self.virtual_rank = virtual_rank
        self.number = 0
        self._exchange_ns = -1
        """How long this rank's last exchange took after the last rank was ready (-1: none yet)."""

    def agree(self, *, matched: bool = False) -> StartRecord:
        """Publish that this rank is ready, learn the start, wait until it; returns the record.

        Args:
            matched: this rank's program has matched the graph so far (the records tell every rank
                whether all have, so all can change how they check their ops at the same iteration).
        """
        number = self.number
        self.number += 1
        ready_ns = clock.now_ns()
        self.store.set(_key(number, self.virtual_rank), json.dumps([ready_ns, self._exchange_ns, matched]))
        keys = [_key(number, rank) for rank in self.real_ranks]
        self.store.wait(keys)
        values = [json.loads(raw) for raw in self.store.multi_get(keys)]
        learned_ns = clock.now_ns()
        last_ready_ns = max(v[0] for v in values)
        exchanges = [v[1] for v in values]
        margin_ns = (
            FIRST_MARGIN_NS
            if min(exchanges) < 0
            else min(max(2 * max(exchanges), MIN_MARGIN_NS), MAX_MARGIN_NS)
        )
        start_ns = last_ready_ns + margin_ns
        self._exchange_ns = max(learned_ns - last_ready_ns, 0)
        replay.wait_until_ns(start_ns)  # a peer's time: kept on the core where the process owns it
        began_ns = clock.now_ns()
        if number >= 2:  # every rank has read it: it reached the start of `number - 1`
            self.store.delete_key(_key(number - 2, self.virtual_rank))
        return StartRecord(
            number=number,
            ready_ns=ready_ns,
            start_ns=start_ns,
            margin_ns=margin_ns,
            late_ns=max(began_ns - start_ns, 0),
            all_matched=all(bool(v[2]) for v in values),
        )


def _key(number: int, virtual_rank: int) -> str:
    return f"{KEY_PREFIX}/{number}/{virtual_rank}"
