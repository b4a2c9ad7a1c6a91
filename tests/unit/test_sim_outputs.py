"""What a simulation hands on: replay schedules, the per-role breakdown, the timeline."""

import dataclasses
import json

import pytest

from prism_megatron.graph.world import LayoutWorld
from prism_megatron.replay.schedule import OpKind, ReplaySchedule
from prism_megatron.report.trace import write_chrome_trace
from prism_megatron.sim import (
    AlphaBetaCost,
    PipelineSpec,
    WhatIf,
    breakdown,
    layout_pipeline_graph,
    replay_schedules,
    simulate,
)
from prism_megatron.sim.timeline import default_ranks, process_names, spans
from prism_megatron.topology import Layout

SPEC = PipelineSpec(
    num_microbatches=4,
    fwd_ns=100_000,
    bwd_ns=200_000,
    activation_bytes=1 << 20,
    tp_allreduce_bytes=1 << 20,
    dp_grad_bytes=1 << 24,
    optimizer_ns=30_000,
)
COST = AlphaBetaCost(latency_ns=2000, ns_per_byte=0.01)


@pytest.fixture(scope="module")
def job():
    layout = Layout(world_size=32, tp=2, pp=4)  # DP 4
    return layout_pipeline_graph(layout, SPEC), LayoutWorld(layout)


def test_a_schedule_gives_the_latest_virtual_arrival_and_the_cost_of_each_op(job):
    graph, world = job
    result = simulate(graph, world, COST, symmetric=False)
    real = [0, 2]  # two members of one DP group are real
    schedule = replay_schedules(result, real)[0]
    dp_members = world.group("dp", 0)
    assert dp_members == (0, 2, 4, 6)
    grads_rs, params_ag = schedule.collectives[dp_members]
    assert [grads_rs.kind, params_ag.kind] == [OpKind.REDUCE_SCATTER, OpKind.ALL_GATHER]
    ops_of = {rank: {t.op.name: t for t in result.timeline(rank)} for rank in dp_members}
    assert grads_rs.arrival_offset_ns == max(ops_of[r]["grads"].start_ns for r in (4, 6))  # virtual only
    assert grads_rs.cost_ns == ops_of[0]["grads"].end_ns - ops_of[0]["grads"].ready_ns
    assert grads_rs.cost_ns == round(COST(OpKind.REDUCE_SCATTER, dp_members, 1 << 24))
    # p2p: rank 0 sends activations to its next stage (rank 8), which is virtual
    sends = schedule.p2p[(8, "send")]
    assert len(sends) == SPEC.num_microbatches
    receives_of_8 = [
        t for t in result.timeline(8) if t.op.name == "" and t.op.type.name == "RECV" and t.op.offset == -1
    ]
    assert [s.arrival_offset_ns for s in sends] == [t.start_ns for t in receives_of_8]


def test_groups_whose_members_are_all_real_are_left_to_the_real_ranks(job):
    graph, world = job
    result = simulate(graph, world, COST)
    schedule = replay_schedules(result, [0, 1])[0]
    assert world.group("tp", 0) == (0, 1)
    assert (0, 1) not in schedule.collectives  # the TP group is all real
    assert world.group("dp", 0) in schedule.collectives


def test_symmetric_and_full_simulations_write_the_same_schedules(job, tmp_path):
    graph, world = job
    real = [0, 9, 31]
    symmetric = replay_schedules(simulate(graph, world, COST), real)
    full = replay_schedules(simulate(graph, world, COST, symmetric=False), real)
    assert symmetric == full
    path = str(tmp_path / "schedule.json")
    symmetric[9].save(path)
    assert ReplaySchedule.load(path) == symmetric[9]


def test_the_breakdown_adds_up_to_the_iteration_time(job):
    graph, world = job
    result = simulate(graph, world, COST, WhatIf(stragglers={10: 1.5}))  # not a representative
    rows = breakdown(result)
    assert [r.role for r in rows] == list(world.roles())
    assert sum(r.num_ranks for r in rows) == 32
    for row in rows:
        assert row.compute_ns + row.exposed_comm_ns + row.bubble_ns == result.iteration_time_ns
        assert row.compute_ns == SPEC.num_microbatches * (SPEC.fwd_ns + SPEC.bwd_ns) + SPEC.optimizer_ns
        assert min(row.exposed_comm_ns, row.bubble_ns) > 0


