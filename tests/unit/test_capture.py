"""Capture: recorded ops of a real rank become its role's streams, and the slice's become the graph.

The job is W=8, TP2 PP2 (DP2): virtual rank 0 is on stage 0 with TP peer 1, DP peer 2 and next
stage 4. Times are in microseconds from the iteration start, written `us(...)`.
"""

from __future__ import annotations

import dataclasses

import pytest

from prism_megatron.graph import COMPUTE_STREAM, Dep, LayoutWorld, format_op
from prism_megatron.graph.capture import (
    CapturedIteration,
    GroupNames,
    RankCapture,
    build_graph,
    compute_durations,
    compute_intervals,
    iteration_streams,
    role_graph,
)
from prism_megatron.replay import OpEvent, OpKind
from prism_megatron.topology import Layout

LAYOUT = Layout(world_size=8, tp=2, pp=2)
WORLD = LayoutWorld(LAYOUT)
START_NS = 1_000_000_000


def us(t: float) -> int:
    return START_NS + round(t * 1000)


def collective(kind, group, issue_us, complete_us, *, async_op=False, size=1024, seq=0) -> OpEvent:
    return OpEvent(kind, tuple(group), -1, seq, size, "Float", us(issue_us), us(issue_us), us(complete_us),
                   async_op, True)  # fmt: skip


def p2p(kind, peer, issue_us, complete_us, *, self_rank=0, size=4096) -> OpEvent:
    return OpEvent(kind, (self_rank, peer), peer, 0, size, "Float", us(issue_us), us(issue_us),
                   us(complete_us), False, True)  # fmt: skip


def iteration(events, end_us, calls=()) -> CapturedIteration:
    return CapturedIteration(START_NS, us(end_us), tuple(events), tuple((us(a), us(b)) for a, b in calls))


def printed(streams) -> dict[str, list[str]]:
    return {name: [format_op(op) for op in ops] for name, ops in streams.items()}


def test_gaps_between_blocking_ops_are_compute_and_ops_are_named_by_group_kind():
    it = iteration(
        [collective(OpKind.ALL_REDUCE, (0, 1), 100, 130), collective(OpKind.ALL_REDUCE, (0, 2), 250, 260)],
        end_us=400,
    )
    assert printed(iteration_streams(it, GroupNames(WORLD, 0))) == {
        COMPUTE_STREAM: ["c:compute 100us", "AR tp#0 1KiB Float", "c:compute 120us", "AR dp#0 1KiB Float",
                         "c:compute 140us"],
    }  # fmt: skip


def test_compute_intervals_are_the_gaps_on_the_clock_for_the_timeline():
    it = iteration(
        [collective(OpKind.ALL_REDUCE, (0, 1), 100, 130), collective(OpKind.ALL_REDUCE, (0, 2), 250, 260)],
        end_us=400,
    )
    assert compute_intervals(it) == [(us(0), us(100)), (us(130), us(250)), (us(260), us(400))]


def test_host_work_after_the_engine_completed_a_blocking_op_is_compute_that_follows_it():
    """The engine completes the first op at 110 us, but the program asks for it only at 130 us
    (torch's Python after the issue, the local part): those 20 us are the program's host work and
    belong to the compute after the op, not to no span at all. The second op's virtual members
    arrived late: the engine completed it at 260 us, when the program saw it."""
    late_ask = dataclasses.replace(collective(OpKind.ALL_REDUCE, (0, 1), 100, 130), engine_done_ns=us(110))
    waited = dataclasses.replace(
        collective(OpKind.ALL_REDUCE, (0, 2), 250, 260), start_ns=us(255), engine_done_ns=us(260)
    )
    it = iteration([late_ask, waited], end_us=400)
    assert compute_intervals(it) == [(us(0), us(100)), (us(110), us(250)), (us(260), us(400))]
    assert printed(iteration_streams(it, GroupNames(WORLD, 0)))[COMPUTE_STREAM][2] == "c:compute 140us"
    # A real part that finished after the engine's time ends the op there (what the real members took).
    mixed = dataclasses.replace(late_ask, real_done_ns=us(125))
    assert compute_intervals(iteration([mixed], end_us=200))[1] == (us(125), us(200))


