"""Export an execution graph as Chakra execution traces (binary protobuf), the files ASTRA-sim reads.

One file per NPU, `<prefix>.<npu>.et` (npu = virtual rank, ASTRA-sim's naming), each a framed
sequence (`stream.py`) of one `GlobalMetadata` and one `Node` per op of the rank's iteration:

* COMPUTE -> COMP_NODE; WAIT -> a COMP_NODE of duration 0 that carries its dependencies;
  COLLECTIVE -> COMM_COLL_NODE; SEND / RECV -> COMM_SEND_NODE / COMM_RECV_NODE.
* names start with the node type's name ("COMP_NODE fwd", "COMM_COLL_NODE ALL_REDUCE tp"): Chakra's
  timeline visualizer tells compute from communication by that word alone.
* node ids: every SEND first, then every other op, each in stream order (`node_ids`). ASTRA-sim
  keeps one communication node in flight per NPU (workload/HardwareResource.cc; receives exempt)
  and issues the nodes whose dependencies are met in id order. A collective waits for its peers, a
  send does not (the analytical backend delivers it without its receive), so a collective issued
  ahead of a send that was ready at the same moment can wait forever for a peer that needs the
  send's data: the last pipeline stage's final backward send, ready together with its gradient
  reduce-scatter, did exactly that with ids in plain stream order. A send first only delays what
  follows it on that NPU.
* dependencies: `ctrl_deps` holds the stream order (the op or coalesced batch before it on its
  stream); `data_deps` holds every dependency, the stream order and the cross-stream ones (a wait on
  an async op). The stream order is repeated there because Chakra's feeders resolve data_deps (some
  only those), and a trace whose ops ignore their stream order would run them all at once.
* durations: `duration_micros`, the only duration Chakra's feeders and ASTRA-sim read (whole
  microseconds; ASTRA-sim runs a 0 as 1 ns). Each stream's durations are rounded with the remainder
  carried to the next op, so a stream of many short ops keeps its total to within half a
  microsecond where rounding each alone would drop or double them. The exact time stays in the
  extra attribute `duration_ns`.
* attributes, with the protobuf types Chakra's C++ feeder (src/feeder/et_feeder_node.cpp) reads:
  `is_cpu_op` bool_val (false); `comm_type` int64_val (CollectiveCommType); `comm_size` int64_val;
  `comm_src`, `comm_dst` (global ranks) and `comm_tag` (the op's sequence number) int32_val;
  `pg_name` string_val (the communicator group's integer id). A value of another type reads as 0 there.
  Beyond what the feeder reads: `duration_ns` int64_val, `stream` string_val and, where the exported
  collective differs from ours, `prism_comm_type` (our collective's name).

`comm_size`, per collective, as ASTRA-sim's collective algorithms (Ring.cc and the others) and
Chakra's PyTorch converter take it, from prism's convention (the largest buffer the op touches on a
rank): ALL_REDUCE, ALL_TO_ALL, BROADCAST the buffer; REDUCE_SCATTER its full input (the largest);
ALL_GATHER each rank's input, the gathered buffer divided by the group size.

ASTRA-sim runs ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER and ALL_TO_ALL over its network, replays a
BROADCAST for its `duration_micros` on each rank alone, and refuses every other type ("Unsupported
collective comm type"). The others are exported as the supported collective that synchronises the
same members and moves the same bytes through the busiest rank (`EXPORTED_AS`):

* BARRIER -> ALL_REDUCE of 4 bytes (what torch's NCCL barrier runs: a one-element all-reduce);
* REDUCE (S bytes to the root) -> REDUCE_SCATTER of S: the root of a ring reduce receives
  (n-1)/n S, as each rank of a reduce-scatter does;
* GATHER (S gathered at the root) -> ALL_GATHER of S/n per rank; SCATTER (S from the root) ->
  REDUCE_SCATTER of S: the root's (n-1)/n S again.

Given a cost function (`cost_fn`, the network model of a cluster), a BROADCAST's `duration_micros`
is its modelled time, which ASTRA-sim then replays; without one it is the graph's (0: 1 ns there).

Communicator groups get integer ids 1, 2, ... (ASTRA-sim treats "0" and "" as "all ranks"), listed
in `comm_groups.json` as {"<id>": [npu, ...]}, the file ASTRA-sim's --comm-group-configuration reads.

By default only each role's representative is written, with `roles.json` mapping every role to its
file and its ranks (the traces of a role's ranks differ only in their peers and groups); ASTRA-sim
needs every NPU's file, `all_ranks=True`, whose size is estimated first and refused above
`max_bytes`.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Callable, Iterable, Mapping, Sequence

from prism_megatron import files
from prism_megatron.graph.chakra import et_def_pb2 as et
from prism_megatron.graph.chakra.stream import framed
from prism_megatron.graph.expand import ExpandedGraph, ResolvedOp
from prism_megatron.graph.schema import SCHEMA_VERSION, NodeType
from prism_megatron.replay.schedule import OpKind
from prism_megatron.topology import format_ranks

CHAKRA_VERSION = "0.0.4"
"""GlobalMetadata.version, as ASTRA-sim's own example traces carry it."""
DEFAULT_PREFIX = "chakra"
DEFAULT_MAX_BYTES = 4 << 30
COMM_GROUPS_FILE = "comm_groups.json"
ROLES_FILE = "roles.json"
BARRIER_BYTES = 4
"""The all-reduce a barrier is exported as: one float32, as torch.distributed's NCCL barrier."""

