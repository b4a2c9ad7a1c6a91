"""Where each role's iteration goes: compute, exposed communication, pipeline bubble.

Measured on the compute stream of the role's representative (the rank the slice runs), over the
whole iteration [0, iteration time], so the three parts add up to the iteration time exactly:

* compute: time in COMPUTE ops on the compute stream.
* bubble: time the compute stream waits for other ranks to arrive: in every communication op on
  it, the part before the last participant was there (ready - start); plus time with no op at all
  on it (before its first op, between ops while a dependency holds it, after its last op until the
  slowest rank finishes). Pipeline fill and drain, skew between stages at the final collectives
  and waiting for a straggler all land here.
* exposed communication: the rest: the transfer part (end - ready) of communication ops on the
  compute stream, and waits for other streams (overlapped communication that was not hidden). A
  wait for a pipeline transfer on a side stream (megatron-core's overlapped p2p) counts as the
  blocking transfer it stands for: its part before the peer was there is bubble.

Communication on other streams that ends before the compute stream needs it is hidden and counts
nowhere.
"""

from __future__ import annotations

import dataclasses

import numpy as np

from prism_megatron.graph.schema import COMPUTE_STREAM, NodeType
from prism_megatron.sim.engine import SimResult


@dataclasses.dataclass(frozen=True)
class RoleBreakdown:
    role: str
    virtual_rank: int
    """The representative whose compute stream was measured."""
    num_ranks: int
    compute_ns: int
    exposed_comm_ns: int
    bubble_ns: int
    finish_ns: int
    """When the representative's last op completed."""


def breakdown(result: SimResult) -> list[RoleBreakdown]:
    """One row per role of the job, in the world's role order."""
    problem = result.problem
    counts = np.bincount(problem.world.role_ids(), minlength=len(problem.role_names))
    return [
        rank_breakdown(result, problem.world.representative(name), num_ranks=int(counts[role]))
        for role, name in enumerate(problem.role_names)
    ]


def rank_breakdown(result: SimResult, virtual_rank: int, num_ranks: int = 1) -> RoleBreakdown:
    """The breakdown of one rank (a straggler, a real rank), labelled with its role."""
    problem = result.problem
    rank = virtual_rank
    role = int(problem.arrays["node_role"][problem.node_of(rank)])
    name = problem.role_names[role]
    start, ready, end = result.times(rank)
    ops = problem.role_ops[role]
    local_of = {(stream, index): local for local, (stream, index, _) in enumerate(ops)}
    compute = bubble = busy = 0
    for local, (stream, _, op) in enumerate(ops):
        if stream != COMPUTE_STREAM:
            continue
        span = int(end[local] - start[local])
        busy += span
        if op.type == NodeType.COMPUTE:
            compute += span
        elif op.type in (NodeType.COLLECTIVE, NodeType.SEND, NodeType.RECV):
            bubble += int(ready[local] - start[local])
        elif op.type == NodeType.WAIT:
            transfers = [local_of[(d.stream, d.index)] for d in op.deps]
            transfers = [t for t in transfers if ops[t][2].type in (NodeType.SEND, NodeType.RECV)]
            if transfers:  # until the last waited transfer's peer was there
                peer_there = min(max(int(ready[t]) for t in transfers), int(end[local]))
                bubble += max(0, peer_there - int(start[local]))
    idle = result.iteration_time_ns - busy
    bubble += idle
    return RoleBreakdown(
        role=name,
        virtual_rank=rank,
        num_ranks=num_ranks,
        compute_ns=compute,
        exposed_comm_ns=result.iteration_time_ns - compute - bubble,
        bubble_ns=bubble,
        finish_ns=int(end.max(initial=0)),
    )


def format_table(rows: list[RoleBreakdown], iteration_time_ns: int) -> str:
    """A plain-text table for the terminal, times in ms."""
    lines = [
        f"predicted iteration time: {iteration_time_ns / 1e6:.3f} ms",
        f"{'role':<16} {'ranks':>7} {'compute ms':>11} {'exposed comm ms':>16} {'bubble ms':>10}",
    ]
    for row in rows:
        lines.append(
            f"{row.role:<16} {row.num_ranks:>7} {row.compute_ns / 1e6:>11.3f} "
            f"{row.exposed_comm_ns / 1e6:>16.3f} {row.bubble_ns / 1e6:>10.3f}"
        )
    return "\n".join(lines)