def test_a_capture_keeps_the_engine_and_real_part_times_of_its_ops(tmp_path):
    event = dataclasses.replace(
        collective(OpKind.ALL_REDUCE, (0, 1), 100, 130),
        real_done_ns=us(120),
        engine_done_ns=us(110),
        wait_ns=us(105),
    )
    original = RankCapture(0, "pp0-tp0src", (iteration([event], end_us=200),), num_warmup=0)
    path = original.save(str(tmp_path / "capture-00000.json"))
    assert RankCapture.load(path) == original


def test_p2p_ops_of_one_communicator_call_are_one_batch_and_the_stream_resumes_when_it_returned():
    # send_forward_recv_backward: both posted in one call that returned at 80 us.
    events = [p2p(OpKind.SEND, 4, 50, 52), p2p(OpKind.RECV, 4, 51, 60), p2p(OpKind.SEND, 4, 150, 151)]
    it = iteration(events, end_us=200, calls=[(49, 80), (149, 160)])
    assert printed(iteration_streams(it, GroupNames(WORLD, 0))) == {
        COMPUTE_STREAM: ["c:compute 50us", "S→pp+1#0 4KiB Float &", "R←pp+1#0 4KiB Float",
                         "c:compute 70us", "S→pp+1#1 4KiB Float", "c:compute 40us"],
    }  # fmt: skip


def test_pipeline_transfers_waited_after_their_call_returned_overlap_the_compute_until_the_wait():
    """megatron-core's interleaved schedule with overlapped p2p: send_forward_recv_forward posts a
    receive from the previous stage and a send to the next, returns at 40 us, and the program waits
    on the receive at 150 us (before the forward that needs it) and on the send at 300 us (one step
    later). Both run on their own side streams, the compute between call and waits stays compute;
    a transfer waited inside its call (200-230 us: the interceptor records no wait) is still part of
    the blocking call."""
    stage_1 = 2  # of PP4 (TP1 DP2): rank 0 before it, rank 4 after it
    recv = dataclasses.replace(p2p(OpKind.RECV, 0, 31, 31, self_rank=stage_1), async_op=True, wait_ns=us(150))
    send = dataclasses.replace(p2p(OpKind.SEND, 4, 32, 32, self_rank=stage_1), async_op=True, wait_ns=us(300))
    in_call = dataclasses.replace(p2p(OpKind.SEND, 4, 201, 205, self_rank=stage_1), seq=1, async_op=True)
    it = iteration([recv, send, in_call], end_us=400, calls=[(30, 40), (200, 230)])
    streams = iteration_streams(it, GroupNames(LayoutWorld(Layout(world_size=8, tp=1, pp=4)), stage_1))
    assert printed(streams) == {
        COMPUTE_STREAM: ["c:compute 31us", "c:compute 1us", "c:compute 118us", "w <async-p2p-recv-pp-1:0",
                         "c:compute 51us", "S→pp+1#1 4KiB Float", "c:compute 70us", "w <async-p2p-send-pp+1:0",
                         "c:compute 100us"],
        "async-p2p-recv-pp-1": ["R←pp-1#0 4KiB Float <compute:0"],
        "async-p2p-send-pp+1": ["S→pp+1#0 4KiB Float <compute:1"],
    }  # fmt: skip
    assert sum(compute_durations(streams)) == 400_000 - 29_000  # all but the blocking call, 201-230 us


def test_an_async_op_runs_on_a_side_stream_and_the_compute_stream_waits_where_it_completed():
    it = iteration([collective(OpKind.ALL_REDUCE, (0, 1), 100, 300, async_op=True)], end_us=500)
    streams = iteration_streams(it, GroupNames(WORLD, 0))
    assert printed(streams) == {
        COMPUTE_STREAM: ["c:compute 100us", "c:compute 200us", "w <async-tp:0", "c:compute 200us"],
        "async-tp": ["AR tp#0 1KiB Float <compute:0"],
    }
    assert streams["async-tp"][0].deps == (Dep(COMPUTE_STREAM, 0),)


