"""Costs of the ops among real ranks, from what the real ranks measure.

An op between two or more real ranks runs for real: a collective's real part on the real
sub-communicator, a pipeline transfer between real neighbours. Where the real members talk over the
host (gloo on the CPU device) it takes what the host takes: a few hundred microseconds through
gloo's threads, where the network model of the target cluster says tens. The closed loop's
simulation would then describe another job than the one the emulation runs, and the emulated
iteration could not agree with it. So the loop gives these ops what the real ranks measured
(`ClosedLoop.fold(costs=...)`); every other op keeps the network model's cost. On CUDA, where real
members talk over the GPUs' own fabric, the model's costs stay (`EmulatePhase` decides).

What is measured, on this rank, from the op's issue: for an op among real ranks only, to its
completion; for one with virtual members as well (a model-parallel all-reduce with virtual TP
peers), to when its real part completed (`OpEvent.real_done_ns`), not to its completion, which is
the replay engine's deadline and counts the cost the op was scheduled with (folding that would let
one slow iteration raise the cost for good). The real member that arrived first also counts its
wait for the others, so an instance's cost is the least any of its real members measured (each
publishes its own in the rendezvous store with its durations), the median of the last few
iterations. An op with virtual members costs the larger of that and the network model's cost (its
virtual part still crosses the target's network). The cost is the role's op, so every instance of
it in the simulated job takes it, also those among virtual ranks only.

Limits: the real part is seen complete when the program waits for the op, so an op waited on late
(an async op overlapped with compute) measures long on that rank; the least over the members
helps only where one of them waited at once. On a device the backend's helper thread drives the
real part and no real part is measured: such ops keep the model's cost.

An instance is named the same on every real rank: a collective by its members and its index among
the iteration's ops on that group, a transfer by sender, receiver and its index among the
iteration's transfers between them in that direction (the graph's `Op.seq`).
"""

from __future__ import annotations

import collections
import statistics
import zlib
from collections.abc import Iterable, Mapping, Sequence

from prism_megatron.graph import NodeType, World
from prism_megatron.graph.world import peer_of
from prism_megatron.replay.events import OpEvent
from prism_megatron.replay.schedule import OpKind

DEFAULT_WINDOW = 3


def collective_key(members: Sequence[int], seq: int, *, mixed: bool = False) -> str:
    """Short for any group (a world group has thousands of members): size, first member, checksum;
    "m:" for a group with virtual members too, "c:" for one of real ranks only."""
    checksum = zlib.crc32(",".join(map(str, members)).encode())
    return f"{'m' if mixed else 'c'}:{len(members)}:{members[0]}:{checksum:08x}:{seq}"


def is_mixed(key: str) -> bool:
    """The instance has virtual members as well (its cost is at least the model's)."""
    return key.startswith("m:")


def transfer_key(sender: int, receiver: int, seq: int) -> str:
    return f"p:{sender}>{receiver}:{seq}"


def op_keys(
    ops: Iterable[object], world: World, virtual_rank: int, real_ranks: Sequence[int]
) -> dict[str, list[int]]:
    """The instance key of each op of `virtual_rank`'s role (its flat op order, as
    `Problem.role_ops` holds it: (stream, index, op)) that two or more real ranks take part in, with
    the op's positions."""
    real = set(real_ranks)
    keys: dict[str, list[int]] = {}
    for position, (_, _, op) in enumerate(ops):
        key = None
        if op.type == NodeType.COLLECTIVE:
            members = world.group(op.group, virtual_rank)
            if len(real.intersection(members)) >= 2:
                key = collective_key(members, op.seq, mixed=not real.issuperset(members))
        elif op.type in (NodeType.SEND, NodeType.RECV) and world.group(op.group, virtual_rank):
            peer = peer_of(world, op.group, virtual_rank, op.offset)
            if peer in real and peer != virtual_rank:
                sender, receiver = (virtual_rank, peer) if op.type == NodeType.SEND else (peer, virtual_rank)
                key = transfer_key(sender, receiver, op.seq)
        if key is not None:
            keys.setdefault(key, []).append(position)
    return keys


def measured_costs(events: Iterable[OpEvent], virtual_rank: int, real_ranks: Sequence[int]) -> dict[str, int]:
    """One iteration's ops among two or more real ranks: instance key -> what this rank measured
    (ns; see the module docstring)."""
    real = set(real_ranks)
    counts: collections.Counter[tuple] = collections.Counter()
    costs: dict[str, int] = {}
    for event in sorted(events, key=lambda e: e.issue_ns):
        if event.peer < 0:
            slot = ("c", event.group)
            shared = len(real.intersection(event.group)) >= 2
            key = collective_key(event.group, counts[slot], mixed=event.has_virtual) if shared else None
        else:
            is_send = event.kind == OpKind.SEND
            slot = ("p", event.peer, is_send)
            sender, receiver = (virtual_rank, event.peer) if is_send else (event.peer, virtual_rank)
            key = transfer_key(sender, receiver, counts[slot]) if event.peer in real else None
        counts[slot] += 1
        done_ns = event.real_done_ns if event.has_virtual else event.complete_ns
        if key is not None and done_ns >= 0:
            costs[key] = max(done_ns - event.issue_ns, 0)
    return costs


class RealCosts:
    """This rank's measurements over the last `window` iterations, and the costs all real ranks'
    measurements give the instances they share."""

    def __init__(self, *, virtual_rank: int, real_ranks: Sequence[int], window: int = DEFAULT_WINDOW) -> None:
        self.virtual_rank = virtual_rank
        self.real_ranks = tuple(real_ranks)
        self._window: collections.deque[dict[str, int]] = collections.deque(maxlen=window)

    def add(self, events: Iterable[OpEvent]) -> None:
        self._window.append(measured_costs(events, self.virtual_rank, self.real_ranks))

    def current(self) -> dict[str, int]:
        """Per instance, the median of this rank's last measurements (what it publishes)."""
        values: dict[str, list[int]] = {}
        for costs in self._window:
            for key, cost in costs.items():
                values.setdefault(key, []).append(cost)
        return {key: round(statistics.median(v)) for key, v in values.items()}

    def latest(self) -> dict[str, int]:
        """Per instance, what this rank measured in its last iteration (the replay's costs)."""
        return dict(self._window[-1]) if self._window else {}


def shared_costs(
    published: Mapping[int, Mapping[str, int]], holders: Mapping[str, Sequence[int]]
) -> dict[str, int]:
    """Per instance, the least cost its real members measured, once every one of them has published
    one (`published`: virtual rank -> its `RealCosts.current()`; `holders`: instance key -> the real
    ranks taking part)."""
    costs = {}
    for key, ranks in holders.items():
        values = [published[r][key] for r in ranks if key in published.get(r, {})]
        if values and len(values) == len(ranks):
            costs[key] = min(values)
    return costs
