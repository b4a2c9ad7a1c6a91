"""The backend's device path where a GPU would break it, staged on the asynchronous test device.

Three faults a first GPU run would otherwise find: streams handed out again by a shared pool (the
helper thread's stream, once it is the communication stream, waits on itself until the watchdog
fires), a device error met by the watchdog's detached thread (an escaping exception aborts the
process without the device's message), and an op issued while its stream is captured into a CUDA
graph (a replay would repeat its clock waits and host flags with stale values). The test device
stages the last two (a capturing stream, a sticky error on every query); the stream choice is
checked through the streams the backend asks the device for, and in the sources (no pool at all).
"""

from __future__ import annotations

import re
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from prism_megatron import backend, replay
from prism_megatron.replay import CostLine, OpKind, ReplaySchedule, ScheduledOp, test_device

MS = 1_000_000
WORLD = 16
SELF = 3
TP = tuple(range(4))
DP = tuple(range(SELF, WORLD, 4))
CSRC = Path(__file__).resolve().parents[2] / "csrc"


@pytest.fixture
def world():
    from prism_megatron import _C

    _C.backend.clear_device_failure()  # a failed run before does not abort this one's waits
    with test_device.active_device():
        activation = backend.activate(world_size=WORLD, virtual_rank=SELF, real_ranks=[SELF], timeout_s=5.0)
        try:
            yield activation
        finally:
            backend.deactivate()
    replay.reset()
    _C.backend.clear_device_failure()


def test_a_backend_takes_two_streams_of_its_own_once_and_keeps_them(world):
    replay.set_default_cost([CostLine(latency_ns=0, ns_per_byte=0.0)])
    tp, dp = dist.new_group(list(TP)), dist.new_group(list(DP))
    before = test_device.num_streams()
    dist.all_reduce(torch.ones(4), group=tp)
    assert test_device.num_streams() == before + 2  # its communication stream and its helper's
    for _ in range(40):  # more ops than a pool of 32 streams holds: no stream asked for again
        dist.all_reduce(torch.ones(4), group=tp)
    assert test_device.num_streams() == before + 2
    dist.all_reduce(torch.ones(4), group=dp)
    assert test_device.num_streams() == before + 4  # another group's backend: two more of its own
    test_device.synchronize()


def test_no_device_code_takes_a_stream_from_torch_s_pool():
    """CUDA's side of the stream choice, which no CPU machine runs: the pool hands its 32 streams out
    again, so a stream the backend needs to itself must never come from it."""
    users = [
        str(path.relative_to(CSRC))
        for path in CSRC.rglob("*")
        if path.suffix in {".cpp", ".h", ".cu", ".cuh"}
        and re.search(r"getStreamFromPool\s*\(", path.read_text())
    ]
    assert users == []
    cuda_queue = (CSRC / "replay" / "cuda_queue.cpp").read_text()
    new_stream = cuda_queue[cuda_queue.index("StreamId new_stream()") :]
    assert "cudaStreamCreateWithFlags" in new_stream[: new_stream.index("\n  }")]


def test_an_op_on_a_stream_being_captured_into_a_graph_is_refused_with_one_clear_error(world):
    replay.set_default_cost([CostLine(latency_ns=0, ns_per_byte=0.0)])
    tp = dist.new_group(list(TP))
    with test_device.capturing(), pytest.raises(RuntimeError) as raised:
        dist.all_reduce(torch.ones(4), group=tp)
    text = str(raised.value)
    assert "ALL_REDUCE seq 0" in text and "captured into a CUDA graph" in text
    assert "--cuda-graph-impl" in text
    t = torch.ones(4)
    dist.all_reduce(t, group=tp)  # outside the capture the same group works
    test_device.synchronize()
    assert torch.equal(t, torch.full((4,), 4.0))


def _hour_long_iteration(group):
    """Begin an iteration whose one all-reduce on `group` has its virtual members arrive in an hour."""
    schedule = ReplaySchedule(
        virtual_rank=SELF,
        collectives={group: [ScheduledOp(OpKind.ALL_REDUCE, 16, arrival_offset_ns=3600_000 * MS, cost_ns=0)]},
        p2p={},
        iteration_time_ns=100 * MS,
    )
    replay.set_mode("replay")
    replay.load_schedule(schedule)
    replay.mark_iteration_start()


def test_a_device_error_the_watchdog_meets_fails_the_run_with_the_device_s_message(world):
    tp = dist.new_group(list(TP))
    _hour_long_iteration(TP)
    dist.all_reduce(torch.ones(4), group=tp)  # in flight for an hour on the device
    with test_device.device_error("an illegal memory access was encountered"):
        time.sleep(1.0)  # the watchdog looks every 20 ms; its thread must survive the error
    test_device.synchronize()  # the failure ended every device wait (else: the hour, or the timeout)
    with pytest.raises(dist.DistBackendError) as raised:
        dist.all_reduce(torch.ones(4), group=tp)
    text = str(raised.value)
    assert "test device reported an error while ALL_REDUCE seq 0" in text
    assert "an illegal memory access was encountered" in text
    assert "--prism-timeout" not in text  # the device's error, not the 5 s timeout after it


def test_a_device_error_names_an_op_of_the_run_that_failed_not_one_an_earlier_run_left_behind():
    """A sticky device error raises from every query the watchdog makes, the oldest op on its list
    first: an op of an earlier run (still in flight, or done and not looked at yet) must not be the
    one the new run's failure names."""
    from prism_megatron import _C

    _C.backend.clear_device_failure()
    try:
        with test_device.active_device():
            backend.activate(world_size=WORLD, virtual_rank=SELF, real_ranks=[SELF], timeout_s=5.0)
            try:
                _hour_long_iteration(DP)
                dist.all_reduce(torch.ones(4), group=dist.new_group(list(DP)))  # left in flight
            finally:
                backend.deactivate()
            replay.reset()
            backend.activate(world_size=WORLD, virtual_rank=SELF, real_ranks=[SELF], timeout_s=5.0)
            try:
                _hour_long_iteration(TP)
                tp = dist.new_group(list(TP))
                dist.all_reduce(torch.ones(4), group=tp)
                with test_device.device_error("an illegal memory access was encountered"):
                    time.sleep(0.5)
                with pytest.raises(dist.DistBackendError) as raised:
                    dist.all_reduce(torch.ones(4), group=tp)
            finally:
                backend.deactivate()
    finally:
        replay.reset()
        _C.backend.clear_device_failure()
    text = str(raised.value)
    assert "reported an error while ALL_REDUCE seq 0 on group" in text
    assert "[0, 1, 2, 3]" in text.splitlines()[0] and "[3, 7, 11, 15]" not in text.splitlines()[0]
