"""The concurrency term: an op's cost follows how many groups communicate when it runs.

Two TP pairs (ranks 0-1 and 2-3) each compute 1 ms, all-reduce 1 KiB and compute 1 ms. In step,
the two all-reduces overlap (two groups at once); with the second pair three times slower, they
do not. The measured table: 100 us alone, 1.5 times that with two groups at once.
"""

from __future__ import annotations

import pytest

from prism_megatron.graph import (
    COMPUTE_STREAM,
    ExecutionGraph,
    GraphMetadata,
    LayoutWorld,
    NodeType,
    Op,
    RoleGraph,
)
from prism_megatron.network.measured import MeasuredCost
from prism_megatron.replay import OpKind
from prism_megatron.sim import WhatIf, reference_core, simulate
from prism_megatron.topology import Layout

ALONE = {(OpKind.ALL_REDUCE, 2): ((4, 100_000.0),)}
CONCURRENT = MeasuredCost(ALONE, concurrency={(OpKind.ALL_REDUCE, 2): ((1.0, 1.0), (2.0, 1.5), (4.0, 2.0))})
MS = 1_000_000


def _graph(offset_ns: int = 0):
    layout = Layout(world_size=4, tp=2, pp=1)
    world = LayoutWorld(layout)
    ops = (
        Op(type=NodeType.COMPUTE, name="fwd", duration_ns=MS),
        Op(type=NodeType.COLLECTIVE, comm=OpKind.ALL_REDUCE, group="tp", seq=0, size_bytes=1024),
        Op(type=NodeType.COMPUTE, name="bwd", duration_ns=MS),
    )
    roles = {name: RoleGraph(name, {COMPUTE_STREAM: ops}) for name in world.roles()}
    return ExecutionGraph(GraphMetadata(layout=layout.kwargs()), roles), world


def _all_reduce_costs(result) -> list[int]:
    return [result.timeline(r)[1].end_ns - result.timeline(r)[1].ready_ns for r in range(4)]


@pytest.mark.parametrize("core", [None, reference_core])
def test_overlapping_groups_pay_the_concurrency_factor(core):
    graph, world = _graph()
    result = simulate(graph, world, CONCURRENT, symmetric=False, core=core)
    assert _all_reduce_costs(result) == [150_000] * 4
    assert result.iteration_time_ns == 2 * MS + 150_000
    assert (result.num_rounds, result.converged) == (2, True)
    symmetric = simulate(graph, world, CONCURRENT, core=core)
    assert symmetric.problem.symmetric and symmetric.iteration_time_ns == 2 * MS + 150_000


@pytest.mark.parametrize("core", [None, reference_core])
def test_groups_out_of_step_pay_their_cost_alone(core):
    graph, world = _graph()
    result = simulate(graph, world, CONCURRENT, WhatIf(stragglers={2: 3.0, 3: 3.0}), core=core)
    assert _all_reduce_costs(result) == [100_000] * 4
    assert result.finish_ns(0) == 2 * MS + 100_000 and result.finish_ns(2) == 6 * MS + 100_000
    assert result.num_rounds == 1


def test_without_a_concurrency_table_every_op_costs_what_it_costs_alone():
    graph, world = _graph()
    result = simulate(graph, world, MeasuredCost(ALONE), symmetric=False)
    assert _all_reduce_costs(result) == [100_000] * 4 and result.num_rounds == 1


def test_a_factor_needs_other_groups_and_interpolates_between_measured_counts():
    factor = CONCURRENT.concurrency_factor
    assert factor(OpKind.ALL_REDUCE, (0, 1), 1024, 1.0) == 1.0
    assert factor(OpKind.ALL_REDUCE, (0, 1), 1024, 3.0) == pytest.approx(1.75)
    assert factor(OpKind.ALL_REDUCE, (0, 1), 1024, 64.0) == 2.0  # flat beyond the last measured count
    assert factor(OpKind.REDUCE_SCATTER, tuple(range(8)), 8, 2.0) == 1.5  # the all-reduce's table
    assert MeasuredCost(ALONE).concurrency_factor is None


def _nccl(nics_per_node: int):
    from prism_megatron.network import ClusterSpec, CostModel, IntraNodeFabric, NetworkFabric, Topology
    from prism_megatron.sim import NetworkCost

    spec = ClusterSpec(
        name=f"{nics_per_node}-nics",
        gpus_per_node=4,
        base_latency_us=6.6,
        intra_node=IntraNodeFabric(
            nvlink_bandwidth_gb_per_s=100.0, nvlink_efficiency=1.0, step_latency_us=3.4
        ),
        network=NetworkFabric(
            nics_per_node=nics_per_node, nic_bandwidth_gb_per_s=10.0, nic_efficiency=1.0, step_latency_us=14.0
        ),
        topology=Topology(nodes_per_leaf=2, spine_latency_us=0.5),
    )
    return NetworkCost(CostModel(spec))


def _cross_node_pairs():
    """Four DP pairs across two nodes of 4 GPUs (W = 8, TP 4: ranks 0-4, 1-5, 2-6, 3-7), 16 MiB each."""
    layout = Layout(world_size=8, tp=4, pp=1)
    world = LayoutWorld(layout)
    ops = (
        Op(type=NodeType.COMPUTE, name="fwd", duration_ns=MS),
        Op(type=NodeType.COLLECTIVE, comm=OpKind.ALL_REDUCE, group="dp", seq=0, size_bytes=16 << 20),
    )
    roles = {name: RoleGraph(name, {COMPUTE_STREAM: ops}) for name in world.roles()}
    return ExecutionGraph(GraphMetadata(layout=layout.kwargs()), roles), world


def _dp_costs(result) -> list[int]:
    return [result.timeline(r)[1].end_ns - result.timeline(r)[1].ready_ns for r in range(4)]


def test_nccl_rings_that_share_a_nodes_nic_pay_for_it_and_rings_on_their_own_nics_do_not():
    graph, world = _cross_node_pairs()
    assert world.group("dp", 1) == (1, 5)
    one_nic, own_nics = _nccl(nics_per_node=1), _nccl(nics_per_node=4)
    alone = one_nic(OpKind.ALL_REDUCE, (0, 4), 16 << 20)
    assert alone == own_nics(OpKind.ALL_REDUCE, (0, 4), 16 << 20), "alone, one NIC serves a ring as four do"
    in_step = simulate(graph, world, one_nic, symmetric=False)
    expected = round(round(alone) * one_nic.concurrency_factor(OpKind.ALL_REDUCE, (0, 4), 16 << 20, 4.0))
    assert _dp_costs(in_step) == [expected] * 4 and expected > 3 * alone  # four rings on one NIC
    on_own = simulate(graph, world, own_nics, symmetric=False)
    assert _dp_costs(on_own) == [round(alone)] * 4 and own_nics.concurrency_factor is None
    slow = {rank: 1.0 + 2 * rank for rank in range(1, 4)} | {rank + 4: 1.0 + 2 * rank for rank in range(1, 4)}
    apart = simulate(graph, world, one_nic, WhatIf(stragglers=slow), symmetric=False)
    assert _dp_costs(apart) == [round(alone)] * 4, "out of step, each ring has the NIC to itself"
    assert one_nic.concurrency_factor(OpKind.SEND, (0, 4), 16 << 20, 2.0) == pytest.approx(2.0, rel=0.05)
