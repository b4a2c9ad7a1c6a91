"""Faults a simulation can find, told in the graph's words: ranks, streams, ops in printable form.

A deadlock (ops whose peers never come) and a mismatch (matched ops that disagree on kind or size)
mean the graph cannot be one iteration of a real job: a capture lost an op, or two roles were
recorded from different programs. The messages name the group, the op, its sequence number and
the ranks involved, so the cause can be found without a debugger.
"""

from __future__ import annotations

from prism_megatron.graph.printable import format_op
from prism_megatron.graph.schema import NodeType, Op
from prism_megatron.graph.world import peer_of

MAX_LISTED = 8


class SimulationFault(RuntimeError):
    """The graph cannot run: ops mismatch, or a node has no group or peer an op needs."""


class DeadlockError(SimulationFault):
    """Ops wait for peers that never come. `stuck` lists (virtual rank, stream, op index, op)."""

    def __init__(self, message: str, stuck: list[tuple[int, str, int, Op]]) -> None:
        super().__init__(message)
        self.stuck = stuck


def describe(problem, node: int, local_op: int) -> str:
    """'virtual rank 5 (role pp1) compute[12] "AR tp#3 4MiB"'."""
    stream, index, op = _op(problem, node, local_op)
    rank = int(problem.node_rank[node])
    who = (
        f"role {_role(problem, node)!r}, representative rank {rank}"
        if problem.symmetric
        else f"virtual rank {rank}"
    )
    return f"{who} {stream}[{index}] {format_op(op)!r}"


def fault_error(problem, fault: tuple) -> SimulationFault:
    kind, node_a, op_a, node_b, op_b = fault
    if kind == "mismatch":
        return SimulationFault(
            f"mismatched ops matched with each other: {describe(problem, node_a, op_a)} and "
            f"{describe(problem, node_b, op_b)} (same group and sequence number, different kind or size)"
        )
    what = "group of that kind" if kind == "no_group" else "peer of that group and offset"
    return SimulationFault(f"{describe(problem, node_a, op_a)}: its rank has no {what}")


def deadlock_error(problem, start_ns, node_op_base, stuck: list[tuple]) -> DeadlockError:
    """Explain the stuck streams: what each waits for and which ranks never arrived."""
    lines = []
    records = []
    for node, _stream_index, local_op, why in stuck:
        stream, index, op = _op(problem, node, local_op)
        records.append((int(problem.node_rank[node]), stream, index, op))
        if len(lines) >= MAX_LISTED:
            continue
        line = describe(problem, node, local_op)
        if why == "collective":
            line += _missing_members(problem, start_ns, node_op_base, node, op)
        elif why == "p2p":
            line += _missing_peer(problem, node, op)
        else:
            line += " waits for " + ", ".join(f"{d.stream}[{d.index}]" for d in op.deps)
        lines.append(line)
    more = f"\n  ... and {len(stuck) - MAX_LISTED} more" if len(stuck) > MAX_LISTED else ""
    return DeadlockError(
        f"deadlock: {len(stuck)} streams cannot finish the iteration:\n  " + "\n  ".join(lines) + more,
        records,
    )


def _op(problem, node: int, local_op: int) -> tuple[str, int, Op]:
    return problem.role_ops[int(problem.arrays["node_role"][node])][local_op]


def _role(problem, node: int) -> str:
    return problem.role_names[int(problem.arrays["node_role"][node])]


def _missing_members(problem, start_ns, node_op_base, node: int, op: Op) -> str:
    rank = int(problem.node_rank[node])
    members = problem.world.group(op.group, rank)
    missing = []
    for member in members:
        other = problem.node_of(member)
        role_ops = problem.role_ops[int(problem.arrays["node_role"][other])]
        match = [
            i
            for i, (_, _, o) in enumerate(role_ops)
            if o.type == NodeType.COLLECTIVE and o.group == op.group and o.seq == op.seq
        ]
        if not match or start_ns[node_op_base[other] + match[0]] < 0:
            missing.append(member)
    listed = ", ".join(str(m) for m in missing[:MAX_LISTED]) + (" ..." if len(missing) > MAX_LISTED else "")
    return (
        f" waits on its {op.group} group of {len(members)} ranks at seq {op.seq}: "
        f"{len(missing)} never arrived (virtual ranks {listed})"
    )


def _missing_peer(problem, node: int, op: Op) -> str:
    rank = int(problem.node_rank[node])
    peer = peer_of(problem.world, op.group, rank, op.offset)
    wanted = NodeType.RECV if op.type == NodeType.SEND else NodeType.SEND
    peer_ops = problem.role_ops[int(problem.arrays["node_role"][problem.node_of(peer)])]
    has = any(
        o.type == wanted and o.seq == op.seq and peer_of(problem.world, o.group, peer, o.offset) == rank
        for _, _, o in peer_ops
        if o.type == wanted and o.seq == op.seq
    )
    verb = "never reaches the" if has else "has no"
    return f" waits for virtual rank {peer}, which {verb} matching {wanted.name} #{op.seq}"
