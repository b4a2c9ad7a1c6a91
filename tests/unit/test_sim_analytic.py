"""The simulator against cases whose answer is known in closed form."""

import pytest

from prism_megatron.graph.printable import parse_op
from prism_megatron.graph.schema import COMPUTE_STREAM, ExecutionGraph, GraphMetadata, RoleGraph
from prism_megatron.graph.world import ExplicitWorld
from prism_megatron.sim.cost import AlphaBetaCost
from prism_megatron.sim.engine import reference_core, simulate
from prism_megatron.sim.synthetic import PipelineSpec, pipeline_graph
from prism_megatron.sim.whatif import WhatIf

FREE = AlphaBetaCost()  # communication costs nothing: only the schedule shapes the time


def _pipeline(pp, spec, dp=1):
    """PP stages x DP replicas, rank = stage + pp * replica; one role per stage."""
    role_of_rank = [f"stage{r % pp}" for r in range(pp * dp)]
    groups = {
        "pp": [tuple(range(d * pp, (d + 1) * pp)) for d in range(dp)],
        "dp": [tuple(s + pp * d for d in range(dp)) for s in range(pp)],
        "tp": [(r,) for r in range(pp * dp)],
    }
    graph = pipeline_graph({f"stage{s}": s for s in range(pp)}, pp, spec)
    return graph, ExplicitWorld(role_of_rank, groups)


@pytest.mark.parametrize(
    ("pp", "m", "t_f", "t_b"),
    [
        (1, 4, 1000, 2000),
        (2, 3, 1000, 2000),
        (4, 8, 1000, 2000),
        (4, 8, 1300, 1300),
        (8, 32, 700, 2100),
        (4, 2, 1000, 3000),
    ],
)
def test_1f1b_takes_m_plus_p_minus_1_times_a_forward_and_a_backward(pp, m, t_f, t_b):
    graph, world = _pipeline(pp, PipelineSpec(num_microbatches=m, fwd_ns=t_f, bwd_ns=t_b))
    assert simulate(graph, world, FREE).iteration_time_ns == (m + pp - 1) * (t_f + t_b)


@pytest.mark.parametrize(
    ("pp", "m", "vpp"), [(4, 8, 2), (4, 8, 4), (3, 6, 2), (8, 16, 2), (4, 4, 2), (4, 12, 3)]
)
def test_interleaved_1f1b_shrinks_the_bubble_by_the_number_of_model_chunks(pp, m, vpp):
    # Megatron-LM paper (Narayanan et al., 2021): bubble = (p - 1)(t_f + t_b) / v, with t_f and
    # t_b the time of one microbatch through all of a stage's chunks.
    t_f, t_b = 1000 * vpp, 2000 * vpp
    graph, world = _pipeline(pp, PipelineSpec(num_microbatches=m, fwd_ns=t_f, bwd_ns=t_b, vpp=vpp))
    expected = m * (t_f + t_b) + (pp - 1) * (t_f + t_b) // vpp
    assert simulate(graph, world, FREE).iteration_time_ns == expected


def _graph(roles):
    return ExecutionGraph(
        GraphMetadata(layout={}),
        {
            name: RoleGraph(name, {k: tuple(parse_op(t) for t in v) for k, v in streams.items()})
            for name, streams in roles.items()
        },
    )


def test_a_data_parallel_collective_completes_at_the_last_arrival_plus_its_cost():
    cost = AlphaBetaCost(latency_ns=1000, ns_per_byte=0.5)
    roles = {f"r{i}": {COMPUTE_STREAM: [f"c:fwd {d}us", "AR dp#0 4KiB"]} for i, d in enumerate([3, 9, 5, 1])}
    world = ExplicitWorld([f"r{i}" for i in range(4)], {"dp": [(0, 1, 2, 3)]})
    result = simulate(_graph(roles), world, cost)
    expected_cost = 2 * 3 * (1000 + 4096 / 4 * 0.5)  # ring all-reduce over 4 members
    for rank in range(4):
        collective = result.timeline(rank)[1]
        assert collective.ready_ns == 9000
        assert collective.end_ns == 9000 + expected_cost
    assert result.iteration_time_ns == 9000 + expected_cost


def test_a_send_completes_when_the_matching_receive_is_posted_plus_the_transfer():
    cost = AlphaBetaCost(latency_ns=100, ns_per_byte=1)
    roles = {"a": {COMPUTE_STREAM: ["S→pp+1#0 1KiB"]}, "b": {COMPUTE_STREAM: ["c:work 5us", "R←pp-1#0 1KiB"]}}
    world = ExplicitWorld(["a", "b"], {"pp": [(0, 1)]})
    result = simulate(_graph(roles), world, cost)
    (send,) = result.timeline(0)
    assert (send.start_ns, send.ready_ns, send.end_ns) == (0, 5000, 5000 + 100 + 1024)
    assert result.timeline(1)[1].end_ns == send.end_ns


