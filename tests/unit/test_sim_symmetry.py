"""One node per role predicts what every rank does, over Megatron layouts of every kind."""

import pytest

from prism_megatron.graph.world import LayoutWorld
from prism_megatron.sim import AlphaBetaCost, PipelineSpec, layout_pipeline_graph, replay_schedules, simulate
from prism_megatron.topology import Layout

LAYOUTS = [
    dict(world_size=64, tp=2, pp=4, cp=2),
    dict(world_size=64, tp=1, pp=2, ep=8),
    dict(world_size=96, tp=2, pp=3, vpp=2),
    dict(world_size=64, tp=2, pp=4, order="tp-cp-ep-pp-dp"),
    dict(world_size=128, tp=2, pp=4, ep=4, etp=1),
    dict(world_size=32, tp=4, pp=8),
]


@pytest.mark.parametrize("kwargs", LAYOUTS, ids=lambda kw: ",".join(f"{k}={v}" for k, v in kw.items()))
def test_symmetric_simulation_gives_every_rank_its_full_simulation_timeline(kwargs):
    layout = Layout(**kwargs)
    world = LayoutWorld(layout)
    vpp = layout.vpp or 1
    spec = PipelineSpec(
        num_microbatches=2 * layout.pp if vpp > 1 else 5,
        vpp=vpp,
        fwd_ns=1000 * vpp,
        bwd_ns=2000 * vpp,
        activation_bytes=4096,
        tp_allreduce_bytes=1 << 16,
        dp_grad_bytes=1 << 20,
        expert_ns=300 if layout.ep > 1 else 0,
        all_to_all_bytes=4096,
    )
    graph = layout_pipeline_graph(layout, spec)
    cost = AlphaBetaCost(latency_ns=700, ns_per_byte=0.02)
    symmetric = simulate(graph, world, cost)
    full = simulate(graph, world, cost, symmetric=False)
    assert symmetric.problem.num_nodes == len(world.roles()) < full.problem.num_nodes == layout.world_size
    assert symmetric.iteration_time_ns == full.iteration_time_ns
    for rank in range(layout.world_size):
        for a, b in zip(symmetric.times(rank), full.times(rank), strict=True):
            assert (a == b).all()
    real = layout.default_slice()[:3]
    assert replay_schedules(symmetric, real) == replay_schedules(full, real)