def test_an_async_ops_wait_begins_where_the_program_waited_and_compute_resumes_at_its_completion():
    """The program waited at 180 us; the op completed at 300 us (its virtual peer was late, the
    engine's time), and the program saw it at 310 us. The 120 us in between were a wait, not compute;
    the 10 us after the engine's time are the program's host work, in the compute that follows."""
    event = dataclasses.replace(
        collective(OpKind.ALL_REDUCE, (0, 1), 100, 310, async_op=True),
        wait_ns=us(180),
        engine_done_ns=us(300),
    )
    it = iteration([event], end_us=500)
    assert printed(iteration_streams(it, GroupNames(WORLD, 0)))[COMPUTE_STREAM] == [
        "c:compute 100us", "c:compute 80us", "w <async-tp:0", "c:compute 200us",
    ]  # fmt: skip
    assert compute_intervals(it) == [(us(0), us(100)), (us(100), us(180)), (us(300), us(500))]
    # Waited after the engine's time: the span runs to the wait, and the wait itself (the op's host
    # work, 1 us) is the program's, so the compute resumes at once.
    late = dataclasses.replace(event, wait_ns=us(400), complete_ns=us(401))
    assert compute_intervals(iteration([late], end_us=500))[1:] == [(us(100), us(400)), (us(400), us(500))]


def test_an_async_op_not_waited_within_the_iteration_is_waited_at_its_end():
    pending = collective(OpKind.ALL_REDUCE, (0, 1), 100, 0, async_op=True)
    it = iteration([dataclasses.replace(pending, complete_ns=-1)], end_us=500)
    streams = iteration_streams(it, GroupNames(WORLD, 0))
    assert printed(streams)[COMPUTE_STREAM] == [
        "c:compute 100us",
        "c:compute 400us",
        "w <async-tp:0",
        "c:compute 0ns",
    ]
    assert sum(compute_durations(streams)) == 500_000


def capture(virtual_rank: int, durations_us: list[list[float]], num_warmup: int = 1) -> RankCapture:
    """A rank whose iterations each hold one TP all-reduce; compute before and after as given."""
    iterations = []
    for before, after in durations_us:
        ar = collective(OpKind.ALL_REDUCE, LAYOUT.group("tp", virtual_rank), before, before + 10)
        iterations.append(iteration([ar], end_us=before + 10 + after))
    role = LAYOUT.role_of(virtual_rank).name
    return RankCapture(virtual_rank, role, tuple(iterations), num_warmup=num_warmup)


def test_the_role_graph_drops_warm_up_and_takes_the_median_of_each_compute_span():
    graph = role_graph(capture(0, [[900, 900], [100, 40], [120, 70], [110, 50]]), WORLD)
    assert [format_op(op) for op in graph.streams[COMPUTE_STREAM]] == [
        "c:compute 110us", "AR tp#0 1KiB Float", "c:compute 50us",
    ]  # fmt: skip
    assert graph.role == "pp0-tp0src"


def test_iterations_that_issue_different_ops_are_refused_naming_the_difference():
    bad = capture(0, [[1, 1], [100, 40], [100, 40]])
    other = collective(OpKind.ALL_GATHER, (0, 1), 100, 110)
    bad = RankCapture(0, bad.role, (*bad.iterations[:2], iteration([other], end_us=150)))
    with pytest.raises(
        ValueError, match=r"recorded iterations 1 and 2 issue different ops .*AR tp#0.*AG tp#0"
    ):
        role_graph(bad, WORLD)


def _sized(kind: OpKind, sizes: list[int]) -> RankCapture:
    """Rank 0 issuing one op of `kind` over its TP group per iteration, of the given sizes."""
    group = LAYOUT.group("tp", 0)
    iterations = tuple(
        iteration([collective(kind, group, 100, 110, size=size)], end_us=150) for size in sizes
    )
    return RankCapture(0, LAYOUT.role_of(0).name, iterations, num_warmup=1)


