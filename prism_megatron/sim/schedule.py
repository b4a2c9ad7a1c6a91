"""From a simulated iteration to the replay schedules the engine loads, one per real rank.

For every op of a real rank that has virtual members (`replay.schedule`): the latest arrival of
those virtual members, from the iteration start, and the op's simulated cost (end - ready, so a
slow NIC what-if is in it). Collectives are keyed by the group's member list and listed in sequence
order, p2p ops by (peer, "send"|"recv") in sequence order. Ops whose members are all real are left
out: real ranks talk to each other for real. In symmetric mode a virtual member arrives when its
role's representative does.
"""

from __future__ import annotations

from collections.abc import Iterable

import numpy as np

from prism_megatron.graph.schema import NodeType
from prism_megatron.graph.world import p2p_partner
from prism_megatron.replay.schedule import OpKind, ReplaySchedule, ScheduledOp
from prism_megatron.sim.engine import SimResult


class _ArrivalIndex:
    """Where each role's collective (kind, seq) and p2p (type, kind, offset mod n, seq) ops are."""

    def __init__(self, result: SimResult) -> None:
        problem = result.problem
        self.result = result
        self.collective: dict[tuple[str, int], np.ndarray] = {}
        self.p2p: list[dict[tuple, int]] = []
        num_roles = len(problem.role_names)
        for role, ops in enumerate(problem.role_ops):
            p2p = {}
            for local, (_, _, op) in enumerate(ops):
                if op.type == NodeType.COLLECTIVE:
                    index = self.collective.setdefault(
                        (op.group, op.seq), np.full(num_roles, -1, dtype=np.int64)
                    )
                    index[role] = local
                elif op.type in (NodeType.SEND, NodeType.RECV):
                    size = problem.world.group_size(op.group)
                    p2p[(op.type, op.group, op.offset % size, op.seq)] = local
            self.p2p.append(p2p)

    def collective_arrival(self, kind: str, seq: int, nodes: np.ndarray) -> int:
        """Latest start of op (kind, seq) among `nodes`."""
        problem, result = self.result.problem, self.result
        roles = problem.arrays["node_role"][nodes]
        local = self.collective[(kind, seq)][roles]
        assert (local >= 0).all(), "a simulated run has every member's op"
        return int(result.start_ns[result.node_op_base[nodes] + local].max())

    def p2p_arrival(self, node: int, op_type: NodeType, kind: str, offset: int, seq: int) -> int:
        role = int(self.result.problem.arrays["node_role"][node])
        local = self.p2p[role][(op_type, kind, offset, seq)]
        return int(self.result.start_ns[self.result.node_op_base[node] + local])


def replay_schedules(result: SimResult, real_ranks: Iterable[int]) -> dict[int, ReplaySchedule]:
    """The replay schedule of each real rank (see the module docstring).

    Raises:
        ValueError: a real rank is outside the world.
    """
    real = sorted(set(int(r) for r in real_ranks))
    index = _ArrivalIndex(result)
    return {virtual_rank: _schedule(result, index, virtual_rank, real) for virtual_rank in real}


def _virtual_nodes(problem, members: tuple[int, ...], real: list[int]) -> np.ndarray:
    virtual = np.setdiff1d(np.asarray(members, dtype=np.int64), np.asarray(real, dtype=np.int64))
    if problem.symmetric:
        return np.unique(problem.world.role_ids()[virtual]).astype(np.int64)
    return virtual


def _schedule(result: SimResult, index: _ArrivalIndex, virtual_rank: int, real: list[int]) -> ReplaySchedule:
    problem = result.problem
    start, ready, end = result.times(virtual_rank)
    collectives: dict[tuple[int, ...], list[tuple[int, ScheduledOp]]] = {}
    p2p: dict[tuple[int, str], list[tuple[int, ScheduledOp]]] = {}
    for local, (_, _, op) in enumerate(
        problem.role_ops[int(problem.arrays["node_role"][problem.node_of(virtual_rank)])]
    ):
        cost = int(end[local] - ready[local])
        if op.type == NodeType.COLLECTIVE:
            members = problem.world.group(op.group, virtual_rank)
            nodes = _virtual_nodes(problem, members, real)
            if len(nodes):
                arrival = index.collective_arrival(op.group, op.seq, nodes)
                scheduled = ScheduledOp(op.comm, op.size_bytes, arrival, cost)
                collectives.setdefault(members, []).append(((int(start[local]), op.group, op.seq), scheduled))
        elif op.type in (NodeType.SEND, NodeType.RECV):
            peer, partner, partner_offset = p2p_partner(problem.world, op, virtual_rank)
            if peer in real:
                continue
            arrival = index.p2p_arrival(problem.node_of(peer), partner, op.group, partner_offset, op.seq)
            kind = OpKind.SEND if op.type == NodeType.SEND else OpKind.RECV
            direction = "send" if op.type == NodeType.SEND else "recv"
            scheduled = ScheduledOp(kind, op.size_bytes, arrival, cost)
            p2p.setdefault((peer, direction), []).append(((int(start[local]), op.group, op.seq), scheduled))
    return ReplaySchedule(
        virtual_rank=virtual_rank,
        collectives={k: _in_seq_order(v) for k, v in collectives.items()},
        p2p={k: _in_seq_order(v) for k, v in p2p.items()},
        iteration_time_ns=result.iteration_time_ns,
    )


def _in_seq_order(ops: list[tuple[tuple[int, str, int], ScheduledOp]]) -> tuple[ScheduledOp, ...]:
    """Sequence order; when two group kinds share the member list (dp and dp_cp with CP=1, which
    Megatron makes two process groups), their ops interleave in simulated issue order."""
    if len({group for (_, group, _), _ in ops}) == 1:
        return tuple(op for _, op in sorted(ops, key=lambda pair: pair[0][2]))
    return tuple(op for _, op in sorted(ops, key=lambda pair: pair[0]))
