"""The execution-graph schema: what one iteration of every role does, op by op, stream by stream.

A graph holds, per role, the ordered ops of one training iteration on each stream of that role's
ranks. Ops name their communication partners *relative to the rank* (a group kind such as "tp" or
"dp", a pipeline neighbour "pp+1"), so one role's ops serve every virtual rank of the role: expansion
(`prism_megatron.graph.expand`) resolves them against the topology rank by rank.

Node types (the Chakra / ASTRA-sim vocabulary, reduced to what a training iteration needs):

* COMPUTE: a span of the stream's own work with a measured duration, and how much of it was host
  overhead rather than device work (`overhead_ns`).
* COLLECTIVE: an op over the rank's group of one kind. Ops on one group instance are matched across
  its members by sequence number (`seq`, the op's index among the rank's ops on that group kind).
* SEND / RECV: point-to-point with the member of a group at a fixed offset from the rank (for
  pipelines: group "pp", offset +1 or -1, wrapping). Matched by (source, destination, seq), seq
  counting the rank's sends (receives) to (from) that peer in issue order.
* WAIT: no work; completes when its cross-stream dependencies have (a `wait()` on an async op).

Dependencies: stream order (an op starts after its stream's previous op, or previous coalesced
batch, completed), and cross-stream `deps` (`Dep(stream, index)`: that op of the same rank must have
completed). An op marked `coalesced` is posted together with the op after it; the stream moves on
when the whole batch has completed (`batch_isend_irecv`, `_coalescing_manager`).

What capture fills in, from the backend's per-op record (kind, group members, peer, seq,
size_bytes, dtype, issue/start/complete times, async_op): group members -> `group` (the kind whose
group of the recorded rank has those members, see `expand.group_kind_of`); peer -> `group` + `offset`
(`expand.peer_spec`); async ops -> an op on a side stream plus a WAIT where the program waited;
gaps between ops on the compute stream -> COMPUTE spans.
"""

from __future__ import annotations

import dataclasses
import enum
import re
from collections.abc import Mapping

from prism_megatron.replay.schedule import OpKind

SCHEMA_VERSION = 1

COMPUTE_STREAM = "compute"
"""Name of the stream that runs the rank's compute; breakdowns are measured on it."""

WORLD_GROUP = "world"
"""Pseudo group kind: every virtual rank of the job (grad-norm reductions, barriers)."""

_NAME = re.compile(r"^[A-Za-z0-9_.\-/]*$")


class NodeType(enum.IntEnum):
    """Node types (numbers shared with csrc/sim/des.cpp)."""

    COMPUTE = 0
    COLLECTIVE = 1
    SEND = 2
    RECV = 3
    WAIT = 4


COMMUNICATION = (NodeType.COLLECTIVE, NodeType.SEND, NodeType.RECV)
P2P = (NodeType.SEND, NodeType.RECV)
COLLECTIVE_KINDS = tuple(k for k in OpKind if k not in (OpKind.SEND, OpKind.RECV))


@dataclasses.dataclass(frozen=True, slots=True)
class Dep:
    """A cross-stream dependency: op `index` of stream `stream` of the same rank must have completed."""

    stream: str
    index: int


@dataclasses.dataclass(frozen=True, slots=True, kw_only=True)
class Op:
    """One op of one role's iteration. Fields that do not apply to the node type stay at defaults."""

    type: NodeType
    name: str = ""
    """A label: "fwd", "bwd", "optimizer" for compute; optional for communication."""
    duration_ns: int = 0
    """COMPUTE: measured duration."""
    overhead_ns: int = 0
    """COMPUTE: the part of `duration_ns` that was host overhead (Python, framework, launches), not
    device work (kernels, the sleep-compute workload's sleeps); a straggler what-if stretches only
    the rest. 0 where the capture recorded no device work apart (all of the span counts as work)."""
    comm: OpKind | None = None
    """COLLECTIVE: the collective (ALL_REDUCE, REDUCE_SCATTER, ...)."""
    group: str = ""
    """COLLECTIVE: the group kind ("tp", "dp", ..., "world"); SEND/RECV: the kind the peer is found in."""
    offset: int = 0
    """SEND/RECV: the peer is the member at (own position + offset) mod group size."""
    size_bytes: int = 0
    dtype: str = ""
    seq: int = -1
    """COLLECTIVE: index among this rank's ops on `group` in issue order within the iteration.
    SEND/RECV: index among this rank's ops of the same type with the same peer rank, in issue order.
    Matching across ranks uses these numbers, never the simulated order of arrival."""
    microbatch: int = -1
    coalesced: bool = False
    """Posted together with the next op of the stream; the stream waits for the whole batch."""
    deps: tuple[Dep, ...] = ()

    def __post_init__(self) -> None:
        if not _NAME.match(self.name) or not _NAME.match(self.dtype):
            raise ValueError(
                f"op name {self.name!r} / dtype {self.dtype!r} may use only letters, digits and _.-/"
            )
        if self.duration_ns < 0 or self.size_bytes < 0:
            raise ValueError(f"op {self.name!r}: duration_ns and size_bytes must be >= 0")
        if not 0 <= self.overhead_ns <= self.duration_ns:
            raise ValueError(
                f"op {self.name!r}: overhead_ns {self.overhead_ns} must be within 0..duration_ns {self.duration_ns}"
            )
        if self.type == NodeType.COLLECTIVE:
            if self.comm not in COLLECTIVE_KINDS:
                raise ValueError(
                    f"collective op needs comm in {[k.name for k in COLLECTIVE_KINDS]}, got {self.comm}"
                )
            if not self.group or self.seq < 0:
                raise ValueError(f"collective op {self.comm.name} needs a group kind and a seq >= 0")
        elif self.type in P2P:
            if not self.group or self.offset == 0 or self.seq < 0:
                raise ValueError(
                    f"{self.type.name} op needs a peer group kind, a non-zero offset and a seq >= 0"
                )
        elif self.comm is not None or self.group:
            raise ValueError(f"{self.type.name} op takes no comm or group")


