"""Export an execution graph as Chakra execution traces (binary protobuf), the files ASTRA-sim reads.

One file per NPU, `<prefix>.<npu>.et` (npu = virtual rank, ASTRA-sim's naming), each a framed
sequence (`stream.py`) of one `GlobalMetadata` and one `Node` per op of the rank's iteration:

* COMPUTE -> COMP_NODE with `duration_micros`; WAIT -> a COMP_NODE of duration 0 that carries its
  dependencies; COLLECTIVE -> COMM_COLL_NODE; SEND / RECV -> COMM_SEND_NODE / COMM_RECV_NODE.
* dependencies: `ctrl_deps` holds the stream order (the op or coalesced batch before it on its
  stream); `data_deps` holds every dependency, the stream order and the cross-stream ones (a wait on
  an async op). The stream order is repeated there because Chakra's feeders resolve data_deps (some
  only those), and a trace whose ops ignore their stream order would run them all at once.
* attributes, as ASTRA-sim reads them: `is_cpu_op` (false), `comm_type` (CollectiveCommType),
  `comm_size` (bytes; prism's size convention, the largest buffer the op touches on the rank),
  `pg_name` (the communicator group's integer id, as a string), `comm_src` / `comm_dst` (global
  ranks) and `comm_tag` (the op's sequence number); beyond ASTRA-sim, `duration_ns` (µs would round
  short ops to 0) and `stream`.

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
from collections.abc import Iterable

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

NODE_TYPES = {
    NodeType.COMPUTE: et.COMP_NODE,
    NodeType.WAIT: et.COMP_NODE,
    NodeType.COLLECTIVE: et.COMM_COLL_NODE,
    NodeType.SEND: et.COMM_SEND_NODE,
    NodeType.RECV: et.COMM_RECV_NODE,
}
COMM_TYPES = {
    OpKind.ALL_REDUCE: et.ALL_REDUCE,
    OpKind.REDUCE: et.REDUCE,
    OpKind.ALL_GATHER: et.ALL_GATHER,
    OpKind.GATHER: et.GATHER,
    OpKind.SCATTER: et.SCATTER,
    OpKind.BROADCAST: et.BROADCAST,
    OpKind.ALL_TO_ALL: et.ALL_TO_ALL,
    OpKind.REDUCE_SCATTER: et.REDUCE_SCATTER,
    OpKind.BARRIER: et.BARRIER,
}


class CommGroups:
    """Integer ids for communicator groups, from 1, in the order they are first named."""

    def __init__(self) -> None:
        self.ids: dict[tuple[int, ...], int] = {}

    def id_of(self, members: tuple[int, ...]) -> int:
        return self.ids.setdefault(members, len(self.ids) + 1)

    def to_json(self) -> dict[str, list[int]]:
        return {str(group_id): list(members) for members, group_id in self.ids.items()}


def _attr(name: str, value) -> et.AttributeProto:
    if isinstance(value, bool):
        return et.AttributeProto(name=name, bool_val=value)
    if isinstance(value, int):
        return et.AttributeProto(name=name, int64_val=value)
    return et.AttributeProto(name=name, string_val=str(value))


def rank_trace(
    expanded: ExpandedGraph, virtual_rank: int, groups: CommGroups
) -> tuple[et.GlobalMetadata, list[et.Node]]:
    """The metadata and nodes of one rank's trace; `groups` collects the groups it names."""
    streams = expanded.streams(virtual_rank)
    ids: dict[tuple[str, int], int] = {}
    for name, ops in streams.items():
        for index in range(len(ops)):
            ids[(name, index)] = len(ids)
    nodes = []
    for name, ops in streams.items():
        previous_batch: list[int] = []  # the stream waits for every op of the batch before
        batch: list[int] = []
        for index, resolved in enumerate(ops):
            node_id = ids[(name, index)]
            cross = [ids[(dep.stream, dep.index)] for dep in resolved.op.deps]
            nodes.append(_node(resolved, node_id, name, previous_batch, cross, virtual_rank, groups))
            batch.append(node_id)
            if not resolved.op.coalesced:
                previous_batch, batch = batch, []
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


def _node(resolved: ResolvedOp, node_id, stream, ctrl_deps, cross_deps, virtual_rank, groups) -> et.Node:
    op = resolved.op
    attrs = [_attr("is_cpu_op", False), _attr("stream", stream), _attr("duration_ns", op.duration_ns)]
    if op.type == NodeType.COLLECTIVE:
        attrs += [
            _attr("comm_type", COMM_TYPES[op.comm]),
            _attr("comm_size", op.size_bytes),
            _attr("comm_tag", op.seq),
            _attr("pg_name", str(groups.id_of(resolved.members))),
        ]
    elif op.type in (NodeType.SEND, NodeType.RECV):
        sending = op.type == NodeType.SEND
        src, dst = (virtual_rank, resolved.peer) if sending else (resolved.peer, virtual_rank)
        attrs += [
            _attr("comm_src", src),
            _attr("comm_dst", dst),
            _attr("comm_size", op.size_bytes),
            _attr("comm_tag", op.seq),
        ]
    name = op.name or (op.comm.name if op.comm is not None else op.type.name)
    return et.Node(
        id=node_id,
        name=name or "op",
        type=NODE_TYPES[op.type],
        ctrl_deps=list(ctrl_deps),
        data_deps=list(dict.fromkeys([*ctrl_deps, *cross_deps])),
        duration_micros=round(op.duration_ns / 1000),
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
) -> Exported:
    """Write the traces of the given ranks (default: each role's representative; `all_ranks`: every NPU).

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
        data = trace_bytes(*rank_trace(expanded, rank, groups))
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
