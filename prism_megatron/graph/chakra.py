"""Export to the Chakra execution-trace form (MLCommons), as JSON, so other simulators can read it.

One file per exported rank, `chakra.<virtual rank>.json`, whose nodes follow Chakra's `Node`
message (schema/protobuf/et_def.proto): `id`, `name`, `type` (COMP_NODE, COMM_COLL_NODE,
COMM_SEND_NODE, COMM_RECV_NODE), `ctrl_deps` (stream order; ops coalesced into one batch share
theirs: every op of the batch before), `data_deps` (cross-stream dependencies), `duration_micros`,
and `attr` entries in the AttributeProto shape (`{"name": ..., "int64_val": ...}`): `comm_type`
(CollectiveCommType numbers), `comm_size`, `comm_src`/`comm_dst`, `comm_tag` (the sequence
number), `pg_name`, `is_cpu_op` and, beyond Chakra, `duration_ns` and `stream`. A WAIT becomes a
zero-length compute node carrying its dependencies. `comm_groups.json` maps every `pg_name` to its
members, the form ASTRA-sim's communicator-group file takes. Field names keep the proto's snake
case, so a converter to the binary form is a field-by-field copy.
"""

from __future__ import annotations

import os
from collections.abc import Iterable

from prism_megatron.graph.expand import ExpandedGraph, ResolvedOp
from prism_megatron.graph.io import write_json_atomically
from prism_megatron.graph.schema import SCHEMA_VERSION, NodeType
from prism_megatron.replay.schedule import OpKind

CHAKRA_SCHEMA = "0.0.4"

NODE_TYPES = {
    NodeType.COMPUTE: "COMP_NODE",
    NodeType.WAIT: "COMP_NODE",
    NodeType.COLLECTIVE: "COMM_COLL_NODE",
    NodeType.SEND: "COMM_SEND_NODE",
    NodeType.RECV: "COMM_RECV_NODE",
}

COMM_TYPES = {
    OpKind.ALL_REDUCE: 0,
    OpKind.REDUCE: 1,
    OpKind.ALL_GATHER: 2,
    OpKind.GATHER: 3,
    OpKind.SCATTER: 4,
    OpKind.BROADCAST: 5,
    OpKind.ALL_TO_ALL: 6,
    OpKind.REDUCE_SCATTER: 7,
    OpKind.BARRIER: 9,
}
"""OpKind -> Chakra CollectiveCommType."""


def _attr(name: str, value) -> dict:
    key = "bool_val" if isinstance(value, bool) else "int64_val" if isinstance(value, int) else "string_val"
    return {"name": name, key: value}


def rank_trace(expanded: ExpandedGraph, virtual_rank: int, pg_names: dict[tuple[int, ...], str]) -> dict:
    """The Chakra JSON trace of one virtual rank; `pg_names` collects the groups it names."""
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
            nodes.append(_node(resolved, node_id, name, previous_batch, ids, virtual_rank, pg_names))
            batch.append(node_id)
            if not resolved.op.coalesced:
                previous_batch, batch = batch, []
    metadata = {
        "version": CHAKRA_SCHEMA,
        "attr": [
            _attr("source", f"prism-megatron execution graph v{SCHEMA_VERSION}"),
            _attr("rank", virtual_rank),
            _attr("role", expanded.role_of(virtual_rank)),
            _attr("world_size", expanded.world_size),
        ],
    }
    return {"global_metadata": metadata, "nodes": nodes}


def _node(resolved: ResolvedOp, node_id, stream, ctrl_deps, ids, virtual_rank, pg_names) -> dict:
    op = resolved.op
    attrs = [_attr("is_cpu_op", False), _attr("stream", stream), _attr("duration_ns", op.duration_ns)]
    if op.type == NodeType.COLLECTIVE:
        pg = pg_names.setdefault(resolved.members, f"{op.group}:{min(resolved.members, default=-1)}")
        attrs += [
            _attr("comm_type", COMM_TYPES[op.comm]),
            _attr("comm_size", op.size_bytes),
            _attr("comm_tag", op.seq),
            _attr("pg_name", pg),
        ]
    elif op.type in (NodeType.SEND, NodeType.RECV):
        src, dst = (
            (virtual_rank, resolved.peer) if op.type == NodeType.SEND else (resolved.peer, virtual_rank)
        )
        attrs += [
            _attr("comm_src", src),
            _attr("comm_dst", dst),
            _attr("comm_size", op.size_bytes),
            _attr("comm_tag", op.seq),
        ]
    name = op.name or (op.comm.name if op.comm is not None else op.type.name)
    return {
        "id": node_id,
        "name": name,
        "type": NODE_TYPES[op.type],
        "ctrl_deps": list(ctrl_deps),
        "data_deps": [ids[(dep.stream, dep.index)] for dep in op.deps],
        "duration_micros": op.duration_ns // 1000,
        "attr": attrs,
    }


def export_chakra(
    expanded: ExpandedGraph, directory: str, virtual_ranks: Iterable[int] | None = None
) -> list[str]:
    """Write `chakra.<rank>.json` for each rank (default: each role's representative) and
    `comm_groups.json`; return the paths written."""
    ranks = (
        sorted({expanded.world.representative(name) for name in expanded.world.roles()})
        if virtual_ranks is None
        else list(virtual_ranks)
    )
    os.makedirs(directory, exist_ok=True)
    pg_names: dict[tuple[int, ...], str] = {}
    paths = []
    for rank in ranks:
        path = os.path.join(directory, f"chakra.{rank}.json")
        write_json_atomically(rank_trace(expanded, rank, pg_names), path)
        paths.append(path)
    groups_path = os.path.join(directory, "comm_groups.json")
    write_json_atomically({name: list(members) for members, name in pg_names.items()}, groups_path)
    return [*paths, groups_path]