CostFn = Callable[[OpKind, tuple[int, ...], int], float]
"""(kind, members, size_bytes) -> ns, as `prism_megatron.sim.cost.CostFn`."""

NODE_TYPES = {
    NodeType.COMPUTE: et.COMP_NODE,
    NodeType.WAIT: et.COMP_NODE,
    NodeType.COLLECTIVE: et.COMM_COLL_NODE,
    NodeType.SEND: et.COMM_SEND_NODE,
    NodeType.RECV: et.COMM_RECV_NODE,
}
COMM_TYPES = {
    OpKind.ALL_REDUCE: et.ALL_REDUCE,
    OpKind.ALL_GATHER: et.ALL_GATHER,
    OpKind.BROADCAST: et.BROADCAST,
    OpKind.ALL_TO_ALL: et.ALL_TO_ALL,
    OpKind.REDUCE_SCATTER: et.REDUCE_SCATTER,
}
"""Our collectives that ASTRA-sim runs as they are."""
EXPORTED_AS = {
    OpKind.BARRIER: et.ALL_REDUCE,
    OpKind.REDUCE: et.REDUCE_SCATTER,
    OpKind.GATHER: et.ALL_GATHER,
    OpKind.SCATTER: et.REDUCE_SCATTER,
}
"""Our collectives that ASTRA-sim refuses, and the supported one each is exported as (see above)."""
FEEDER_TYPES = {
    "is_cpu_op": "bool_val",
    "comm_type": "int64_val",
    "comm_size": "int64_val",
    "comm_src": "int32_val",
    "comm_dst": "int32_val",
    "comm_tag": "int32_val",
    "pg_name": "string_val",
}
"""The AttributeProto field Chakra's C++ feeder reads for each attribute it knows."""
_INT32_MAX = (1 << 31) - 1


def comm_type_of(kind: OpKind) -> int:
    """The CollectiveCommType a collective of ours is exported as."""
    return COMM_TYPES[kind] if kind in COMM_TYPES else EXPORTED_AS[kind]


def comm_size_of(kind: OpKind, size_bytes: int, num_members: int) -> int:
    """`comm_size` as ASTRA-sim reads it, from prism's size (the largest buffer the op touches)."""
    if kind == OpKind.BARRIER:
        return BARRIER_BYTES
    if kind in (OpKind.ALL_GATHER, OpKind.GATHER):  # ASTRA-sim: each rank's input
        return size_bytes // max(1, num_members)
    return size_bytes


class CommGroups:
    """Integer ids for communicator groups, from 1, in the order they are first named."""

    def __init__(self) -> None:
        self.ids: dict[tuple[int, ...], int] = {}

    def id_of(self, members: tuple[int, ...]) -> int:
        return self.ids.setdefault(members, len(self.ids) + 1)

    def to_json(self) -> dict[str, list[int]]:
        return {str(group_id): list(members) for members, group_id in self.ids.items()}


def _attr(name: str, value) -> et.AttributeProto:
    """An attribute in the field Chakra's feeder reads it from (FEEDER_TYPES), else by Python type."""
    field = FEEDER_TYPES.get(name)
    if field is None:
        field = (
            "bool_val" if isinstance(value, bool) else "int64_val" if isinstance(value, int) else "string_val"
        )
    if field == "int32_val" and not 0 <= value <= _INT32_MAX:
        raise ValueError(f"attribute {name}={value} does not fit the int32 Chakra's feeder reads it as")
    if field == "string_val":
        value = str(value)
    return et.AttributeProto(name=name, **{field: value})


