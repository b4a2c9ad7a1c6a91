"""From what the slice's real ranks recorded in instant mode to the execution graph of the job.

The emulation orchestrator's own capture (`prism_megatron.graph.capture`) was being written while
this suite was; until the suite can call it, this module builds the graph the way the graph schema
documents, from the same inputs: the replay engine's op log of each slice rank, its iteration
starts and ends, and the windows of the pipeline exchanges (one `_communicate` call each).

Per recorded iteration, in issue order on the compute stream:

* the time from the end of the previous step (op or exchange) to the next issue is a COMPUTE span;
* a pipeline exchange is a batch of SEND/RECV ops posted together (coalesced) and waited together,
  as megatron-core's batched p2p does (`batch_isend_irecv`, then wait on every request);
* a synchronous collective sits on the compute stream;
* an asynchronous collective (DDP's overlapped bucket reductions) goes on an "async" stream after
  the compute that issued it, and the compute stream WAITs for it before its next synchronous op
  (or at the end of the iteration): where the program calls `wait()` is not in the op log, and
  megatron-core waits in `finish_grad_sync`, just before the optimizer's first reduction.

Compute spans are the median over the recorded iterations, whose op sequences must agree.
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Sequence

from prism_megatron.graph import Dep, ExecutionGraph, GraphMetadata, NodeType, Op, RoleGraph, World
from prism_megatron.graph.world import group_kind_of, peer_spec
from prism_megatron.replay import OpEvent, OpKind

ASYNC_STREAM = "async"
GROUP_KINDS = ("tp", "pp", "dp", "dp_cp", "cp", "mp", "tp_dp", "tp_cp", "tp_dp_cp", "embd", "pos_embd")
"""Group kinds tried in this order to name a collective's members (pp before mp: with TP = 1 they
have the same members, and the first match names the group)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Capture:
    """What one slice rank recorded."""

    virtual_rank: int
    events: tuple[OpEvent, ...]
    iterations_ns: tuple[tuple[int, int], ...]
    """(start, end) of each recorded iteration."""
    exchanges_ns: tuple[tuple[int, int], ...]
    """(enter, exit) of each pipeline exchange call."""


@dataclasses.dataclass(frozen=True)
class _Step:
    """One thing the compute stream does after a compute span: an exchange or a collective."""

    events: tuple[OpEvent, ...]
    issue_ns: int
    done_ns: int
    is_async: bool

    def signature(self) -> tuple:
        return tuple((e.kind, e.group, e.peer, e.size_bytes, e.async_op) for e in self.events)


def _steps(capture: Capture, start_ns: int, end_ns: int) -> list[_Step]:
    events = sorted((e for e in capture.events if start_ns <= e.issue_ns < end_ns), key=lambda e: e.issue_ns)
    steps: list[_Step] = []
    exchanges = [w for w in capture.exchanges_ns if start_ns <= w[0] < end_ns]
    batched: dict[int, list[OpEvent]] = {}
    for event in events:
        if event.kind in (OpKind.SEND, OpKind.RECV):
            window = next((i for i, (a, b) in enumerate(exchanges) if a <= event.issue_ns <= b), None)
            if window is None:
                raise ValueError(
                    f"virtual rank {capture.virtual_rank}: a p2p op outside any exchange: {event}"
                )
            batched.setdefault(window, []).append(event)
        else:
            done = event.complete_ns if event.complete_ns >= 0 else event.issue_ns
            steps.append(_Step((event,), event.issue_ns, done, event.async_op))
    for window, members in batched.items():
        steps.append(_Step(tuple(members), members[0].issue_ns, exchanges[window][1], False))
    return sorted(steps, key=lambda s: s.issue_ns)


def _spans(steps: list[_Step], start_ns: int, end_ns: int) -> list[int]:
    """Compute before each step and after the last one."""
    spans, cursor = [], start_ns
    for step in steps:
        spans.append(max(step.issue_ns - cursor, 0))
        cursor = max(cursor, step.done_ns) if not step.is_async else max(cursor, step.issue_ns)
    spans.append(max(end_ns - cursor, 0))
    return spans