def test_streams_overlap_and_a_wait_joins_them():
    cost = AlphaBetaCost(latency_ns=0, ns_per_byte=1)
    roles = {
        f"r{i}": {
            COMPUTE_STREAM: ["c:bwd 10us", "c:more 500ns", "w <comm:1", "c:opt 1us"],
            # two coalesced reduce-scatters start when bwd is done and end together
            "comm": ["RS dp#0 2KiB <compute:0 &", "RS dp#1 2KiB"],
        }
        for i in range(2)
    }
    world = ExplicitWorld(["r0", "r1"], {"dp": [(0, 1)]})
    timeline = simulate(_graph(roles), world, cost).timeline(0)
    rs_cost = 1 * 2048 / 2
    assert [t.end_ns for t in timeline[:2]] == [10_000, 10_500]  # compute runs on, unblocked
    assert [t.start_ns for t in timeline[4:]] == [10_000, 10_000]  # one coalesced batch
    assert [t.end_ns for t in timeline[4:]] == [10_000 + rs_cost] * 2
    assert (timeline[2].start_ns, timeline[2].end_ns) == (10_500, 10_000 + rs_cost)  # the wait waits
    assert timeline[3].end_ns == 10_000 + rs_cost + 1000


def test_a_straggler_delays_exactly_the_ranks_that_depend_on_it():
    spec = PipelineSpec(num_microbatches=4, fwd_ns=1000, bwd_ns=2000)
    graph, world = _pipeline(2, spec, dp=2)  # pipelines {0, 1} and {2, 3}, no DP collective
    base = simulate(graph, world, FREE, symmetric=False)
    slow = simulate(graph, world, FREE, WhatIf(stragglers={0: 2.0}))
    assert slow.finish_ns(0) > base.finish_ns(0) and slow.finish_ns(1) > base.finish_ns(1)
    for rank in (2, 3):  # the other pipeline never waits for rank 0
        for a, b in zip(slow.times(rank), base.times(rank), strict=True):
            assert (a == b).all()


def test_a_straggler_reaches_the_other_replica_only_through_the_data_parallel_collective():
    spec = PipelineSpec(num_microbatches=4, fwd_ns=1000, bwd_ns=2000, dp_grad_bytes=1024, grad_norm=False)
    graph, world = _pipeline(2, spec, dp=2)
    base = simulate(graph, world, FREE, symmetric=False)
    slow = simulate(graph, world, FREE, WhatIf(stragglers={0: 2.0}))
    other = next(i for i, (_, _, op) in enumerate(slow.problem.role_ops[0]) if op.name == "grads")
    assert (slow.times(2)[2][:other] == base.times(2)[2][:other]).all()
    assert slow.times(2)[2][other] > base.times(2)[2][other]


def test_symmetric_and_full_simulation_agree_when_nothing_is_injected():
    spec = PipelineSpec(
        num_microbatches=6,
        fwd_ns=1000,
        bwd_ns=2500,
        activation_bytes=4096,
        tp_allreduce_bytes=8192,
        dp_grad_bytes=1 << 20,
        optimizer_ns=700,
    )
    graph, world = _pipeline(3, spec, dp=2)
    cost = AlphaBetaCost(latency_ns=300, ns_per_byte=0.01)
    symmetric = simulate(graph, world, cost)
    full = simulate(graph, world, cost, symmetric=False)
    assert symmetric.problem.num_nodes == 3 and full.problem.num_nodes == 6
    assert symmetric.iteration_time_ns == full.iteration_time_ns
    for rank in range(6):
        for a, b in zip(symmetric.times(rank), full.times(rank), strict=True):
            assert (a == b).all()


def test_the_python_reference_gives_the_same_timelines():
    spec = PipelineSpec(
        num_microbatches=4, fwd_ns=1000, bwd_ns=2000, activation_bytes=100, dp_grad_bytes=4096
    )
    graph, world = _pipeline(3, spec, dp=2)
    cost = AlphaBetaCost(latency_ns=50, ns_per_byte=0.3)
    what_if = WhatIf(stragglers={1: 1.37}, slow_nics={4: 2.5})
    native = simulate(graph, world, cost, what_if)
    python = simulate(graph, world, cost, what_if, core=reference_core)
    assert native.iteration_time_ns == python.iteration_time_ns
    for name in ("start_ns", "ready_ns", "end_ns"):
        assert (getattr(native, name) == getattr(python, name)).all()
