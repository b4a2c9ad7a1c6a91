"""Capture: from what the slice's real ranks recorded to the execution graph of every role.

The capture pass runs each slice rank for a few iterations inside the virtual world, its virtual
peers answering at once (the replay engine's instant mode). Per iteration a rank keeps
(`CapturedIteration`): every communication op it issued (`OpEvent`s from the op log: the backend
logs an op when it is issued and completes it when the program waits; the pipeline interceptor logs
its p2p ops when they are waited), when the iteration started and ended, and the span of each call
of the pipeline communicator (the p2p ops posted in one call form one batch).

One iteration becomes a role's streams (`iteration_streams`) by walking its ops in time order on
the compute stream (CPU clock on CPU; CUDA events would feed the same walk on GPU):

* a blocking collective is a COLLECTIVE op; a pipeline-communicator call is its p2p ops posted
  together (`coalesced`), the stream moving on when the call returned, except the transfers the
  program waited on only after the call returned (megatron-core's interleaved schedule with
  `overlap_p2p_comm`, the default there, waits a send one step later and a receive just before its
  forward or backward in its steady phase; its warm-up and cool-down wait in the call unless
  `overlap_p2p_comm_warmup_flush`): on a GPU and a modelled GPU those are async ops as below, so
  the transfer overlaps the compute between the call and the wait, as it does on NCCL (on the CPU
  device, where a transfer is gloo's work on the compute's cores, the interceptor records no wait
  and they stay in their call: `patches/pipeline_ops.py`);
* an async op (`async_op=True`) goes on a side stream per group kind (`async-tp`, ...), an async p2p
  op on one per direction (`async-p2p-send`, `async-p2p-recv`: a send and a receive posted together,
  as context parallelism's ring posts them, progress together; on one stream each rank's send would
  wait for its peer's receive queued behind the peer's own send), a pipeline transfer on one per
  direction and neighbour (`async-p2p-send-pp+1`, ...: PyTorch's NCCL runs each peer pair's p2p on
  its own stream, and the two directions apart keep the interceptor's posting order, receives
  first, from waiting on each other), after the compute that preceded its issue, and a WAIT on the
  compute stream where the program began to wait on it (`OpEvent.wait_ns`, recorded by the
  backend's `Work.wait` and by the pipeline interceptor), the compute resuming when it completed.
  Where no wait was recorded (the program asked through a future), the WAIT is where it completed:
  on CPU, the prism backend completes an op with instant peers when the program waits on it. A
  WAIT that falls after the iteration's end is put at the end;
* the gaps between them on the compute stream are COMPUTE spans, one before every op (possibly of
  0 ns) and one closing the iteration, so every iteration has the same structure and durations can
  be compared position by position.

Collectives are named by group kind (`group_kind_of`), p2p peers by (group kind, offset)
(`peer_spec`), and numbered within the iteration as the schema says. `role_graph` drops the
warm-up iterations, checks the others agree op for op, and takes the median of each compute span.
Limits: an async op waited in a later iteration (a parameter all-gather overlapped with the next
forward) is waited at the end of its own; a pipeline transfer the program never waits on counts
as waited when its call returned on a device (on the host it is settled, and so waited, where the
step ends: `pipeline_ops.settle_unwaited`); where the program's wait on an async op was not
recorded and its real peers (other ranks of the same capture pass) arrived after the program began
to wait, the span before its wait includes that wait (the median over iterations bounds one such
outlier; ranks of one pass are alike, so they arrive close together).
"""

from __future__ import annotations

import bisect
import collections
import dataclasses
import statistics
from collections.abc import Mapping, Sequence

from prism_megatron import files
from prism_megatron.graph.schema import (
    COMPUTE_STREAM,
    Dep,
    ExecutionGraph,
    GraphMetadata,
    NodeType,
    Op,
    RoleGraph,
    derived,
)
from prism_megatron.graph.world import World, group_kind_of, peer_spec
from prism_megatron.replay.events import OpEvent
from prism_megatron.replay.schedule import OpKind
from prism_megatron.topology import GROUP_KINDS
from prism_megatron.topology.equivalence import RoleClass

