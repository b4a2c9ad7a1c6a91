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
    assert factor(OpKind.ALL_REDUCE, 2, 1.0) == 1.0
    assert factor(OpKind.ALL_REDUCE, 2, 3.0) == pytest.approx(1.75)
    assert factor(OpKind.ALL_REDUCE, 2, 64.0) == 2.0  # flat beyond the last measured count
    assert factor(OpKind.REDUCE_SCATTER, 8, 2.0) == 1.5  # no table of its own: the all-reduce's
    assert MeasuredCost(ALONE).concurrency_factor is None
