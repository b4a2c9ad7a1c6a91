"""Costs of the ops among real ranks, from what the real ranks measure.

An op between two or more real ranks runs for real: a collective's real part on the real
sub-communicator, a pipeline transfer between real neighbours. Where the real members talk over the
host (gloo on the CPU device) it takes what the host takes: a few hundred microseconds through
gloo's threads, where the network model of the target cluster says tens. The closed loop's
simulation would then describe another job than the one the emulation runs, and the emulated
iteration could not agree with it. So the loop gives these ops what the real ranks measured
(`ClosedLoop.fold(costs=...)`); every other op keeps the network model's cost. On CUDA, where real
members talk over the GPUs' own fabric, the model's costs stay (`EmulatePhase` decides).

What is measured: an op among real ranks only (no virtual member), from its issue to its
completion on this rank. The real member that arrived first also counts its wait for the others, so
an instance's cost is the least any of its real members measured (each publishes its own in the
rendezvous store with its durations), the median of the last few iterations. The cost is the role's
op, so every instance of it in the simulated job takes it, also those among virtual ranks only.

Limits: an op with virtual members as well (a model-parallel all-reduce with virtual TP peers)
keeps the network model's cost. Its completion is the later of its real part and the replay
engine's deadline, which counts the scheduled cost, so a measurement of it is never below the cost
it was scheduled with: folding it would let one slow iteration raise the cost for good. Its real
part's excess over the model's cost (about 0.3 ms per all-reduce through gloo, once the consistency
check is off its path) stays out of the simulation.

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


def collective_key(members: Sequence[int], seq: int) -> str:
    """Short for any group (a world group has thousands of members): size, first member, checksum."""
    checksum = zlib.crc32(",".join(map(str, members)).encode())
    return f"c:{len(members)}:{members[0]}:{checksum:08x}:{seq}"


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
                key = collective_key(members, op.seq)
        elif op.type in (NodeType.SEND, NodeType.RECV) and world.group(op.group, virtual_rank):
            peer = peer_of(world, op.group, virtual_rank, op.offset)
            if peer in real and peer != virtual_rank:
                sender, receiver = (virtual_rank, peer) if op.type == NodeType.SEND else (peer, virtual_rank)
                key = transfer_key(sender, receiver, op.seq)
        if key is not None:
            keys.setdefault(key, []).append(position)
    return keys


def measured_costs(events: Iterable[OpEvent], virtual_rank: int, real_ranks: Sequence[int]) -> dict[str, int]:
    """One iteration's ops among real ranks only: instance key -> completion minus issue on this
    rank (ns); ops that also have virtual members are left out (see the module docstring)."""
    real = set(real_ranks)
    counts: collections.Counter[tuple] = collections.Counter()
    costs: dict[str, int] = {}
    for event in sorted(events, key=lambda e: e.issue_ns):
        if event.peer < 0:
            slot = ("c", event.group)
            key = (
                collective_key(event.group, counts[slot])
                if len(real.intersection(event.group)) >= 2
                else None
            )
        else:
            is_send = event.kind == OpKind.SEND
            slot = ("p", event.peer, is_send)
            sender, receiver = (virtual_rank, event.peer) if is_send else (event.peer, virtual_rank)
            key = transfer_key(sender, receiver, counts[slot]) if event.peer in real else None
        counts[slot] += 1
        if key is not None and not event.has_virtual and event.complete_ns >= 0:
            costs[key] = max(event.complete_ns - event.start_ns, 0)
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
