"""The closed loop: a real rank's measured compute re-times its virtual peers' next iteration.

On a synthetic 1F1B job at full scale (W=8192, TP8 PP8; `sim.layout_pipeline_graph`), with the
Megatron-shaped op set: TP all-reduces, pipeline p2p, DP gradient all-reduce, grad-norm reduction.
"""

from __future__ import annotations

import dataclasses

import pytest

from prism_megatron.graph import COMPUTE_STREAM, LayoutWorld, NodeType, save_graph
from prism_megatron.passes.closed_loop import ClosedLoop, load_or_build_graph, median_iteration
from prism_megatron.passes.schedule_index import ScheduleIndex
from prism_megatron.sim import (
    AlphaBetaCost,
    PipelineSpec,
    WhatIf,
    layout_pipeline_graph,
    replay_schedules,
    simulate,
)
from prism_megatron.topology import Layout

LAYOUT = Layout(world_size=8192, tp=8, pp=8)
WORLD = LayoutWorld(LAYOUT)
SPEC = PipelineSpec(
    num_microbatches=4, fwd_ns=1_000_000, bwd_ns=2_000_000, activation_bytes=1 << 20,
    tp_allreduce_bytes=1 << 20, dp_grad_bytes=64 << 20, optimizer_ns=500_000,
)  # fmt: skip
GRAPH = layout_pipeline_graph(LAYOUT, SPEC)
COST = AlphaBetaCost(latency_ns=5_000, ns_per_byte=0.01)
REAL = (0, 1024)


def slowed(streams, factor: float):
    """The role's streams with every compute span `factor` times longer: what a slow real rank measures."""
    return {
        name: tuple(
            dataclasses.replace(op, duration_ns=round(op.duration_ns * factor))
            if op.type == NodeType.COMPUTE
            else op
            for op in ops
        )
        for name, ops in streams.items()
    }


def test_the_fast_schedule_equals_replay_schedules_for_every_real_rank_and_what_if():
    for what_if in (None, WhatIf(stragglers={5: 1.5})):
        result = simulate(GRAPH, WORLD, COST, what_if)
        for rank in REAL:
            index = ScheduleIndex(result, rank, REAL)
            assert index.exact
            assert index.schedule(result) == replay_schedules(result, REAL)[rank]


def test_folding_a_slower_iteration_delays_the_virtual_peers_that_wait_for_this_rank():
    loop = ClosedLoop.start(GRAPH, WORLD, COST, virtual_rank=1024, real_ranks=REAL)
    before = loop.schedule()
    assert loop.fold(slowed(GRAPH.roles["pp1"].streams, 2.0)) is None
    after = loop.schedule()
    assert loop.iteration_time_ns > simulate(GRAPH, WORLD, COST).iteration_time_ns
    # The next stage (virtual rank 2048) now gets this rank's activations later, so it sends the
    # gradients back later: the recv from it is scheduled later.
    recv_before = before.p2p[(2048, "recv")]
    recv_after = after.p2p[(2048, "recv")]
    assert all(
        b.arrival_offset_ns > a.arrival_offset_ns for a, b in zip(recv_before, recv_after, strict=True)
    )
    # Its TP peers (same role) follow it: they reach the first TP all-reduce when it does.
    tp_group = LAYOUT.group("tp", 1024)
    own_first_tp = next(t for t in loop.result.timeline(1024) if t.op.group == "tp")
    assert after.collectives[tp_group][0].arrival_offset_ns == own_first_tp.start_ns
    assert own_first_tp.start_ns > before.collectives[tp_group][0].arrival_offset_ns


def test_the_loop_takes_the_median_of_the_last_measurements():
    loop = ClosedLoop.start(GRAPH, WORLD, COST, virtual_rank=0, real_ranks=REAL, window=3)
    streams = GRAPH.roles["pp0-tp0src"].streams
    for factor in (1.0, 1.0, 9.0):  # one noisy iteration
        loop.fold(slowed(streams, factor))
    assert loop.iteration_time_ns == simulate(GRAPH, WORLD, COST).iteration_time_ns
    assert loop.num_folded == 3


def test_the_spans_folded_are_one_measured_iteration_not_each_span_s_median():
    """Per-span medians ([2, 3] here) make an iteration quieter than any the rank ran; the loop takes
    the iteration whose total is the window's median (the later of two in an even window)."""
    assert median_iteration([[3, 1], [1, 3], [2, 4]]) == [1, 3]
    assert median_iteration([[5, 5], [1, 1]]) == [5, 5]
    assert median_iteration([[7, 7]]) == [7, 7]


def test_an_iteration_with_other_ops_than_the_graph_is_not_folded():
    loop = ClosedLoop.start(GRAPH, WORLD, COST, virtual_rank=0, real_ranks=REAL)
    streams = dict(GRAPH.roles["pp0-tp0src"].streams)
    streams[COMPUTE_STREAM] = streams[COMPUTE_STREAM][:-1]
    reason = loop.fold(streams)
    assert reason is not None and "differ" in reason
    assert loop.num_folded == 0


def test_a_graph_of_another_job_is_refused(tmp_path):
    save_graph(GRAPH, str(tmp_path))
    assert load_or_build_graph(str(tmp_path), LAYOUT) == GRAPH
    other = Layout(world_size=8192, tp=4, pp=8)
    with pytest.raises(ValueError, match="captured for another job: tp 8 in the graph, 4 here; etp 8 in"):
        load_or_build_graph(str(tmp_path), other)
    assert LAYOUT.kwargs()["tp"] == 8