CAPTURE_SCHEMA_VERSION = 1
COMPUTE_NAME = "compute"
ASYNC_STREAM_PREFIX = "async-"
PIPELINE_GROUP = "pp"
"""The pipeline's group kind: its async transfers go on one side stream per direction and neighbour."""


@dataclasses.dataclass(frozen=True)
class CapturedIteration:
    """One training iteration of one real rank, as recorded."""

    start_ns: int
    end_ns: int
    events: tuple[OpEvent, ...]
    p2p_calls: tuple[tuple[int, int], ...] = ()
    """(enter_ns, exit_ns) of each pipeline-communicator call, in call order."""
    work: tuple[tuple[int, int], ...] | None = None
    """(begin_ns, end_ns) of the device work the program ran (`replay.timeline.compute`), in time
    order; None when it was not recorded (then every compute span counts as work)."""


@dataclasses.dataclass(frozen=True)
class RankCapture:
    """What one real rank recorded in the capture pass."""

    virtual_rank: int
    role: str
    iterations: tuple[CapturedIteration, ...]
    num_warmup: int = 1
    """Leading iterations left out of the graph (allocation, first-touch and warm-up effects)."""

    def recorded(self) -> tuple[CapturedIteration, ...]:
        """The iterations the graph uses: after warm-up, or the last one when all were warm-up."""
        if not self.iterations:
            raise ValueError(f"virtual rank {self.virtual_rank} recorded no iteration")
        return self.iterations[self.num_warmup :] or self.iterations[-1:]

    def to_json(self) -> dict:
        return {
            "schema_version": CAPTURE_SCHEMA_VERSION,
            "virtual_rank": self.virtual_rank,
            "role": self.role,
            "num_warmup": self.num_warmup,
            "iterations": [
                {
                    "start_ns": it.start_ns,
                    "end_ns": it.end_ns,
                    "p2p_calls": [list(call) for call in it.p2p_calls],
                    **({} if it.work is None else {"work": [list(span) for span in it.work]}),
                    "events": [_event_row(e) for e in it.events],
                }
                for it in self.iterations
            ],
        }

    @classmethod
    def from_json(cls, data: dict, *, source: str = "capture") -> RankCapture:
        if not isinstance(data, dict) or data.get("schema_version") != CAPTURE_SCHEMA_VERSION:
            raise ValueError(f"{source}: not a capture file of schema version {CAPTURE_SCHEMA_VERSION}")
        try:
            iterations = tuple(
                CapturedIteration(
                    start_ns=int(it["start_ns"]),
                    end_ns=int(it["end_ns"]),
                    p2p_calls=tuple((int(a), int(b)) for a, b in it["p2p_calls"]),
                    work=None if "work" not in it else tuple((int(a), int(b)) for a, b in it["work"]),
                    events=tuple(_event_from_row(row) for row in it["events"]),
                )
                for it in data["iterations"]
            )
            return cls(
                virtual_rank=int(data["virtual_rank"]),
                role=str(data["role"]),
                iterations=iterations,
                num_warmup=int(data["num_warmup"]),
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{source}: damaged capture file ({exc})") from exc

    def save(self, path: str) -> str:
        return files.write_json(self.to_json(), path)

    @classmethod
    def load(cls, path: str) -> RankCapture:
        return cls.from_json(files.read_json(path, "capture file"), source=path)


def _event_row(e: OpEvent) -> list:
    return [int(e.kind), list(e.group), e.peer, e.seq, e.size_bytes, e.dtype, e.issue_ns, e.start_ns,
            e.complete_ns, e.async_op, e.has_virtual, e.real_done_ns, e.engine_done_ns, e.wait_ns]  # fmt: skip


def _event_from_row(row: list) -> OpEvent:
    return OpEvent.from_native((row[0], tuple(row[1]), *row[2:]))


@dataclasses.dataclass(frozen=True)
class _Point:
    """Something the compute stream meets: a blocking op or batch, an async post, or a wait."""

    time_ns: int
    order: int
    end_ns: int
    kind: str  # "blocking", "post" or "wait"
    events: tuple[OpEvent, ...]


def _points(iteration: CapturedIteration) -> list[_Point]:
    events = sorted(iteration.events, key=lambda e: e.issue_ns)
    calls = sorted(iteration.p2p_calls)
    enters = [enter for enter, _ in calls]
    batches: dict[int, list[OpEvent]] = {}
    points: list[_Point] = []
    for order, event in enumerate(events):
        call = bisect.bisect_right(enters, event.issue_ns) - 1
        in_call = event.peer >= 0 and call >= 0 and event.issue_ns <= calls[call][1]
        if in_call and not (event.async_op and event.wait_ns >= 0):  # waited in its call: no wait kept
            batches.setdefault(call, []).append(event)
        elif event.async_op:
            done_ns = event.complete_ns if 0 <= event.complete_ns <= iteration.end_ns else iteration.end_ns
            done_ns = max(done_ns, event.issue_ns)
            reached_ns, resume_ns = done_ns, done_ns
            if event.wait_ns >= 0:  # the program's wait, recorded: the compute stopped there
                reached_ns = min(max(event.wait_ns, event.issue_ns), iteration.end_ns)
                resume_ns = max(reached_ns, min(done_ns, _blocking_end_ns(event)))
            points.append(_Point(event.issue_ns, order, event.issue_ns, "post", (event,)))
            points.append(_Point(reached_ns, order, resume_ns, "wait", (event,)))
        else:
            points.append(_Point(event.issue_ns, order, _blocking_end_ns(event), "blocking", (event,)))
    for call, members in batches.items():
        end_ns = max(calls[call][1], *(e.complete_ns for e in members))
        points.append(_Point(members[0].issue_ns, len(events) + call, end_ns, "blocking", tuple(members)))
    points.sort(key=lambda p: (p.time_ns, p.kind != "post", p.order))
    return points


def _blocking_end_ns(event: OpEvent) -> int:
    """Where the compute after a blocking op begins: when the op completed, or, for an op the replay
    engine completed (`OpEvent.engine_done_ns`), when the engine and the op's real part were done.

    The program sees the op complete only when it asks (torch's Python between the issue and the
    wait, the op's local part): host work of its own, which on the CPU device takes longer than many
    an op's cost (100-250 us against a modelled TP all-reduce's 15 us). Counted from the op's
    completion, no span would hold it and the simulation would run ahead of the program by that much
    at every op; from the engine's time it is in the compute that follows, where the program spends
    it. Only the emulate pass has engine times (its ops are scheduled): the capture pass's ops cost
    nothing there, and a cost measured on this host (`network.measured`) already holds this work.
    """
    end_ns = max(event.complete_ns, event.issue_ns)
    if event.engine_done_ns >= 0:
        done_ns = max(event.engine_done_ns, event.real_done_ns, event.issue_ns)
        end_ns = min(end_ns, done_ns)
    return end_ns


class GroupNames:
    """How one rank's ops name their groups and peers, cached (the same groups every iteration)."""

    def __init__(self, world: World, virtual_rank: int, kinds: Sequence[str] = GROUP_KINDS) -> None:
        self.world, self.virtual_rank, self.kinds = world, virtual_rank, kinds
        self._kinds: dict[tuple[int, ...], str] = {}
        self._peers: dict[int, tuple[str, int]] = {}

    def collective(self, members: tuple[int, ...]) -> str:
        if members not in self._kinds:
            self._kinds[members] = group_kind_of(self.world, self.virtual_rank, members, self.kinds)
        return self._kinds[members]

    def peer(self, peer: int) -> tuple[str, int]:
        if peer not in self._peers:
            self._peers[peer] = peer_spec(self.world, self.virtual_rank, peer)
        return self._peers[peer]


class _StreamBuilder:
    """Appends ops to a role's streams, numbering collectives per group kind and p2p per peer."""

    def __init__(self, names: GroupNames) -> None:
        self.names = names
        self.streams: dict[str, list[Op]] = {COMPUTE_STREAM: []}
        self.collective_seq: collections.Counter[str] = collections.Counter()
        self.p2p_seq: collections.Counter[tuple[OpKind, int]] = collections.Counter()
        self.posted: dict[OpEvent, Dep] = {}

    def compute(self, duration_ns: int, overhead_ns: int = 0) -> None:
        self.streams[COMPUTE_STREAM].append(
            Op(type=NodeType.COMPUTE, name=COMPUTE_NAME, duration_ns=duration_ns, overhead_ns=overhead_ns)
        )

    def comm(self, event: OpEvent, *, coalesced: bool = False, deps: tuple[Dep, ...] = ()) -> Op:
        common = dict(size_bytes=event.size_bytes, dtype=event.dtype, coalesced=coalesced, deps=deps)
        if event.kind in (OpKind.SEND, OpKind.RECV):
            kind, offset = self.names.peer(event.peer)
            seq = self.p2p_seq[(event.kind, event.peer)]
            self.p2p_seq[(event.kind, event.peer)] += 1
            node = NodeType.SEND if event.kind == OpKind.SEND else NodeType.RECV
            return Op(type=node, group=kind, offset=offset, seq=seq, **common)
        kind = self.names.collective(event.group)
        seq = self.collective_seq[kind]
        self.collective_seq[kind] += 1
        return Op(type=NodeType.COLLECTIVE, comm=event.kind, group=kind, seq=seq, **common)

    def blocking(self, events: Sequence[OpEvent]) -> None:
        for i, event in enumerate(events):
            self.streams[COMPUTE_STREAM].append(self.comm(event, coalesced=i < len(events) - 1))

    def post(self, event: OpEvent) -> None:
        after = Dep(COMPUTE_STREAM, len(self.streams[COMPUTE_STREAM]) - 1)
        op = self.comm(event, deps=(after,))
        if op.type == NodeType.COLLECTIVE:
            stream = ASYNC_STREAM_PREFIX + op.group
        else:
            stream = ASYNC_STREAM_PREFIX + ("p2p-send" if op.type == NodeType.SEND else "p2p-recv")
            if op.group == PIPELINE_GROUP:
                stream += f"-{op.group}{op.offset:+d}"
        ops = self.streams.setdefault(stream, [])
        self.posted[event] = Dep(stream, len(ops))
        ops.append(op)

    def wait(self, event: OpEvent) -> None:
        self.streams[COMPUTE_STREAM].append(Op(type=NodeType.WAIT, deps=(self.posted[event],)))


def iteration_streams(
    iteration: CapturedIteration, names: GroupNames, *, posted: dict[OpEvent, Dep] | None = None
) -> dict[str, tuple[Op, ...]]:
    """One recorded iteration as streams of ops (see the module docstring); compute stream first.

    Args:
        posted: filled with each async op's event and where its op went (side stream, index).

    Raises:
        ValueError: an op's group is none of the rank's group kinds.
    """
    builder = _StreamBuilder(names)
    overhead = _Overhead(iteration.work)
    cursor_ns = iteration.start_ns
    for point in _points(iteration):
        at_ns = max(point.time_ns, cursor_ns)
        builder.compute(at_ns - cursor_ns, overhead(cursor_ns, at_ns))
        if point.kind == "post":
            builder.post(point.events[0])
        elif point.kind == "wait":
            builder.wait(point.events[0])
        else:
            builder.blocking(point.events)
        cursor_ns = max(at_ns, point.end_ns)
    end_ns = max(iteration.end_ns, cursor_ns)
    builder.compute(end_ns - cursor_ns, overhead(cursor_ns, end_ns))
    if posted is not None:
        posted.update(builder.posted)
    return {name: tuple(ops) for name, ops in builder.streams.items()}


class _Overhead:
    """A span's host overhead: its time outside the recorded device work (0 when none was recorded)."""

    def __init__(self, work: Sequence[tuple[int, int]] | None) -> None:
        self.work = sorted(work) if work is not None else None
        self.begins = [begin for begin, _ in self.work or ()]

    def __call__(self, begin_ns: int, end_ns: int) -> int:
        if self.work is None or end_ns <= begin_ns:
            return 0
        covered, last_ns = 0, begin_ns
        # Work spans are disjoint on one stream; start from the last one beginning before the span.
        for work_begin, work_end in self.work[max(bisect.bisect_right(self.begins, begin_ns) - 1, 0) :]:
            if work_begin >= end_ns:
                break
            lo, hi = max(work_begin, last_ns), min(work_end, end_ns)
            if hi > lo:
                covered += hi - lo
                last_ns = hi
        return end_ns - begin_ns - covered


def compute_intervals(iteration: CapturedIteration, *, keep_empty: bool = False) -> list[tuple[int, int]]:
    """The iteration's compute spans as (start_ns, end_ns), the empty ones left out (for timelines).

    With keep_empty, every span, in the order of the COMPUTE ops `iteration_streams` makes.
    """
    intervals = []
    cursor_ns = iteration.start_ns
    for point in _points(iteration):
        at_ns = max(point.time_ns, cursor_ns)
        if at_ns > cursor_ns or keep_empty:
            intervals.append((cursor_ns, at_ns))
        cursor_ns = max(at_ns, point.end_ns)
    if iteration.end_ns > cursor_ns or keep_empty:
        intervals.append((cursor_ns, max(iteration.end_ns, cursor_ns)))
    return intervals


def structure(streams: Mapping[str, Sequence[Op]]) -> dict[str, tuple[Op, ...]]:
    """The streams with every duration zeroed: what must agree between iterations."""
    return {
        name: tuple(derived(op, duration_ns=0, overhead_ns=0) for op in ops) for name, ops in streams.items()
    }


def first_difference(a: Mapping[str, Sequence[Op]], b: Mapping[str, Sequence[Op]]) -> str | None:
    """Where two iterations' structures first differ, in words; None when they agree."""
    from prism_megatron.graph.printable import format_op

    if list(a) != list(b):
        return f"streams {list(a)} vs {list(b)}"
    for name in a:
        for index, (x, y) in enumerate(zip(a[name], b[name], strict=False)):
            if not _same_op(x, y):
                return f"{name}[{index}]: {format_op(x)!r} vs {format_op(y)!r}"
        if len(a[name]) != len(b[name]):
            return f"{name}: {len(a[name])} vs {len(b[name])} ops"
    return None


SIZE_FOLLOWS_DATA = (OpKind.ALL_TO_ALL, OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER)
"""The collectives that move routed tokens, and so may change size between iterations (keep in step
with csrc/replay/engine.cpp)."""


def _data_dependent_size(op: Op) -> bool:
    """A collective's size may follow the data: MoE token dispatch moves the tokens the router sent
    to each expert rank (all-to-all; with TP, all-gathers and reduce-scatters of the routed tokens),
    which change from iteration to iteration. Its kind, group, order and dtype may not, nor may an
    all-reduce's or a p2p transfer's size."""
    return op.type == NodeType.COLLECTIVE and op.comm in SIZE_FOLLOWS_DATA


def _same_op(x: Op, y: Op) -> bool:
    """Equal but for a compute span's duration (only COMPUTE ops have one) and a data-dependent size."""
    if x.type == NodeType.COMPUTE or y.type == NodeType.COMPUTE:
        return x.type == y.type and x.name == y.name
    if _data_dependent_size(x) and _data_dependent_size(y):
        return dataclasses.replace(x, size_bytes=0) == dataclasses.replace(y, size_bytes=0)
    return x == y


def compute_durations(streams: Mapping[str, Sequence[Op]]) -> list[int]:
    """Durations of the COMPUTE ops in flat order (what `Problem.with_compute_durations` takes)."""
    return [op.duration_ns for ops in streams.values() for op in ops if op.type == NodeType.COMPUTE]


def compute_overheads(streams: Mapping[str, Sequence[Op]]) -> list[int]:
    """Host overheads of the COMPUTE ops in flat order."""
    return [op.overhead_ns for ops in streams.values() for op in ops if op.type == NodeType.COMPUTE]


def with_span(op: Op, duration_ns: int, overhead_ns: int | None = None) -> Op:
    """A compute op given another span (a median, a pooled one) and overhead (default: its own),
    the overhead never above the span."""
    if overhead_ns is None:
        overhead_ns = op.overhead_ns
    if duration_ns < 0:
        raise ValueError(f"op {op.name!r}: a span of {duration_ns} ns")
    return derived(op, duration_ns=duration_ns, overhead_ns=min(overhead_ns, duration_ns))


def role_graph(capture: RankCapture, world: World, kinds: Sequence[str] = GROUP_KINDS) -> RoleGraph:
    """The role's graph: recorded iterations after warm-up, each compute span their median, and so is
    each collective's size (MoE dispatch moves what the router chose, see `_data_dependent_size`).

    Raises:
        ValueError: the recorded iterations do not issue the same ops (naming the first difference).
    """
    names = GroupNames(world, capture.virtual_rank, kinds)
    per_iteration = [iteration_streams(it, names) for it in capture.recorded()]
    first = per_iteration[0]
    for number, streams in enumerate(per_iteration[1:], start=1):
        difference = first_difference(first, streams)
        if difference is not None:
            raise ValueError(
                f"virtual rank {capture.virtual_rank}: recorded iterations {capture.num_warmup} and "
                f"{capture.num_warmup + number} issue different ops ({difference}); the graph needs "
                "iterations that repeat"
            )
    medians = iter(
        round(statistics.median(values))
        for values in zip(*(compute_durations(s) for s in per_iteration), strict=True)
    )
    overheads = iter(
        round(statistics.median(values))
        for values in zip(*(compute_overheads(s) for s in per_iteration), strict=True)
    )
    streams = {
        name: tuple(
            with_span(op, next(medians), next(overheads)) if op.type == NodeType.COMPUTE else op for op in ops
        )
        for name, ops in first.items()
    }
    if len(per_iteration) > 1:
        streams = {
            name: tuple(
                dataclasses.replace(op, size_bytes=_median_size(per_iteration, name, index))
                if _data_dependent_size(op)
                else op
                for index, op in enumerate(ops)
            )
            for name, ops in streams.items()
        }
    return RoleGraph(role=capture.role, streams=streams)


def _median_size(per_iteration: Sequence[Mapping[str, Sequence[Op]]], stream: str, index: int) -> int:
    """One op's median size over the iterations (the lower median: a size that was sent)."""
    return statistics.median_low(streams[stream][index].size_bytes for streams in per_iteration)


def build_graph(
    captures: Sequence[RankCapture],
    world: World,
    layout: Mapping[str, object],
    *,
    extra: Mapping[str, object] | None = None,
    kinds: Sequence[str] = GROUP_KINDS,
    classes: Sequence[RoleClass] | None = None,
) -> ExecutionGraph:
    """The execution graph of the job: every role's graph, from the captures of its class.

    Among several captures of one role, the role's representative wins, else the lowest rank.
    `classes` (`topology.equivalence.role_classes`) says which roles run one program; each class
    needs one captured member, whose ops and spans `graph.classes.class_graphs` gives to every
    member (confirmed against, and pooled over, the other captured members). Without `classes`,
    every role is its own class and must be captured.

    Raises:
        ValueError: a class has no captured member (the message names its roles and a rank for
            each), or captured members of one class differ (naming the first differing op).
    """
    from prism_megatron.graph.classes import CLASSES_KEY, class_graphs

    by_role: dict[str, RankCapture] = {}
    for capture in sorted(captures, key=lambda c: c.virtual_rank):
        held = by_role.get(capture.role)
        if held is None or capture.virtual_rank == world.representative(capture.role):
            by_role[capture.role] = capture
    classes = tuple(classes) if classes is not None else tuple(RoleClass(n, (n,)) for n in world.roles())
    _check_classes(classes, world)
    missing = [c.representative for c in classes if not any(m in by_role for m in c.members)]
    if missing:
        hints = ", ".join(f"{name} (e.g. rank {world.representative(name)})" for name in missing[:8])
        raise ValueError(f"the capture lacks roles {hints}; capture a rank of each")
    graphs: dict[str, RoleGraph] = {}
    for role_class in classes:
        captured = {m: role_graph(by_role[m], world, kinds) for m in role_class.members if m in by_role}
        graphs.update(class_graphs(role_class, captured))
    sources = {name: by_role[name].virtual_rank for name in world.roles() if name in by_role}
    metadata = GraphMetadata(
        layout=dict(layout),
        source="capture",
        extra={**(extra or {}), "captured_ranks": sources, CLASSES_KEY: [c.to_json() for c in classes]},
    )
    return ExecutionGraph(metadata=metadata, roles={name: graphs[name] for name in world.roles()})


def _check_classes(classes: Sequence[RoleClass], world: World) -> None:
    """Every role of the world in exactly one class."""
    members = [m for c in classes for m in c.members]
    if sorted(members) != sorted(world.roles()):
        unknown = sorted(set(members) - set(world.roles()))
        raise ValueError(
            f"the role classes do not partition this job's roles (unknown or repeated: "
            f"{unknown or sorted(m for m in members if members.count(m) > 1)})"
        )