def derived(
    op: Op,
    *,
    duration_ns: int | None = None,
    overhead_ns: int | None = None,
    seq: int | None = None,
    deps: tuple[Dep, ...] | None = None,
) -> Op:
    """`op` with new timing, sequence number or deps, made without `Op`'s checks: the graph builder
    derives every op of a large job this way (a 16,384-GPU job's graph, 1.3 million ops, took 18 s
    of its 20 in `dataclasses.replace`). What the checks guard is kept by the caller: a duration
    >= 0 with the overhead within it, a seq >= 0 where the op needs one."""
    new = object.__new__(Op)
    _set(new, "type", op.type)
    _set(new, "name", op.name)
    _set(new, "duration_ns", op.duration_ns if duration_ns is None else duration_ns)
    _set(new, "overhead_ns", op.overhead_ns if overhead_ns is None else overhead_ns)
    _set(new, "comm", op.comm)
    _set(new, "group", op.group)
    _set(new, "offset", op.offset)
    _set(new, "size_bytes", op.size_bytes)
    _set(new, "dtype", op.dtype)
    _set(new, "seq", op.seq if seq is None else seq)
    _set(new, "microbatch", op.microbatch)
    _set(new, "coalesced", op.coalesced)
    _set(new, "deps", op.deps if deps is None else deps)
    return new


_set = object.__setattr__
_DERIVED_FIELDS = ("type", "name", "duration_ns", "overhead_ns", "comm", "group", "offset", "size_bytes",
                   "dtype", "seq", "microbatch", "coalesced", "deps")  # fmt: skip
if tuple(f.name for f in dataclasses.fields(Op)) != _DERIVED_FIELDS:  # a field `derived` would drop
    raise AssertionError(f"graph.schema.derived copies {_DERIVED_FIELDS}; Op's fields have changed")


@dataclasses.dataclass(frozen=True)
class RoleGraph:
    """The ops of one role's iteration: stream name -> ops in order. The compute stream comes first."""

    role: str
    streams: Mapping[str, tuple[Op, ...]]

    def __post_init__(self) -> None:
        if COMPUTE_STREAM not in self.streams:
            raise ValueError(f"role {self.role!r} has no {COMPUTE_STREAM!r} stream")
        for stream, ops in self.streams.items():
            for index, op in enumerate(ops):
                for dep in op.deps:
                    if dep.stream == stream or dep.stream not in self.streams:
                        raise ValueError(f"role {self.role!r} {stream}[{index}]: bad dep on {dep}")
                    if not 0 <= dep.index < len(self.streams[dep.stream]):
                        raise ValueError(f"role {self.role!r} {stream}[{index}]: dep {dep} out of range")
        _check_sequence_numbers(self)

    @property
    def num_ops(self) -> int:
        return sum(len(ops) for ops in self.streams.values())


def _check_sequence_numbers(role: RoleGraph) -> None:
    """Each group kind's collectives carry seq 0, 1, 2, ... in program order (streams in order).

    Capture numbers them as the backend issued them; a gap means an op was lost.
    """
    seen: dict[str, list[int]] = {}
    for ops in role.streams.values():
        for op in ops:
            if op.type == NodeType.COLLECTIVE:
                seen.setdefault(op.group, []).append(op.seq)
    for group, seqs in seen.items():
        if sorted(seqs) != list(range(len(seqs))):
            raise ValueError(
                f"role {role.role!r}: collectives on {group!r} have seqs {seqs[:8]}..., not 0..n-1"
            )


@dataclasses.dataclass(frozen=True)
class GraphMetadata:
    """Where a graph came from and the job it describes.

    Attributes:
        layout: the target job's parallel layout as keyword arguments of
            `prism_megatron.topology.Layout` (world_size, tp, pp, ...), so a reader can rebuild it.
        source: how the graph was made ("capture", "synthetic:1f1b", ...).
        extra: free-form facts (model name, microbatches, ...), JSON values only.
    """

    layout: Mapping[str, object]
    source: str = ""
    extra: Mapping[str, object] = dataclasses.field(default_factory=dict)

    def mismatches(
        self, layout: Mapping[str, object], facts: Mapping[str, object] | None = None
    ) -> list[str]:
        """How another job differs from this graph's, in words ("tp 4 in the graph, 2 here").

        Every layout field counts, one only the graph holds too (a field a layout leaves out at its
        default reads "not set"); a fact (`facts`, compared with `extra`) only where both know it.
        """
        keys = list(layout) + [key for key in self.layout if key not in layout]
        out = [
            f"{key} {self.layout.get(key, 'not set')} in the graph, {layout.get(key, 'not set')} here"
            for key in keys
            if self.layout.get(key, "not set") != layout.get(key, "not set")
        ]
        for key, value in (facts or {}).items():
            recorded = self.extra.get(key)
            if recorded is not None and value is not None and recorded != value:
                out.append(f"{key} {recorded} in the graph, {value} here")
        return out


@dataclasses.dataclass(frozen=True)
class ExecutionGraph:
    """Per role, the ops of one iteration; with the topology, the execution graph of the whole job."""

    metadata: GraphMetadata
    roles: Mapping[str, RoleGraph]

    def __post_init__(self) -> None:
        for name, role in self.roles.items():
            if name != role.role:
                raise ValueError(f"role graph {role.role!r} stored under the name {name!r}")

    @property
    def num_ops(self) -> int:
        return sum(role.num_ops for role in self.roles.values())
