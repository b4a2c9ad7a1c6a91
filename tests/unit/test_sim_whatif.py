"""What-ifs: a straggler, a slow NIC, expert imbalance, and when they keep one node per role."""

import pytest

from prism_megatron.graph.world import LayoutWorld
from prism_megatron.sim import (
    AlphaBetaCost,
    PipelineSpec,
    WhatIf,
    layout_pipeline_graph,
    parse_rank_factors,
    simulate,
)
from prism_megatron.topology import Layout

COST = AlphaBetaCost(latency_ns=1000, ns_per_byte=0.01)
MOE = PipelineSpec(
    num_microbatches=4,
    fwd_ns=1_000_000,
    bwd_ns=2_000_000,
    expert_ns=500_000,
    all_to_all_bytes=1 << 20,
    tp_allreduce_bytes=1 << 20,
    activation_bytes=1 << 20,
    dp_grad_bytes=1 << 24,
)


@pytest.fixture(scope="module")
def moe():
    layout = Layout(world_size=64, tp=2, pp=2, ep=4)
    return layout, layout_pipeline_graph(layout, MOE), LayoutWorld(layout)


def _same_timelines(a, b, world_size):
    return all((x == y).all() for r in range(world_size) for x, y in zip(a.times(r), b.times(r), strict=True))


def test_expert_imbalance_slows_the_hot_shards_expert_compute_and_keeps_one_node_per_role(moe):
    layout, graph, world = moe
    hot = [r for r in range(64) if layout.coords(r).ep == 1]
    what_if = WhatIf(expert_slowdowns=dict.fromkeys(hot, 2.0))
    symmetric = simulate(graph, world, COST, what_if)
    full = simulate(graph, world, COST, what_if, symmetric=False)
    assert symmetric.problem.symmetric and symmetric.problem.num_nodes == len(world.roles())
    assert _same_timelines(symmetric, full, 64)
    expert = [t for t in symmetric.timeline(hot[0]) if t.op.name == "expert"]
    cold = [t for t in symmetric.timeline(0) if t.op.name == "expert"]
    assert [t.end_ns - t.start_ns for t in expert] == [2 * (t.end_ns - t.start_ns) for t in cold]
    assert symmetric.iteration_time_ns > simulate(graph, world, COST).iteration_time_ns


def test_a_straggler_role_wide_stays_symmetric_and_one_rank_does_not(moe):
    layout, graph, world = moe
    role = layout.role_of(5)
    whole_role = WhatIf(stragglers=dict.fromkeys(layout.role_members(role), 1.5))
    assert simulate(graph, world, COST, whole_role).problem.symmetric
    assert not simulate(graph, world, COST, WhatIf(stragglers={5: 1.5})).problem.symmetric
    with pytest.raises(ValueError, match=r"makes ranks of one role differ"):
        simulate(graph, world, COST, WhatIf(stragglers={5: 1.5}), symmetric=True)


def test_a_slow_nic_slows_every_op_its_rank_takes_part_in(moe):
    _, graph, world = moe
    base = simulate(graph, world, COST, symmetric=False)
    slow = simulate(graph, world, COST, WhatIf(slow_nics={5: 3.0}))
    communication = [
        t for t in zip(slow.timeline(5), base.timeline(5), strict=True) if t[0].op.type.name != "COMPUTE"
    ]
    assert len(communication) > 20
    for with_slow_nic, without in communication:
        transfer = with_slow_nic.end_ns - with_slow_nic.ready_ns
        assert transfer == pytest.approx(3 * (without.end_ns - without.ready_ns), abs=1)


@pytest.mark.parametrize(
    ("values", "message"),
    [
        (["5"], "expected RANK:FACTOR"),
        (["x:2"], "expected RANK:FACTOR"),
        (["5:0"], "the factor must be a number from 0.001 to 1000"),
        (["5:1e308"], "from 0.001 to 1000 .*got 1e\\+308"),  # answered -1.9e14 ms with exit 0
        (["5:1e12"], "got 1e\\+12"),  # overflowed int64 nanoseconds
        (["5:inf"], "got inf"),
        (["-1:2"], "the rank must be >= 0"),
    ],
)
def test_rank_factor_flags_name_themselves_when_malformed(values, message):
    with pytest.raises(ValueError, match=f"--straggler .*{message}"):
        parse_rank_factors(values, "--straggler")


def test_what_ifs_reject_ranks_outside_the_world_and_bad_factors(moe):
    _, graph, world = moe
    with pytest.raises(ValueError, match="outside the world"):
        simulate(graph, world, COST, WhatIf(stragglers={64: 2.0}))
    with pytest.raises(ValueError, match=r"must be from 0\.001 to 1000"):
        WhatIf(slow_nics={1: 0.0})
    with pytest.raises(ValueError, match=r"must be from 0\.001 to 1000, got 1e\+308"):
        WhatIf(stragglers={1: 1e308})


def _one_stage_graph(overhead_ns: int):
    from prism_megatron.graph import COMPUTE_STREAM, ExecutionGraph, GraphMetadata, NodeType, Op, RoleGraph

    layout = Layout(world_size=2, tp=1, pp=1)
    op = Op(type=NodeType.COMPUTE, name="compute", duration_ns=10_000_000, overhead_ns=overhead_ns)
    roles = {name: RoleGraph(name, {COMPUTE_STREAM: (op,)}) for name in LayoutWorld(layout).roles()}
    return ExecutionGraph(GraphMetadata(layout=layout.kwargs()), roles), LayoutWorld(layout)


@pytest.mark.parametrize("core", ["native", "reference"])
def test_a_straggler_stretches_device_work_and_not_the_host_overhead_around_it(core):
    from prism_megatron.sim import reference_core

    run_core = reference_core if core == "reference" else None
    graph, world = _one_stage_graph(overhead_ns=2_000_000)
    slow = simulate(graph, world, COST, WhatIf(stragglers={1: 1.5}), core=run_core)
    # 2 ms of host overhead as captured, 8 ms of work 1.5 times longer: 14 ms, not 15 ms.
    assert (slow.finish_ns(0), slow.finish_ns(1)) == (10_000_000, 14_000_000)
    graph, world = _one_stage_graph(overhead_ns=0)
    assert simulate(graph, world, COST, WhatIf(stragglers={1: 1.5}), core=run_core).finish_ns(1) == 15_000_000