class _Rounder:
    """Whole microseconds from nanoseconds, the remainder carried to the next call (one per stream)."""

    def __init__(self) -> None:
        self.exact_ns = 0
        self.written_us = 0

    def micros(self, duration_ns: float) -> int:
        self.exact_ns += duration_ns
        target_us = max(self.written_us, round(self.exact_ns / 1000))
        out, self.written_us = target_us - self.written_us, target_us
        return out


def rank_trace(
    expanded: ExpandedGraph, virtual_rank: int, groups: CommGroups, cost_fn: CostFn | None = None
) -> tuple[et.GlobalMetadata, list[et.Node]]:
    """The metadata and nodes of one rank's trace; `groups` collects the groups it names.

    `cost_fn` (optional) gives a BROADCAST's duration, which ASTRA-sim replays instead of simulating.
    """
    streams = expanded.streams(virtual_rank)
    ids = node_ids(streams)
    nodes = []
    for name, ops in streams.items():
        previous_batch: list[int] = []  # the stream waits for every op of the batch before
        batch: list[int] = []
        rounder = _Rounder()
        for index, resolved in enumerate(ops):
            node_id = ids[(name, index)]
            cross = [ids[(dep.stream, dep.index)] for dep in resolved.op.deps]
            node = _node(resolved, node_id, name, virtual_rank, groups)
            node.ctrl_deps.extend(previous_batch)
            node.data_deps.extend(dict.fromkeys([*previous_batch, *cross]))
            if _replayed(resolved.op):
                node.duration_micros = rounder.micros(_duration_ns(resolved, cost_fn))
            else:  # ASTRA-sim simulates it and ignores the duration
                node.duration_micros = round(resolved.op.duration_ns / 1000)
            nodes.append(node)
            batch.append(node_id)
            if not resolved.op.coalesced:
                previous_batch, batch = batch, []
    nodes.sort(key=lambda node: node.id)
    metadata = et.GlobalMetadata(
        version=CHAKRA_VERSION,
        attr=[
            _attr("source", f"prism-megatron execution graph v{SCHEMA_VERSION}"),
            _attr("rank", virtual_rank),
            _attr("role", expanded.role_of(virtual_rank)),
            _attr("world_size", expanded.world_size),
        ],
    )
    return metadata, nodes


def node_ids(streams: Mapping[str, Sequence[ResolvedOp]]) -> dict[tuple[str, int], int]:
    """(stream, index) -> node id for one rank's streams: every SEND first, then every other op, each
    in stream order (the module's docstring says why ASTRA-sim needs the sends first)."""
    ops = [
        (name, index, resolved.op)
        for name, stream in streams.items()
        for index, resolved in enumerate(stream)
    ]
    sends = [(name, index) for name, index, op in ops if op.type == NodeType.SEND]
    others = [(name, index) for name, index, op in ops if op.type != NodeType.SEND]
    return {at: node_id for node_id, at in enumerate([*sends, *others])}


def _replayed(op) -> bool:
    """Whether ASTRA-sim spends the node's `duration_micros` (compute, waits, broadcasts)."""
    return op.type in (NodeType.COMPUTE, NodeType.WAIT) or op.comm == OpKind.BROADCAST


def _duration_ns(resolved: ResolvedOp, cost_fn: CostFn | None) -> float:
    """What ASTRA-sim should spend on the node where it does not simulate it itself."""
    op = resolved.op
    if cost_fn is not None and op.type == NodeType.COLLECTIVE and op.comm == OpKind.BROADCAST:
        return cost_fn(op.comm, resolved.members, op.size_bytes)
    return op.duration_ns


def _node(resolved: ResolvedOp, node_id: int, stream: str, virtual_rank: int, groups: CommGroups) -> et.Node:
    op = resolved.op
    attrs = [_attr("is_cpu_op", False), _attr("stream", stream), _attr("duration_ns", op.duration_ns)]
    label = op.name
    if op.type == NodeType.COLLECTIVE:
        attrs += [
            _attr("comm_type", comm_type_of(op.comm)),
            _attr("comm_size", comm_size_of(op.comm, op.size_bytes, len(resolved.members))),
            _attr("comm_tag", op.seq),
            _attr("pg_name", groups.id_of(resolved.members)),
        ]
        if op.comm not in COMM_TYPES:
            attrs.append(_attr("prism_comm_type", op.comm.name))
        label = " ".join(part for part in (op.comm.name, op.group, op.name) if part)
    elif op.type in (NodeType.SEND, NodeType.RECV):
        sending = op.type == NodeType.SEND
        src, dst = (virtual_rank, resolved.peer) if sending else (resolved.peer, virtual_rank)
        attrs += [
            _attr("comm_src", src),
            _attr("comm_dst", dst),
            _attr("comm_size", op.size_bytes),
            _attr("comm_tag", op.seq),
        ]
        label = " ".join(part for part in (op.group, op.name) if part)
    elif op.type == NodeType.WAIT:
        label = " ".join(part for part in ("wait", op.name) if part)
    node_type = NODE_TYPES[op.type]
    return et.Node(
        id=node_id,
        name=" ".join(
            dict.fromkeys(part for part in (et.NodeType.Name(node_type), *label.split(" ")) if part)
        ),
        type=node_type,
        attr=attrs,
    )


