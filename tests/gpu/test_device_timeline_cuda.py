"""The device timeline and the backend's device path on a real GPU (the test device's twin on CPU:
tests/unit/test_device_timeline.py). Skipped without a GPU and a CUDA build."""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from prism_megatron import _C, backend, replay
from prism_megatron.replay import OpKind, ReplaySchedule, ScheduledOp, timeline

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and getattr(_C, "with_cuda", False)),
        reason="needs a GPU and a CUDA build of prism_megatron._C",
    ),
]

MS = 1_000_000
WORLD = 16
SELF = 3
TP = tuple(range(4))


@pytest.fixture
def world():
    activation = backend.activate(world_size=WORLD, virtual_rank=SELF, real_ranks=[SELF], device="cuda",
                                  timeout_s=5.0)  # fmt: skip
    yield activation
    backend.deactivate()


def test_cuda_marks_are_device_time_and_the_host_runs_ahead(world):
    assert timeline.device_name() == "cuda"
    begin = timeline.mark()
    timeline.compute(0.02)  # a 20 ms spin kernel on the current stream
    end = timeline.mark()
    assert not timeline.is_reached(end)
    start_ns, end_ns = timeline.resolve([begin, end])
    assert 20 * MS <= end_ns - start_ns <= 21 * MS


def test_a_collective_with_virtual_peers_is_timed_on_the_device(world):
    replay.set_mode("replay")
    replay.load_schedule(ReplaySchedule(
        virtual_rank=SELF, collectives={TP: [ScheduledOp(OpKind.ALL_REDUCE, 16, 15 * MS, 5 * MS)]}, p2p={},
    ))  # fmt: skip
    tp = dist.new_group(list(TP))
    t = torch.ones(4, device="cuda")
    torch.cuda.synchronize()
    start = replay.mark_iteration_start()
    replay.start_recording()
    host_before = time.perf_counter()
    dist.all_reduce(t, group=tp)
    assert time.perf_counter() - host_before < 0.010  # the host did not wait
    after = timeline.mark()
    (event,) = replay.stop_recording()
    start_ns, after_ns = timeline.resolve([start, after])
    assert 20 * MS <= after_ns - start_ns <= 21 * MS
    assert 15 * MS <= event.start_ns - start_ns <= 15.5 * MS
    assert 20 * MS <= event.complete_ns - start_ns <= 21 * MS
    assert torch.equal(t, torch.full((4,), 4.0, device="cuda"))


def test_a_device_wait_beyond_the_timeout_fails_the_run_and_releases_the_gpu(world):
    replay.set_mode("replay")
    replay.load_schedule(ReplaySchedule(
        virtual_rank=SELF, collectives={TP: [ScheduledOp(OpKind.ALL_REDUCE, 16, 3600_000 * MS, 0)]}, p2p={},
    ))  # fmt: skip
    tp = dist.new_group(list(TP))
    replay.mark_iteration_start()
    begin = time.monotonic()
    dist.all_reduce(torch.ones(4, device="cuda"), group=tp)
    torch.cuda.synchronize()  # the watchdog (timeout 5 s) ends the wait kernel
    assert time.monotonic() - begin < 20
    with pytest.raises(dist.DistBackendError, match="timeout: ALL_REDUCE seq 0"):
        dist.all_reduce(torch.ones(4, device="cuda"), group=tp)
