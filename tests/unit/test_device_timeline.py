"""The device timeline and the asynchronous test device, and the backend's device path on it.

The test device has CUDA's timing semantics (work queued on streams runs later on worker threads,
events mark a stream's progress, the host runs ahead until it synchronises), so the logic the GPU
runs is checked here: marks are device time, a collective with virtual peers holds the backend's
stream and never the host, and a device wait that outlives --prism-timeout fails the run instead
of hanging it. Times are sleeps of tens of milliseconds compared within one run, so a loaded
machine delays everything alike.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from prism_megatron import backend, replay
from prism_megatron.replay import CostLine, OpKind, ReplaySchedule, ScheduledOp, test_device, timeline

MS = 1_000_000
WORLD = 16
SELF = 3
TP = tuple(range(4))


@pytest.fixture
def device():
    from prism_megatron import _C

    _C.backend.clear_device_failure()  # a failed run before does not abort this one's waits
    with test_device.active_device():
        yield
    replay.reset()


@pytest.fixture
def world(device):
    activation = backend.activate(world_size=WORLD, virtual_rank=SELF, real_ranks=[SELF], timeout_s=5.0)
    yield activation
    backend.deactivate()


def test_host_marks_read_the_host_clock_at_once():
    before = time.monotonic_ns()
    m = timeline.mark()
    after = time.monotonic_ns()
    assert timeline.device_name() == "host"
    assert timeline.is_reached(m)
    assert before <= timeline.resolve_one(m) <= after


def test_the_host_runs_ahead_of_the_device_and_marks_are_device_time(device):
    begin = timeline.mark()
    timeline.compute(0.05)
    end = timeline.mark()
    assert test_device.num_pending() >= 2  # the host is already past the compute
    assert not timeline.is_reached(end)
    start_ns, end_ns = timeline.resolve([begin, end])
    assert 49 * MS <= end_ns - start_ns <= 80 * MS
    # What the host's clock saw between the two marks was a launch, not the compute.
    with timeline.host_clock_marks():
        host_begin = timeline.mark()
        timeline.compute(0.05)
        host_end = timeline.mark()
    host_start_ns, host_end_ns = timeline.resolve([host_begin, host_end])
    assert host_end_ns - host_start_ns < 10 * MS
    test_device.synchronize()


def test_streams_run_concurrently_and_wait_for_each_other_through_events(device):
    side = test_device.new_stream()
    begin = timeline.mark()
    with test_device.stream(side):
        timeline.compute(0.04)
        done = test_device.Event()
        done.record()
    timeline.compute(0.04)  # overlaps the side stream's
    overlapped = timeline.mark()
    done.wait()  # the default stream waits for the side stream, not the host
    after_wait = timeline.mark()
    start_ns, overlapped_ns, waited_ns = timeline.resolve([begin, overlapped, after_wait])
    assert overlapped_ns - start_ns < 70 * MS  # both 40 ms computes ran side by side
    assert waited_ns >= timeline.resolve_one(timeline.Mark(done._event.mark))
    first, second = test_device.Event(), test_device.Event()
    first.record()
    timeline.compute(0.02)
    second.record()
    assert 19 * MS <= first.elapsed_ns(second) <= 40 * MS


def test_a_collective_with_virtual_peers_holds_the_stream_not_the_host(world):
    replay.set_mode("replay")
    schedule = ReplaySchedule(
        virtual_rank=SELF,
        collectives={TP: [ScheduledOp(OpKind.ALL_REDUCE, 16, arrival_offset_ns=60 * MS, cost_ns=5 * MS)]},
        p2p={},
        iteration_time_ns=100 * MS,
    )
    replay.load_schedule(schedule)
    tp = dist.new_group(list(TP))
    start = replay.mark_iteration_start()
    t = torch.ones(4)
    replay.start_recording()
    host_before = time.monotonic_ns()
    dist.all_reduce(t, group=tp)
    host_after = time.monotonic_ns()
    after = timeline.mark()
    assert host_after - host_before < 30 * MS  # Work.wait() made the stream wait, not the host
    (event,) = replay.stop_recording()
    start_ns, after_ns = timeline.resolve([start, after])
    # The stream moved on when the virtual peers' arrival (60 ms after the start) plus the cost had
    # passed; the op log holds device times: all arrived at 60 ms, completed at 65 ms.
    assert 65 * MS <= after_ns - start_ns <= 90 * MS
    assert 59 * MS <= event.start_ns - start_ns <= 70 * MS
    assert 65 * MS <= event.complete_ns - start_ns <= 90 * MS
    test_device.synchronize()
    assert torch.equal(t, torch.full((4,), 4.0))  # the mirror policy, on the host after synchronize


def test_an_async_op_overlaps_compute_and_completes_where_the_program_waits(world):
    replay.set_default_cost([CostLine(latency_ns=30 * MS, ns_per_byte=0.0)])
    tp = dist.new_group(list(TP))
    start = replay.mark_iteration_start()
    replay.start_recording()
    work = dist.all_reduce(torch.ones(2), group=tp, async_op=True)
    timeline.compute(0.05)  # 50 ms of compute on the default stream overlaps the 30 ms op
    work.wait()
    end = timeline.mark()
    (event,) = replay.stop_recording()
    start_ns, end_ns = timeline.resolve([start, end])
    assert 49 * MS <= end_ns - start_ns <= 75 * MS  # not 80: the op ran beside the compute
    assert event.async_op and event.complete_ns - start_ns >= 49 * MS  # where the program waited


def test_a_device_wait_longer_than_the_timeout_fails_the_run_and_ends_the_wait(world):
    replay.set_mode("replay")
    schedule = ReplaySchedule(
        virtual_rank=SELF,
        collectives={TP: [ScheduledOp(OpKind.ALL_REDUCE, 16, arrival_offset_ns=3600_000 * MS, cost_ns=0)]},
        p2p={},
        iteration_time_ns=100 * MS,
    )
    replay.load_schedule(schedule)
    tp = dist.new_group(list(TP))
    replay.mark_iteration_start()
    begin = time.monotonic()
    dist.all_reduce(torch.ones(4), group=tp)  # the host moves on; the stream would wait an hour
    test_device.synchronize()  # returns once the watchdog (timeout 5 s) ends the device wait
    assert time.monotonic() - begin < 30
    with pytest.raises(dist.DistBackendError, match=r"timeout: ALL_REDUCE seq 0 .*--prism-timeout"):
        dist.all_reduce(torch.ones(4), group=tp)
