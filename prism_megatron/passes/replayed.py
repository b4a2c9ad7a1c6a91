"""An emulated iteration's replay schedule, replayed with the compute that iteration measured.

The closed loop gives each emulated iteration a replay schedule: the simulation of the job with the
compute spans measured so far (those of the median of the last few iterations). The simulated time
of that schedule is what the iteration should take only if the real ranks compute as they did before. A
real rank's compute drifts from one iteration to the next (on a shared host by tens of percent),
and the virtual peers do not follow it within the iteration: they arrive when the schedule says.
A rank that computes longer than scheduled arrives late and carries the whole difference; one that
computes shorter waits for its peers and gains nothing. So against the schedule's simulation the
emulated iteration comes out longer on average even when every op completes exactly when the
engine's rule says.

Like compared with like is the schedule replayed with what the iteration itself computed: every
real rank's ops in the simulation's order, each compute op taking the span that rank measured in
the iteration, each op with other participants completing at the latest of its own post, its
virtual members' arrival in the schedule and its real members' posts in this replay, plus the op's
simulated cost; an op among real ranks, which runs for real, costs what the real ranks measured of
it in that same iteration where they did (`real_costs.py`: on the CPU device, gloo through the
host, whose time varies from one iteration to the next as compute does). The difference between
the emulated iteration and this replay is the emulation's own error: ops that completed later than
the rule (late wake-ups, a real part that ended after the op was charged) and host work inside
ops. The difference between the replay and the schedule's simulation is the drift of the measured
inputs.

The semantics are the simulator's (`sim/reference.py`): a stream runs its ops in order, coalesced
ops post together and the stream goes on when all of them completed, an op waits for its
dependencies' batches, a wait completes when its dependency does. With the simulated spans the
replay gives each real rank's simulated finish (a test holds it to that).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

from prism_megatron.graph import NodeType
from prism_megatron.sim.engine import OpTiming, SimResult


@dataclasses.dataclass
class _Stream:
    """One stream of one real rank in the replay."""

    virtual_rank: int
    name: str
    positions: list[int]
    cursor: int = 0
    free_ns: int = 0
    posted: tuple[list[int], int] | None = None
    """The batch posted and waiting for real members to post their side (positions, post time)."""


def replayed_finish_ns(
    result: SimResult,
    *,
    compute_ns: Mapping[int, Sequence[int]],
    arrivals_ns: Mapping[int, Mapping[int, int]],
    shared: Mapping[int, Mapping[str, Sequence[int]]],
    op_costs_ns: Mapping[int, Mapping[int, int]] | None = None,
) -> dict[int, int]:
    """Each real rank's finish, from the iteration start, replaying its ops in `result`.

    Args:
        result: the simulation the iteration's replay schedules were read from.
        compute_ns: real rank -> the span of each of its compute ops, in its role's flat op order
            (`Problem.role_ops`; what `graph.capture.compute_durations` gives for an iteration).
        arrivals_ns: real rank -> {position of an op with virtual members: their latest arrival},
            as its replay schedule has it (`ScheduleIndex.arrivals`).
        shared: real rank -> {instance key: positions} of its ops among real ranks
            (`real_costs.op_keys`); an op waits for every replayed rank that holds its key.
        op_costs_ns: real rank -> {position: cost} of its ops among real ranks, as measured in the
            iteration; other ops cost what the simulation says.

    An op with neither virtual members nor another replayed real member keeps the simulated arrival
    of its other members, if any arrived after this rank did in the simulation.

    Raises:
        ValueError: a rank's spans are not one per compute op.
    """
    timelines = {rank: result.timeline(rank) for rank in compute_ns}
    costs = op_costs_ns or {}
    spans: dict[int, dict[int, int]] = {}
    for rank, timeline in timelines.items():
        compute = [p for p, t in enumerate(timeline) if t.op.type == NodeType.COMPUTE]
        if len(compute) != len(compute_ns[rank]):
            raise ValueError(
                f"virtual rank {rank} has {len(compute)} compute ops, got {len(compute_ns[rank])} spans"
            )
        spans[rank] = dict(zip(compute, (int(v) for v in compute_ns[rank]), strict=True))
    key_of = {(rank, p): key for rank, keys in shared.items() if rank in compute_ns
              for key, positions in keys.items() for p in positions}  # fmt: skip
    holders: dict[str, set[int]] = {}
    for rank, key in ((rank, key) for (rank, _), key in key_of.items()):
        holders.setdefault(key, set()).add(rank)
    streams = []
    for rank, timeline in timelines.items():
        by_name: dict[str, list[int]] = {}
        for position, t in enumerate(timeline):
            by_name.setdefault(t.stream, []).append(position)
        streams += [_Stream(rank, name, positions) for name, positions in by_name.items()]
    posts: dict[str, dict[int, int]] = {}
    """Instance key -> real rank -> when it posted its op."""
    done: dict[tuple[int, str, int], int] = {}
    """(rank, stream, index) -> when the batch holding that op completed."""

    def others_ns(rank: int, position: int, t: OpTiming) -> int | None:
        """When the op's other members were all there; None while a real member has not posted."""
        key = key_of.get((rank, position))
        virtual = arrivals_ns.get(rank, {}).get(position)
        if virtual is None and (key is None or holders[key] == {rank}):
            return t.ready_ns if t.ready_ns > t.start_ns else 0
        real = posts.get(key, {}) if key is not None else {}
        if key is not None and len(real) < len(holders[key]):
            return None
        return max([virtual or 0, *(v for r, v in real.items() if r != rank)])

    def step(stream: _Stream) -> bool:
        timeline = timelines[stream.virtual_rank]
        if stream.posted is None:
            first = last = stream.cursor
            while last + 1 < len(stream.positions) and timeline[stream.positions[last]].op.coalesced:
                last += 1
            batch = stream.positions[first : last + 1]
            deps = [(stream.virtual_rank, d.stream, d.index) for p in batch for d in timeline[p].op.deps]
            if any(d not in done for d in deps):
                return False
            post_ns = max([stream.free_ns, *(done[d] for d in deps)])
            for p in batch:
                if (stream.virtual_rank, p) in key_of:
                    posts.setdefault(key_of[stream.virtual_rank, p], {})[stream.virtual_rank] = post_ns
            stream.posted = (batch, post_ns)
        batch, post_ns = stream.posted
        ends = []
        for p in batch:
            t = timeline[p]
            if t.op.type == NodeType.COMPUTE:
                ends.append(post_ns + spans[stream.virtual_rank][p])
            elif t.op.type == NodeType.WAIT:
                ends.append(post_ns)
            else:
                arrived_ns = others_ns(stream.virtual_rank, p, t)
                if arrived_ns is None:
                    return False
                cost_ns = costs.get(stream.virtual_rank, {}).get(p, t.end_ns - t.ready_ns)
                ends.append(max(post_ns, arrived_ns) + cost_ns)
        end_ns = max(ends)
        for p in batch:
            done[(stream.virtual_rank, stream.name, timeline[p].index)] = end_ns
        stream.free_ns, stream.posted = end_ns, None
        stream.cursor += len(batch)
        return True

    moved = True
    while moved:
        moved = False
        for stream in streams:
            while stream.cursor < len(stream.positions) and step(stream):
                moved = True
    stuck = [f"{s.virtual_rank}/{s.name}" for s in streams if s.cursor < len(s.positions)]
    if stuck:  # the simulation ran these ops, so the replay cannot deadlock on them
        raise AssertionError(f"the replay of the real ranks' ops is stuck on streams {stuck}")
    finish = dict.fromkeys(compute_ns, 0)
    for (rank, _, _), end_ns in done.items():
        finish[rank] = max(finish[rank], end_ns)
    return finish
