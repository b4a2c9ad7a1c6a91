"""Expansion of the role graph to every rank of the job, and the Chakra export."""

import json
import tracemalloc

import pytest

from prism_megatron.graph.chakra import export_chakra
from prism_megatron.graph.expand import ExpandedGraph
from prism_megatron.graph.schema import COMPUTE_STREAM, NodeType
from prism_megatron.graph.world import LayoutWorld, group_kind_of, peer_spec, world_from_metadata
from prism_megatron.sim import PipelineSpec, layout_pipeline_graph
from prism_megatron.topology import Layout

SPEC = PipelineSpec(
    num_microbatches=4,
    fwd_ns=1000,
    bwd_ns=2000,
    activation_bytes=64,
    tp_allreduce_bytes=128,
    dp_grad_bytes=4096,
)


def test_each_rank_runs_its_roles_ops_with_its_own_groups():
    layout = Layout(world_size=64, tp=2, pp=4)
    expanded = ExpandedGraph(layout_pipeline_graph(layout, SPEC), LayoutWorld(layout))
    rank = 27  # tp 1, dp 5, stage 1
    streams = expanded.streams(rank)
    assert expanded.role_of(rank) == layout.role_of(rank).name == "pp1"
    collectives = [r for r in streams[COMPUTE_STREAM] if r.op.type == NodeType.COLLECTIVE]
    assert {r.op.group: r.members for r in collectives} == {
        "tp": layout.group("tp", rank),
        "dp": layout.group("dp", rank),
        "world": tuple(range(64)),
    }
    pp = layout.group("pp", rank)
    sends = [r for ops in streams.values() for r in ops if r.op.type == NodeType.SEND]
    assert {(r.op.offset, r.peer) for r in sends} == {(1, pp[2]), (-1, pp[0])}


def test_expansion_is_lazy_until_materialized():
    layout = Layout(world_size=8192, tp=8, pp=16)
    graph = layout_pipeline_graph(layout, SPEC)
    world = LayoutWorld(layout)
    tracemalloc.start()
    expanded = ExpandedGraph(graph, world)
    total = expanded.num_ops()
    lazy_bytes = tracemalloc.get_traced_memory()[0]
    some = expanded.materialize(range(512))
    materialized_bytes = tracemalloc.get_traced_memory()[0]
    tracemalloc.stop()
    assert total == sum(graph.roles[layout.role_of(r).name].num_ops for r in range(0, 8192, 512)) * 512
    assert lazy_bytes < 1_000_000  # the role ids of 8192 ranks, nothing per op
    assert materialized_bytes > 10 * lazy_bytes
    assert some[100] == expanded.streams(100)


def test_capture_helpers_name_groups_and_peers_relative_to_the_rank():
    layout = Layout(world_size=64, tp=2, pp=4)
    world = LayoutWorld(layout)
    pp = layout.group("pp", 27)
    assert peer_spec(world, 27, pp[2]) == ("pp", 1)
    assert peer_spec(world, 27, pp[0]) == ("pp", -1)
    assert group_kind_of(world, 27, list(reversed(layout.group("dp", 27))), ["tp", "dp"]) == "dp"
    assert group_kind_of(world, 27, range(64), ["tp"]) == "world"
    with pytest.raises(ValueError, match="no group kind"):
        group_kind_of(world, 27, [27, 28], ["tp", "dp"])


def test_a_graph_carries_the_layout_it_expands_with():
    layout = Layout(world_size=64, tp=2, pp=4, vpp=None)
    graph = layout_pipeline_graph(layout, SPEC)
    assert world_from_metadata(graph.metadata.layout).layout == layout
    with pytest.raises(ValueError, match="no layout"):
        world_from_metadata({})
    with pytest.raises(ValueError, match="not divisible"):
        world_from_metadata({**graph.metadata.layout, "world_size": 63})


def test_chakra_export_has_one_node_per_op_with_stream_and_cross_stream_dependencies(tmp_path):
    layout = Layout(world_size=16, tp=2, pp=4)
    expanded = ExpandedGraph(layout_pipeline_graph(layout, SPEC), LayoutWorld(layout))
    paths = export_chakra(expanded, str(tmp_path), [2])
    assert [p.rsplit("/", 1)[1] for p in paths] == ["chakra.2.json", "comm_groups.json"]
    with open(paths[0], encoding="utf-8") as f:
        trace = json.load(f)
    with open(paths[1], encoding="utf-8") as f:
        groups = json.load(f)
    nodes = trace["nodes"]
    streams = expanded.streams(2)
    assert len(nodes) == sum(len(ops) for ops in streams.values())
    assert {n["type"] for n in nodes} == {"COMP_NODE", "COMM_COLL_NODE", "COMM_SEND_NODE", "COMM_RECV_NODE"}
    attrs = [{a["name"]: next(v for k, v in a.items() if k != "name") for a in n["attr"]} for n in nodes]
    sends = [(n, a) for n, a in zip(nodes, attrs, strict=True) if n["type"] == "COMM_SEND_NODE"]
    assert layout.group("pp", 2)[0] == 2  # stage 0: it sends forward only
    assert all(a["comm_src"] == 2 and a["comm_dst"] == layout.group("pp", 2)[1] for _, a in sends)
    # each send waits for the op that ends its forward chunk: the chunk's last TP all-reduce
    assert all(
        len(n["data_deps"]) == 1 and nodes[n["data_deps"][0]]["type"] == "COMM_COLL_NODE" for n, _ in sends
    )
    first_of_stream = [n for n, a in zip(nodes, attrs, strict=True) if not n["ctrl_deps"]]
    assert len(first_of_stream) == len(streams)
    all_reduces = [a for n, a in zip(nodes, attrs, strict=True) if a.get("comm_type") == 0]
    assert {
        groups[a["pg_name"]] == list(layout.group("tp", 2)) for a in all_reduces if a["comm_size"] == 128
    } == {True}