class _RoleBuilder:
    """Lays out one role's streams and numbers its ops."""

    def __init__(self, world: World, virtual_rank: int) -> None:
        self.world, self.virtual_rank = world, virtual_rank
        self.compute: list[Op] = []
        self.side: list[Op] = []
        self.seq: dict[tuple, int] = {}
        self.pending_async = False

    def _next(self, *key) -> int:
        number = self.seq.get(key, 0)
        self.seq[key] = number + 1
        return number

    def op(self, event: OpEvent, **extra) -> Op:
        if event.kind in (OpKind.SEND, OpKind.RECV):
            group, offset = peer_spec(self.world, self.virtual_rank, event.peer)
            node = NodeType.SEND if event.kind == OpKind.SEND else NodeType.RECV
            return Op(
                type=node, group=group, offset=offset, seq=self._next(node, event.peer),
                size_bytes=event.size_bytes, dtype=event.dtype, **extra,
            )  # fmt: skip
        group = group_kind_of(self.world, self.virtual_rank, event.group, GROUP_KINDS)
        return Op(
            type=NodeType.COLLECTIVE, comm=event.kind, group=group, seq=self._next("coll", group),
            size_bytes=event.size_bytes, dtype=event.dtype, **extra,
        )  # fmt: skip

    def wait_for_async(self) -> None:
        if self.pending_async:
            self.compute.append(Op(type=NodeType.WAIT, deps=(Dep(ASYNC_STREAM, len(self.side) - 1),)))
            self.pending_async = False

    def add(self, step: _Step, compute_ns: int) -> None:
        self.compute.append(Op(type=NodeType.COMPUTE, name="compute", duration_ns=compute_ns))
        if step.is_async:
            self.side.append(self.op(step.events[0], deps=(Dep("compute", len(self.compute) - 1),)))
            self.pending_async = True
            return
        self.wait_for_async()
        for index, event in enumerate(step.events):
            self.compute.append(self.op(event, coalesced=index < len(step.events) - 1))

    def finish(self, compute_ns: int) -> dict[str, tuple[Op, ...]]:
        self.compute.append(Op(type=NodeType.COMPUTE, name="compute", duration_ns=compute_ns))
        self.wait_for_async()
        streams = {"compute": tuple(self.compute)}
        if self.side:
            streams[ASYNC_STREAM] = tuple(self.side)
        return streams


def role_graph(capture: Capture, world: World, role: str) -> RoleGraph:
    """The role's iteration: the median compute spans of the recorded iterations.

    Raises:
        ValueError: no iteration was recorded, or the recorded iterations issued different ops.
    """
    if not capture.iterations_ns:
        raise ValueError(f"virtual rank {capture.virtual_rank}: no recorded iteration")
    per_iteration = [_steps(capture, a, b) for a, b in capture.iterations_ns]
    signatures = {tuple(s.signature() for s in steps) for steps in per_iteration}
    if len(signatures) != 1:
        raise ValueError(f"virtual rank {capture.virtual_rank}: recorded iterations issued different ops")
    spans = [_spans(steps, a, b) for steps, (a, b) in zip(per_iteration, capture.iterations_ns, strict=True)]
    medians = [round(statistics.median(values)) for values in zip(*spans, strict=True)]
    builder = _RoleBuilder(world, capture.virtual_rank)
    for step, compute_ns in zip(per_iteration[0], medians, strict=False):
        builder.add(step, compute_ns)
    return RoleGraph(role, builder.finish(medians[-1]))


def build_graph(captures: Sequence[Capture], world: World, layout: dict, source: str) -> ExecutionGraph:
    """One role graph per role of `world`, from the capture of its representative."""
    by_rank = {c.virtual_rank: c for c in captures}
    roles = {}
    for name in world.roles():
        representative = world.representative(name)
        if representative not in by_rank:
            raise ValueError(f"role {name!r}: its representative {representative} was not captured")
        roles[name] = role_graph(by_rank[representative], world, name)
    return ExecutionGraph(GraphMetadata(layout=layout, source=source), roles)