def test_with_free_communication_every_stage_idles_for_the_1f1b_bubble_and_nothing_is_exposed(job):
    graph, world = job
    for row in breakdown(simulate(graph, world, AlphaBetaCost())):
        assert row.exposed_comm_ns == 0
        assert row.bubble_ns == (4 - 1) * (SPEC.fwd_ns + SPEC.bwd_ns)


def test_the_timeline_is_a_perfetto_trace_of_every_op_of_the_chosen_ranks(job, tmp_path):
    graph, world = job
    result = simulate(graph, world, COST)
    ranks = default_ranks(result, extra=[5])
    assert ranks == sorted({world.representative(r) for r in world.roles()} | {5})
    path = write_chrome_trace(
        str(tmp_path / "timeline.json"), spans(result, ranks), process_names(result, ranks)
    )
    with open(path, encoding="utf-8") as f:
        trace = json.load(f)
    complete = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert len(complete) == sum(len(result.timeline(r)) for r in ranks)
    assert {e["pid"] for e in complete} == set(ranks)
    names = {e["args"]["name"] for e in trace["traceEvents"] if e["name"] == "process_name"}
    assert "rank 5 (pp0)" in names
    last = max(e["ts"] + e["dur"] for e in complete)
    assert last == pytest.approx(result.iteration_time_ns / 1000)


def test_measured_compute_durations_fold_into_a_new_simulation_without_rebuilding(job):
    from prism_megatron.sim.engine import run_problem
    from prism_megatron.sim.problem import build_problem

    graph, world = job
    problem = build_problem(graph, world, COST)
    measured = {
        name: [2 * op.duration_ns for _, _, op in problem.role_ops[i] if op.type.name == "COMPUTE"]
        for i, name in enumerate(problem.role_names)
    }
    slower = run_problem(problem.with_compute_durations(measured))
    doubled = PipelineSpec(
        **{
            **SPEC.__dict__,
            "fwd_ns": 2 * SPEC.fwd_ns,
            "bwd_ns": 2 * SPEC.bwd_ns,
            "optimizer_ns": 2 * SPEC.optimizer_ns,
        }
    )
    assert (
        slower.iteration_time_ns
        == simulate(
            layout_pipeline_graph(Layout(world_size=32, tp=2, pp=4), doubled), world, COST
        ).iteration_time_ns
    )
    assert run_problem(problem).iteration_time_ns < slower.iteration_time_ns  # the original is untouched
    with pytest.raises(ValueError, match="compute ops, got 1 durations"):
        problem.with_compute_durations({"pp1": [5]})


def _overlapped_pipeline(graph):
    """The graph with every pipeline transfer posted on a side stream and waited where it was (as the
    capture keeps megatron-core's overlapped p2p); one WAIT for each transfer, so indices hold."""
    from prism_megatron.graph.schema import COMPUTE_STREAM, Dep, NodeType, Op

    roles = {}
    for name, role in graph.roles.items():
        compute, side = [], {}
        for i, op in enumerate(role.streams[COMPUTE_STREAM]):
            if op.type not in (NodeType.SEND, NodeType.RECV):
                compute.append(op)
                continue
            stream = f"async-p2p-{op.type.name.lower()}-pp{op.offset:+d}"
            posted = side.setdefault(stream, [])
            deps = (Dep(COMPUTE_STREAM, i - 1),) if i else ()
            posted.append(dataclasses.replace(op, coalesced=False, deps=deps))
            compute.append(Op(type=NodeType.WAIT, deps=(Dep(stream, len(posted) - 1),)))
        streams = {
            COMPUTE_STREAM: tuple(compute),
            **{k: v for k, v in role.streams.items() if k != COMPUTE_STREAM},
        }
        roles[name] = dataclasses.replace(role, streams={**streams, **{k: tuple(v) for k, v in side.items()}})
    return dataclasses.replace(graph, roles=roles)


def test_a_wait_for_an_overlapped_pipeline_transfer_is_bubble_until_the_peer_is_there(job):
    """The same 1F1B schedule with its transfers on side streams: with free communication every stage
    still idles for the bubble, none of it exposed communication."""
    graph, world = job
    overlapped = _overlapped_pipeline(graph)
    for row in breakdown(simulate(overlapped, world, AlphaBetaCost())):
        assert row.exposed_comm_ns == 0
        assert row.bubble_ns == (4 - 1) * (SPEC.fwd_ns + SPEC.bwd_ns)
