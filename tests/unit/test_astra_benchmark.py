"""The ASTRA-sim benchmark's own parts: the DDP variant of the graph and the reading of ASTRA-sim's output.

ASTRA-sim itself is not built here (benchmarks/astra/README.md); these check what the benchmark
does around it, against the line formats of ASTRA-sim's sources (workload/Workload.cc).
"""

from benchmarks.astra.run import (
    _EVENT,
    _FINISHED,
    LAYOUT,
    SPEC,
    collective_key,
    node_keys,
    without_distributed_optimizer,
)
from prism_megatron.graph import ExpandedGraph
from prism_megatron.graph.chakra import export_chakra
from prism_megatron.graph.chakra.stream import read_trace
from prism_megatron.graph.schema import COMPUTE_STREAM
from prism_megatron.graph.world import LayoutWorld
from prism_megatron.replay.schedule import OpKind
from prism_megatron.sim import layout_pipeline_graph


def _dp_ops(graph):
    return [
        (op.comm, op.size_bytes)
        for op in graph.roles[next(iter(graph.roles))].streams[COMPUTE_STREAM]
        if op.group == "dp"
    ]


def test_without_the_distributed_optimizer_the_dp_phase_is_one_all_reduce_of_the_same_buffer():
    graph = layout_pipeline_graph(LAYOUT, SPEC)
    assert _dp_ops(graph) == [
        (OpKind.REDUCE_SCATTER, SPEC.dp_grad_bytes),
        (OpKind.ALL_GATHER, SPEC.dp_grad_bytes),
    ]
    ddp = without_distributed_optimizer(graph)
    assert _dp_ops(ddp) == [(OpKind.ALL_REDUCE, SPEC.dp_grad_bytes)]
    assert ddp.num_ops == graph.num_ops - len(graph.roles)


def test_astra_sims_log_lines_are_read_with_our_node_names(tmp_path):
    expanded = ExpandedGraph(layout_pipeline_graph(LAYOUT, SPEC), LayoutWorld(LAYOUT))
    export_chakra(expanded, str(tmp_path), [3])
    _, nodes = read_trace(str(tmp_path / "chakra.3.et"))
    keys = node_keys(expanded, 3)
    collectives = [n for n in nodes if n.type == 7]
    assert collectives and all(keys[n.id] is not None for n in collectives)
    assert sum(key is not None for key in keys.values()) == len(collectives)
    node = collectives[0]
    # Workload.cc: "issue,sys->id={}, tick={}, node->id={}, node->name={}, node->type={}"
    line = f"[2026-12-02T10:00:00+0000] [D] <workload>: issue,sys->id=3, tick=4250, node->id={node.id}, node->name={node.name}, node->type=7"
    assert _EVENT.findall(line) == [("issue", "3", "4250", str(node.id), node.name)]
    assert _FINISHED.findall("sys[15] finished, 72923184 cycles, exposed communication 11 cycles.") == [
        ("15", "72923184")
    ]
    assert keys[node.id] == collective_key(
        next(r.op for ops in expanded.streams(3).values() for r in ops if r.op.comm is not None)
    )
