"""Expansion of the role graph to every rank of the job (the Chakra export: test_chakra_export.py)."""

import tracemalloc

import pytest

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
