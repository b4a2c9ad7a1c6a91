"""A simulation problem: the graph flattened into the arrays the C++ core reads.

Memory is O(roles x ops) for the ops and O(nodes x group kinds) for the groups: ops are stored once
per role and every node points at its role. Arrays (all C-contiguous, checked by csrc/sim):

    node_role[N] int32          role id of each node
    compute_factor[N], nic_factor[N], expert_factor[N] float64   what-if slowdowns (1.0: none)
    stream_begin[R*S+1] int64   ops of role r, stream s: [stream_begin[r*S+s], stream_begin[r*S+s+1])
    op_type, op_comm[O] int8    NodeType; OpKind for communication (-1 otherwise)
    op_coalesced[O] uint8
    op_expert[O] uint8          expert compute (scaled by expert_factor too)
    op_duration_ns, op_cost_ns, op_size_bytes[O] int64
    op_overhead_ns[O] int64     host part of a compute op's duration (a straggler stretches the rest)
    op_spec[O] int32            row of coll_instance (collectives) or p2p_peer (SEND/RECV)
    op_seq[O] int32             matching sequence number
    op_dep_begin[O+1] int32, dep_stream[D], dep_index[D] int32   cross-stream dependencies
    coll_instance[K*N] int32, instance_size[I] int32, p2p_peer[P*N] int32   (see groups.py)
    p2p_partner[P] int32        the spec a peer names us by: same kind, opposite offset

A node is a virtual rank (full mode) or a role (symmetric mode, see groups.py).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence

import numpy as np

from prism_megatron.graph.schema import ExecutionGraph, NodeType, Op
from prism_megatron.graph.world import World, peer_of
from prism_megatron.replay.schedule import OpKind
from prism_megatron.sim import contention, groups, whatif
from prism_megatron.sim.concurrency import ConcurrencyFactor
from prism_megatron.sim.cost import CostFn
from prism_megatron.sim.whatif import WhatIf


@dataclasses.dataclass(frozen=True, eq=False)
class Problem:
    """The immutable input of one simulation (graph, world and arrays)."""

    graph: ExecutionGraph
    world: World
    symmetric: bool
    role_names: tuple[str, ...]
    stream_names: tuple[tuple[str, ...], ...]
    """Per role id, its streams in order (stream index = position)."""
    role_ops: tuple[tuple[tuple[str, int, Op], ...], ...]
    """Per role id, its ops flattened stream by stream: (stream name, index in stream, op)."""
    num_streams: int
    node_rank: np.ndarray
    """Virtual rank each node simulates (symmetric mode: the role's representative)."""
    coll_specs: tuple[str, ...]
    p2p_specs: tuple[tuple[str, int], ...]
    arrays: dict[str, np.ndarray]
    concurrency: ConcurrencyFactor | None = None
    """The cost model's concurrency term (`sim.concurrency`); None: every op costs what it costs alone
    (`op_cost_ns`), whatever runs beside it."""
    compute_slowdown: float = 0.0
    """Fraction by which a compute op slows while its node has a communication kernel in flight
    (`sim.contention`); 0: compute costs its duration whatever overlaps it (CPU and measured spans)."""

    @property
    def num_nodes(self) -> int:
        return len(self.node_rank)

    def node_of(self, virtual_rank: int) -> int:
        """The node whose timeline is this rank's."""
        if not 0 <= virtual_rank < self.world.world_size:
            raise ValueError(
                f"virtual rank {virtual_rank} is outside the world (0..{self.world.world_size - 1})"
            )
        return int(self.world.role_ids()[virtual_rank]) if self.symmetric else virtual_rank

    def role_base(self, role_id: int) -> int:
        return int(self.arrays["stream_begin"][role_id * self.num_streams])

    def with_compute_durations(self, durations_ns: Mapping[str, Sequence[int]]) -> Problem:
        """A copy whose roles' COMPUTE ops take the given durations (role name -> one duration per
        compute op, in the role's flat op order): the closed loop folds measured spans in this way
        and re-simulates without rebuilding groups or costs.

        Raises:
            ValueError: an unknown role, or a count that differs from the role's compute ops.
        """
        durations = self.arrays["op_duration_ns"].copy()
        for name, values in durations_ns.items():
            if name not in self.role_names:
                raise ValueError(
                    f"role {name!r} is not a role of this job; roles: {', '.join(self.role_names)}"
                )
            role = self.role_names.index(name)
            compute = [i for i, (_, _, op) in enumerate(self.role_ops[role]) if op.type == NodeType.COMPUTE]
            if len(values) != len(compute):
                raise ValueError(f"role {name!r} has {len(compute)} compute ops, got {len(values)} durations")
            if any(v < 0 for v in values):
                raise ValueError(f"role {name!r}: durations must be >= 0")
            durations[self.role_base(role) + np.asarray(compute, dtype=np.int64)] = np.asarray(
                values, dtype=np.int64
            )
        return dataclasses.replace(self, arrays={**self.arrays, "op_duration_ns": durations})

    def with_comm_costs(self, costs_ns: Mapping[str, Mapping[int, int]]) -> Problem:
        """A copy whose roles' communication ops cost the given times (role name -> {position in the
        role's flat op order: cost in ns}) instead of the network model's: the closed loop gives the
        ops among real ranks what those ranks measured. The op of a role is every instance of it
        (symmetry), and a collective or transfer costs the most any member's op says.

        Raises:
            ValueError: an unknown role, a position that is not a communication op of the role, or a
                negative cost.
        """
        costs = self.arrays["op_cost_ns"].copy()
        for name, values in costs_ns.items():
            if name not in self.role_names:
                raise ValueError(
                    f"role {name!r} is not a role of this job; roles: {', '.join(self.role_names)}"
                )
            role = self.role_names.index(name)
            ops = self.role_ops[role]
            for position, cost_ns in values.items():
                if not 0 <= position < len(ops) or ops[position][2].type not in _COMM_TYPES:
                    raise ValueError(f"role {name!r}: op {position} is not one of its communication ops")
                if cost_ns < 0:
                    raise ValueError(f"role {name!r}: op {position}: a cost must be >= 0, got {cost_ns}")
                costs[self.role_base(role) + position] = int(cost_ns)
        return dataclasses.replace(self, arrays={**self.arrays, "op_cost_ns": costs})


_COMM_TYPES = (NodeType.COLLECTIVE, NodeType.SEND, NodeType.RECV)


def build_problem(
    graph: ExecutionGraph,
    world: World,
    cost_fn: CostFn,
    what_if: WhatIf | None = None,
    *,
    symmetric: bool | None = None,
    compute_slowdown: float | None = None,
) -> Problem:
    """Flatten `graph` for `world`.

    Args:
        symmetric: one node per role (True) or per rank (False); default: per role unless
            `what_if` makes ranks of one role differ.
        compute_slowdown: the contention term's slowdown (`sim.contention`); default: the one of
            the device the graph was captured on (its metadata), 0 where it names none.

    Raises:
        ValueError: the graph lacks a role of the world, numbers p2p ops inconsistently,
            symmetric mode was asked for with an asymmetry, or the slowdown is negative.
    """
    if compute_slowdown is None:
        compute_slowdown = contention.compute_slowdown_of(contention.graph_device(graph.metadata.extra))
    if compute_slowdown < 0:
        raise ValueError(f"compute_slowdown must be >= 0 (0: no contention term), got {compute_slowdown}")
    what_if = what_if or WhatIf()
    role_names = world.roles()
    per_rank = what_if.per_rank(world.world_size)
    per_role = {
        key: whatif.per_role(values, world.role_ids(), len(role_names)) for key, values in per_rank.items()
    }
    alike = all(values is not None for values in per_role.values())
    symmetric = alike if symmetric is None else symmetric
    if symmetric and not alike:
        raise ValueError(
            f"the what-if on virtual ranks {what_if.ranks[:8]} makes ranks of one role differ: "
            f"simulate every rank (symmetric=False)"
        )
    missing = [name for name in role_names if name not in graph.roles]
    if missing:
        raise ValueError(
            f"the graph has no ops for roles {missing[:8]} of this job (graph roles: {list(graph.roles)[:8]})"
        )
    flat = _Flattener(graph, world, role_names)
    arrays = flat.arrays()
    arrays["op_cost_ns"] = _costs(flat, world, cost_fn)
    reps = np.array([world.representative(name) for name in role_names], dtype=np.int64)
    if symmetric:
        node_rank = reps
        arrays["node_role"] = np.arange(len(role_names), dtype=np.int32)
        coll, sizes = groups.symmetric_instances(world, flat.coll_specs, reps)
        peers = groups.symmetric_peers(world, flat.p2p_specs, reps)
    else:
        node_rank = np.arange(world.world_size, dtype=np.int64)
        arrays["node_role"] = world.role_ids().astype(np.int32)
        coll, sizes = groups.full_instances(world, flat.coll_specs)
        peers = groups.full_peers(world, flat.p2p_specs)
    arrays.update(coll_instance=coll.ravel(), instance_size=sizes, p2p_peer=peers.ravel())
    arrays.update(per_role if symmetric else per_rank)
    return Problem(
        graph=graph,
        world=world,
        symmetric=symmetric,
        role_names=role_names,
        stream_names=tuple(flat.stream_names),
        role_ops=tuple(flat.role_ops),
        num_streams=flat.num_streams,
        node_rank=node_rank,
        coll_specs=flat.coll_specs,
        p2p_specs=flat.p2p_specs,
        arrays=arrays,
        concurrency=getattr(cost_fn, "concurrency_factor", None),
        compute_slowdown=float(compute_slowdown),
    )


class _Flattener:
    """Lays every role's streams end to end and numbers group kinds and peers as specs."""

    def __init__(self, graph: ExecutionGraph, world: World, role_names: tuple[str, ...]) -> None:
        self.world = world
        self.roles = [graph.roles[name] for name in role_names]
        self.num_streams = max(len(role.streams) for role in self.roles)
        self.stream_names = [tuple(role.streams) for role in self.roles]
        self.role_ops = [
            tuple((stream, i, op) for stream, ops in role.streams.items() for i, op in enumerate(ops))
            for role in self.roles
        ]
        coll: dict[str, int] = {}
        p2p: dict[tuple[str, int], int] = {}
        for ops in self.role_ops:
            for _, _, op in ops:
                if op.type == NodeType.COLLECTIVE:
                    coll.setdefault(op.group, len(coll))
                elif op.type in (NodeType.SEND, NodeType.RECV):
                    p2p.setdefault(self.p2p_key(op), len(p2p))
        for kind, offset in list(p2p):  # the spec a peer names us by must exist to find its op
            p2p.setdefault((kind, -offset % self.world.group_size(kind)), len(p2p))
        self.coll_specs = tuple(coll)
        self.p2p_specs = tuple(p2p)
        self._coll, self._p2p = coll, p2p
        for name, ops in zip(role_names, self.role_ops, strict=True):
            _check_p2p_seqs(
                name,
                [(self.p2p_key(op), op) for _, _, op in ops if op.type in (NodeType.SEND, NodeType.RECV)],
            )

    def p2p_key(self, op: Op) -> tuple[str, int]:
        """(kind, offset) with the offset reduced modulo the group size: pp+1 and pp-1 meet when PP=2."""
        return op.group, op.offset % self.world.group_size(op.group)

    def spec(self, op: Op) -> int:
        if op.type == NodeType.COLLECTIVE:
            return self._coll[op.group]
        if op.type in (NodeType.SEND, NodeType.RECV):
            return self._p2p[self.p2p_key(op)]
        return -1

    def arrays(self) -> dict[str, np.ndarray]:
        ops = [op for role_ops in self.role_ops for _, _, op in role_ops]
        begin = [0]
        for role in self.roles:
            streams = list(role.streams.values())
            for s in range(self.num_streams):
                begin.append(begin[-1] + (len(streams[s]) if s < len(streams) else 0))
        deps = []
        dep_begin = [0]
        for role, role_ops in zip(self.roles, self.role_ops, strict=True):
            index_of = {name: i for i, name in enumerate(role.streams)}
            for _, _, op in role_ops:
                deps.extend((index_of[d.stream], d.index) for d in op.deps)
                dep_begin.append(len(deps))
        dep = np.asarray(deps, dtype=np.int32).reshape(-1, 2)
        return {
            "stream_begin": np.asarray(begin, dtype=np.int64),
            "op_type": np.asarray([int(op.type) for op in ops], dtype=np.int8),
            "op_comm": np.asarray([-1 if op.comm is None else int(op.comm) for op in ops], dtype=np.int8),
            "op_coalesced": np.asarray([op.coalesced for op in ops], dtype=np.uint8),
            "op_expert": np.asarray(
                [op.type == NodeType.COMPUTE and op.name.startswith(whatif.EXPERT_PREFIX) for op in ops],
                dtype=np.uint8,
            ),
            "op_duration_ns": np.asarray([op.duration_ns for op in ops], dtype=np.int64),
            "op_overhead_ns": np.asarray([op.overhead_ns for op in ops], dtype=np.int64),
            "op_size_bytes": np.asarray([op.size_bytes for op in ops], dtype=np.int64),
            "op_spec": np.asarray([self.spec(op) for op in ops], dtype=np.int32),
            "op_seq": np.asarray([op.seq for op in ops], dtype=np.int32),
            "op_dep_begin": np.asarray(dep_begin, dtype=np.int32),
            "dep_stream": np.ascontiguousarray(dep[:, 0]),
            "dep_index": np.ascontiguousarray(dep[:, 1]),
            "p2p_partner": np.asarray(
                [self._p2p[(kind, -offset % self.world.group_size(kind))] for kind, offset in self.p2p_specs],
                dtype=np.int32,
            ),
        }


def _check_p2p_seqs(role: str, keyed: list[tuple[tuple[str, int], Op]]) -> None:
    seqs: dict[tuple, list[int]] = {}
    for key, op in keyed:
        seqs.setdefault((op.type, *key), []).append(op.seq)
    for (kind, group, offset), numbers in seqs.items():
        if sorted(numbers) != list(range(len(numbers))):
            raise ValueError(
                f"role {role!r}: {NodeType(kind).name} ops to {group}{offset:+d} have seqs {numbers[:8]}..., "
                f"not 0..n-1 (ops to one peer are numbered together, whatever offset names it)"
            )


def _costs(flat: _Flattener, world: World, cost_fn: CostFn) -> np.ndarray:
    """Each op's communication cost, asked of `cost_fn` for the role's representative's group; a
    pipeline batch with two peers at the cost `cost_fn.batch_cost` gives it, where it gives one."""
    costs: list[int] = []
    for name, role_ops in zip(world.roles(), flat.role_ops, strict=True):
        rep = world.representative(name)
        cache: dict[tuple, int] = {}
        first = len(costs)
        for _, _, op in role_ops:
            if op.type not in (NodeType.COLLECTIVE, NodeType.SEND, NodeType.RECV):
                costs.append(0)
                continue
            key = (op.type, op.comm, op.group, op.offset, op.size_bytes)
            if key not in cache:
                cache[key] = _cost(world, cost_fn, rep, op)
            costs.append(cache[key])
        for batch in _two_peer_batches(world, rep, role_ops):
            sizes = [role_ops[i][2].size_bytes for i in batch]
            cost = batch_cost(cost_fn, len(batch), max(sizes))
            if cost is not None:
                for i in batch:
                    costs[first + i] = round(cost)
    return np.asarray(costs, dtype=np.int64)


def batch_cost(cost_fn: CostFn, num_ops: int, size_bytes: int) -> float | None:
    """The cost of each op of a batch of `num_ops` p2p ops with two peers, if `cost_fn` knows one."""
    known = getattr(cost_fn, "batch_cost", None)
    return None if known is None else known(num_ops, size_bytes)


def _two_peer_batches(world: World, rep: int, role_ops) -> list[list[int]]:
    """Role-local indices of the p2p ops of each coalesced batch whose ops go to two or more peers."""
    batches: list[list[int]] = []
    current: list[int] = []
    stream = None
    for local, (name, _, op) in enumerate(role_ops):
        if name != stream:
            current, stream = [], name
        current.append(local)
        if op.coalesced:
            continue
        p2p = [
            i
            for i in current
            if role_ops[i][2].type in (NodeType.SEND, NodeType.RECV)
            and world.group(role_ops[i][2].group, rep)
        ]
        peers = {peer_of(world, role_ops[i][2].group, rep, role_ops[i][2].offset) for i in p2p}
        if len(peers) >= 2:
            batches.append(p2p)
        current = []
    return batches


def _cost(world: World, cost_fn: CostFn, rep: int, op: Op) -> int:
    if op.type == NodeType.COLLECTIVE:
        members = world.group(op.group, rep)
        if not members:
            return 0  # the core reports the op as having no group
        return round(cost_fn(op.comm, members, op.size_bytes))
    if not world.group(op.group, rep):
        return 0  # the core reports the op as having no peer
    peer = peer_of(world, op.group, rep, op.offset)
    if op.type == NodeType.SEND:
        return round(cost_fn(OpKind.SEND, (rep, peer), op.size_bytes))
    return round(cost_fn(OpKind.RECV, (peer, rep), op.size_bytes))
