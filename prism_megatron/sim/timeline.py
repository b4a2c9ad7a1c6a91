"""Simulated timelines as spans, for trace writers (`prism_megatron.report.trace`) and reports.

One span per op of each chosen rank: compute spans from start to end, communication spans from
post to completion with the arrival of the last participant in `args["ready_ns"]`.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Iterator

from prism_megatron.graph.printable import format_op
from prism_megatron.graph.schema import NodeType, Op
from prism_megatron.sim.engine import SimResult

_CATEGORY = {
    NodeType.COMPUTE: "compute",
    NodeType.COLLECTIVE: "collective",
    NodeType.SEND: "p2p",
    NodeType.RECV: "p2p",
    NodeType.WAIT: "wait",
}


@dataclasses.dataclass(frozen=True, slots=True)
class Span:
    process: int
    """The virtual rank."""
    thread: str
    """The stream."""
    name: str
    category: str
    start_ns: int
    end_ns: int
    args: dict


def default_ranks(result: SimResult, extra: Iterable[int] = ()) -> list[int]:
    """Every role's representative, plus `extra` (stragglers, real ranks), sorted."""
    problem = result.problem
    return sorted({problem.world.representative(name) for name in problem.role_names} | set(extra))


def spans(result: SimResult, virtual_ranks: Iterable[int]) -> Iterator[Span]:
    """The spans of each rank's ops, rank by rank."""
    described: dict[int, tuple[str, str, str]] = {}
    """id(op) -> name, category, formatted op: the ranks of one role share their op objects."""
    for rank in virtual_ranks:
        for timing in result.timeline(rank):
            op = timing.op
            description = described.get(id(op))
            if description is None:
                description = described[id(op)] = (_name(op), _CATEGORY[op.type], format_op(op))
            name, category, formatted = description
            args = {"op": formatted, "ready_ns": timing.ready_ns}
            yield Span(rank, timing.stream, name, category, timing.start_ns, timing.end_ns, args)


def _name(op: Op) -> str:
    name = op.name or (op.comm.name if op.comm is not None else op.type.name)
    if op.type != NodeType.COMPUTE and op.name:
        name = f"{op.comm.name if op.comm is not None else op.type.name}:{op.name}"
    return name


def process_names(result: SimResult, virtual_ranks: Iterable[int]) -> dict[int, str]:
    problem = result.problem
    names = {}
    for rank in virtual_ranks:
        role = problem.role_names[int(problem.arrays["node_role"][problem.node_of(rank)])]
        names[rank] = f"rank {rank} ({role})"
    return names