def test_a_collective_may_change_its_size_between_iterations_and_the_graph_takes_the_median():
    # MoE token dispatch: each iteration moves what the router chose.
    for kind in (OpKind.ALL_TO_ALL, OpKind.ALL_GATHER):
        graph = role_graph(_sized(kind, [9999, 4096, 20480, 8192, 4096]), WORLD)
        (op,) = [op for op in graph.streams[COMPUTE_STREAM] if op.comm == kind]
        assert op.size_bytes == 4096  # the lower median of 4096 4096 8192 20480
    # An all-reduce of another size, another kind, or a p2p transfer of another size: another program.
    with pytest.raises(ValueError, match=r"issue different ops .*AR tp#0 4KiB.*AR tp#0 8KiB"):
        role_graph(_sized(OpKind.ALL_REDUCE, [4096, 4096, 8192]), WORLD)
    other = capture(0, [[1, 1], [100, 40]])
    gathered = collective(OpKind.ALL_GATHER, LAYOUT.group("tp", 0), 100, 110)
    with pytest.raises(ValueError, match=r"issue different ops .*AR tp#0.*AG tp#0"):
        role_graph(RankCapture(0, other.role, (*other.iterations, iteration([gathered], end_us=150))), WORLD)
    sends = [iteration([p2p(OpKind.SEND, 2, 100, 110, size=size)], end_us=150) for size in (1, 4096, 8192)]
    with pytest.raises(ValueError, match=r"issue different ops"):
        role_graph(RankCapture(0, other.role, tuple(sends), num_warmup=1), WORLD)


def test_a_capture_survives_its_file(tmp_path):
    original = capture(5, [[10, 20], [30, 40]])
    path = original.save(str(tmp_path / "capture-00005.json"))
    assert RankCapture.load(path) == original


def test_the_graph_has_one_role_graph_per_role_from_its_representative_when_captured():
    captures = [capture(r, [[1, 1], [100 + r, 10]]) for r in (0, 1, 3, 4, 5)]
    graph = build_graph(captures, WORLD, {"world_size": 8, "tp": 2, "pp": 2})
    assert list(graph.roles) == ["pp0-tp0src", "pp0", "pp1-tp0src", "pp1"]
    assert graph.metadata.extra["captured_ranks"] == {"pp0-tp0src": 0, "pp0": 1, "pp1-tp0src": 4, "pp1": 5}
    assert graph.roles["pp0"].streams[COMPUTE_STREAM][0].duration_ns == 101_000  # rank 1, not rank 3


def test_a_capture_that_misses_a_role_names_it_and_a_rank_that_has_it():
    with pytest.raises(ValueError, match=r"lacks roles pp1 \(e\.g\. rank 5\)"):
        build_graph([capture(r, [[1, 1]]) for r in (0, 1, 4)], WORLD, {"world_size": 8, "tp": 2, "pp": 2})


def test_a_spans_time_outside_the_recorded_device_work_is_its_host_overhead():
    it = dataclasses.replace(
        iteration([collective(OpKind.ALL_REDUCE, (0, 1), 100, 130)], end_us=400),
        work=((us(10), us(90)), (us(150), us(250)), (us(260), us(380))),
    )
    assert printed(iteration_streams(it, GroupNames(WORLD, 0)))[COMPUTE_STREAM] == [
        "c:compute 100us host:20us",
        "AR tp#0 1KiB Float",
        "c:compute 270us host:50us",
    ]
    unrecorded = iteration([collective(OpKind.ALL_REDUCE, (0, 1), 100, 130)], end_us=400)
    assert [op.overhead_ns for op in iteration_streams(unrecorded, GroupNames(WORLD, 0))[COMPUTE_STREAM]] == [
        0,
        0,
        0,
    ]


def test_recorded_work_survives_the_capture_file_and_the_graph_takes_the_median_overhead():
    base = iteration([collective(OpKind.ALL_REDUCE, (0, 1), 100, 130)], end_us=400)
    iterations = tuple(
        dataclasses.replace(base, work=((us(w), us(100)), (us(130), us(400))))
        for w in (0, 0, 10, 30)  # warm-up, then overheads of 0, 10 and 30 us before the all-reduce
    )
    capture = RankCapture(0, "pp0", iterations)
    assert RankCapture.from_json(capture.to_json()) == capture
    ops = role_graph(capture, WORLD).streams[COMPUTE_STREAM]
    assert (ops[0].duration_ns, ops[0].overhead_ns) == (100_000, 10_000)