def trace_bytes(metadata: et.GlobalMetadata, nodes: list[et.Node]) -> bytes:
    return framed(metadata) + b"".join(framed(node) for node in nodes)


@dataclasses.dataclass(frozen=True)
class Exported:
    """What an export wrote."""

    paths: list[str]
    """Every file written (traces first, then comm_groups.json and roles.json)."""
    num_bytes: int
    """Bytes of the trace files."""


def estimate_bytes(expanded: ExpandedGraph) -> int:
    """Bytes that `all_ranks` would write: each role's representative trace times its rank count."""
    world = expanded.world
    counts: dict[str, int] = {}
    for role_id in world.role_ids():
        name = world.roles()[int(role_id)]
        counts[name] = counts.get(name, 0) + 1
    total = 0
    for name, count in counts.items():
        total += count * len(trace_bytes(*rank_trace(expanded, world.representative(name), CommGroups())))
    return total


def export_chakra(
    expanded: ExpandedGraph,
    directory: str,
    virtual_ranks: Iterable[int] | None = None,
    *,
    all_ranks: bool = False,
    prefix: str = DEFAULT_PREFIX,
    max_bytes: int = DEFAULT_MAX_BYTES,
    cost_fn: CostFn | None = None,
) -> Exported:
    """Write the traces of the given ranks (default: each role's representative; `all_ranks`: every NPU).

    `cost_fn`, the network model of a cluster, gives each BROADCAST the duration ASTRA-sim replays.

    Raises:
        ValueError: `all_ranks` would write more than `max_bytes` (the message gives the estimate).
    """
    world = expanded.world
    if all_ranks:
        estimate = estimate_bytes(expanded)
        if estimate > max_bytes:
            raise ValueError(
                f"--all-ranks would write about {_gib(estimate)} for {expanded.world_size} NPUs, above the "
                f"limit of {_gib(max_bytes)}; raise --max-size or export the roles only"
            )
        ranks = list(range(expanded.world_size))
    elif virtual_ranks is None:
        ranks = sorted({world.representative(name) for name in world.roles()})
    else:
        ranks = list(virtual_ranks)
    os.makedirs(directory, exist_ok=True)
    groups = CommGroups()
    paths, total = [], 0
    for rank in ranks:
        data = trace_bytes(*rank_trace(expanded, rank, groups, cost_fn))
        path = os.path.join(directory, f"{prefix}.{rank}.et")
        files.write_atomically(path, data)
        paths.append(path)
        total += len(data)
    groups_path = os.path.join(directory, COMM_GROUPS_FILE)
    files.write_json(groups.to_json(), groups_path)
    paths.append(groups_path)
    if not all_ranks:
        paths.append(_write_roles(expanded, directory, prefix, ranks))
    return Exported(paths=paths, num_bytes=total)


def _write_roles(expanded: ExpandedGraph, directory: str, prefix: str, written: list[int]) -> str:
    world = expanded.world
    members: dict[str, list[int]] = {name: [] for name in world.roles()}
    for rank, role_id in enumerate(world.role_ids()):
        members[world.roles()[int(role_id)]].append(rank)
    roles = {}
    for name, ranks in members.items():
        representative = world.representative(name)
        roles[name] = {
            "representative": representative,
            "file": f"{prefix}.{representative}.et" if representative in written else None,
            "num_ranks": len(ranks),
            "ranks": format_ranks(ranks),
        }
    doc = {"world_size": expanded.world_size, "prefix": prefix, "roles": roles}
    path = os.path.join(directory, ROLES_FILE)
    files.write_json(doc, path)
    return path


def _gib(num_bytes: int) -> str:
    return f"{num_bytes / (1 << 30):.2f} GiB" if num_bytes >= 1 << 28 else f"{num_bytes / (1 << 20):.1f} MiB"