def test_a_graph_with_mtp_is_refused_for_a_job_without_it_and_the_other_way_round():
    from prism_megatron.graph.schema import GraphMetadata

    plain = Layout(world_size=64, pp=4, untie_embeddings=True)
    with_mtp = Layout(world_size=64, pp=4, untie_embeddings=True, mtp=True)
    assert GraphMetadata(layout=with_mtp.kwargs()).mismatches(plain.kwargs()) == [
        "mtp True in the graph, not set here"
    ]
    assert GraphMetadata(layout=plain.kwargs()).mismatches(with_mtp.kwargs()) == [
        "mtp not set in the graph, True here"
    ]
    assert GraphMetadata(layout=plain.kwargs()).mismatches(plain.kwargs()) == []


def _async_iteration(complete_after_start_us: float):
    """One async TP all-reduce issued at 100 us whose peers arrive at 300 us (the schedule's)."""
    from prism_megatron.graph.capture import CapturedIteration
    from prism_megatron.replay import OpEvent, OpKind

    start_ns = 10**9
    event = OpEvent(OpKind.ALL_REDUCE, (0, 1), -1, 0, 1024, "Float", start_ns + 100_000, start_ns + 300_000,
                    start_ns + 300_000 + round(complete_after_start_us * 1000), True, True)  # fmt: skip
    return CapturedIteration(start_ns, start_ns + 5_000_000, (event,), ())


def test_a_wait_that_ended_at_the_scheduled_completion_is_not_measured_as_compute():
    from prism_megatron.graph.capture import GroupNames, compute_durations, iteration_streams
    from prism_megatron.passes.closed_loop import blocked_waits
    from prism_megatron.replay import OpKind, ReplaySchedule, ScheduledOp

    world = LayoutWorld(Layout(world_size=8, tp=2, pp=2))
    schedule = ReplaySchedule(0, {(0, 1): (ScheduledOp(OpKind.ALL_REDUCE, 1024, 200_000, 10_000),)}, {})
    for after_us, blocked in ((10 + 30, True), (2_000, False)):
        iteration = _async_iteration(after_us)
        posted: dict = {}
        streams = iteration_streams(iteration, GroupNames(world, 0), posted=posted)
        # compute ops: [0] before the post, [1] from the post to the wait, [2] after the wait
        assert blocked_waits(iteration, streams, posted, schedule) == ({1} if blocked else set())
    # Where the backend recorded the program's wait, the span before it ends there: nothing to keep.
    iteration = _async_iteration(10 + 30)
    waited = dataclasses.replace(iteration.events[0], wait_ns=iteration.start_ns + 150_000)
    iteration = dataclasses.replace(iteration, events=(waited,))
    posted = {}
    streams = iteration_streams(iteration, GroupNames(world, 0), posted=posted)
    assert blocked_waits(iteration, streams, posted, schedule) == set()
    assert compute_durations(streams)[1] == 50_000  # from the post at 100 us to the wait at 150 us


def test_kept_spans_stay_at_the_value_the_simulation_used():
    loop = ClosedLoop.start(GRAPH, WORLD, COST, virtual_rank=0, real_ranks=REAL)
    streams = GRAPH.roles["pp0-tp0src"].streams
    before = list(loop.current)
    loop.fold(slowed(streams, 3.0), keep={0, 1})
    assert loop.current[:2] == before[:2]
    assert loop.current[2] == 3 * before[2]


def test_what_the_other_real_ranks_measured_is_folded_for_their_roles():
    from prism_megatron.graph.capture import compute_durations

    loop = ClosedLoop.start(GRAPH, WORLD, COST, virtual_rank=0, real_ranks=REAL)
    own = GRAPH.roles["pp0-tp0src"].streams
    slower_pp1 = [3 * d for d in compute_durations(GRAPH.roles["pp1"].streams)]
    loop.fold(own, others={"pp1": slower_pp1, "pp0-tp0src": [0] * len(loop.current)})
    assert loop.iteration_time_ns > simulate(GRAPH, WORLD, COST).iteration_time_ns
    assert loop.current == compute_durations(own), "its own role comes from its own measurement"
    stage1 = next(t for t in loop.result.timeline(1024) if t.op.type == NodeType.COMPUTE)
    assert stage1.end_ns - stage1.start_ns == slower_pp1[0]


def test_a_real_ranks_measurement_folds_into_every_role_of_its_class():
    classes = [
        {
            "representative": "pp0-tp0src",
            "members": ["pp0-tp0src", "pp0"],
            "warmup": None,
            "num_microbatches": None,
        }
    ]
    metadata = dataclasses.replace(GRAPH.metadata, extra={**GRAPH.metadata.extra, "role_classes": classes})
    graph = dataclasses.replace(GRAPH, metadata=metadata)
    loop = ClosedLoop.start(graph, WORLD, COST, virtual_rank=0, real_ranks=(0,))
    assert loop.fold(slowed(graph.roles["pp0-tp0src"].streams, 2.0)) is None

    def compute_ns(result, virtual_rank):
        return [t.end_ns - t.start_ns for t in result.timeline(virtual_rank) if t.op.type == NodeType.COMPUTE]

    measured = compute_ns(loop.result, 0)
    assert compute_ns(loop.result, 1) == measured, "virtual rank 1 (role pp0) runs as real rank 0 measured"
    plain = ClosedLoop.start(GRAPH, WORLD, COST, virtual_rank=0, real_ranks=(0,))
    plain.fold(slowed(GRAPH.roles["pp0-tp0src"].streams, 2.0))
    assert compute_ns(plain.result, 0) == measured
    assert compute_ns(plain.result, 1) != measured, "without the class, role pp0 keeps its captured spans"
