"""The prism backend on CUDA tensors, on a real GPU: mirror values, device-timed completion, overlap.

One process is the only real rank of a W=8192 world, so no NCCL communicator is needed. An op with
virtual members ends with a wait-until kernel on the backend's stream; Work.wait() makes the
caller's stream wait, never the host. Skipped without a GPU and a CUDA build.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from prism_megatron import _C, backend, replay
from prism_megatron.replay import CostLine, OpKind, ReplaySchedule, ScheduledOp

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and getattr(_C, "with_cuda", False)),
        reason="needs a GPU and a CUDA build of prism_megatron._C",
    ),
]

WORLD = 8192
SELF = 5
TP = tuple(range(8))
MS = 1_000_000


@pytest.fixture
def world():
    def start(**kwargs):
        return backend.activate(
            world_size=WORLD, virtual_rank=SELF, real_ranks=[SELF], device="cuda", **kwargs
        )

    yield start
    backend.deactivate()


def device_elapsed_ms(fn) -> float:
    """GPU time of what fn enqueues on the current stream (CUDA events around it)."""
    begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
    begin.record()
    fn()
    end.record()
    end.synchronize()
    return begin.elapsed_time(end)


def test_collectives_on_cuda_tensors_follow_the_mirror_policy(world):
    world()
    tp = dist.new_group(list(TP))
    x = torch.arange(4.0, device="cuda")
    t = x.clone()
    dist.all_reduce(t, group=tp)
    assert torch.equal(t, 8 * x)
    out = torch.empty(32, device="cuda")
    dist.all_gather_into_tensor(out, x, group=tp)
    assert torch.equal(out, x.repeat(8))
    chunk = torch.empty(2, device="cuda")
    dist.reduce_scatter_tensor(chunk, torch.arange(16.0, device="cuda"), group=tp)
    assert torch.equal(chunk, torch.tensor([80.0, 88.0], device="cuda"))
    b = torch.ones(3, device="cuda")
    dist.broadcast(b, src=0, group=tp)
    assert torch.equal(b, torch.zeros(3, device="cuda"))
    a2a = torch.empty(8, device="cuda")
    dist.all_to_all_single(a2a, torch.arange(8.0, device="cuda"), group=tp)
    assert torch.equal(a2a, torch.arange(8.0, device="cuda"))
    r = torch.full((2,), float("nan"), device="cuda")
    dist.recv(r, src=6)
    assert torch.equal(r, torch.zeros(2, device="cuda"))
    import torch.distributed._functional_collectives as fc

    assert torch.equal(fc.all_reduce(x, "sum", tp).wait(), 8 * x)
    assert torch.equal(fc.all_gather_tensor(x, 0, tp).wait(), x.repeat(8))


def test_the_cost_is_spent_on_the_device_and_the_host_does_not_block(world):
    world(default_cost=(CostLine(latency_ns=20 * MS, ns_per_byte=0.0),))
    tp = dist.new_group(list(TP))
    t = torch.ones(1024, device="cuda")
    torch.cuda.synchronize()
    host_start = time.perf_counter()
    elapsed_ms = device_elapsed_ms(lambda: dist.all_reduce(t, group=tp, async_op=True).wait())
    assert 20.0 <= elapsed_ms < 25.0
    assert torch.equal(t, torch.full((1024,), 8.0, device="cuda"))
    issue_and_wait_s = []
    for _ in range(5):
        start = time.perf_counter()
        work = dist.all_reduce(t, group=tp, async_op=True)
        work.wait()
        issue_and_wait_s.append(time.perf_counter() - start)
    assert min(issue_and_wait_s) < 0.005  # the host returned long before the 20 ms device wait
    torch.cuda.synchronize()
    assert time.perf_counter() - host_start >= 0.1  # the device did spend 5 x 20 ms


def test_compute_on_another_stream_overlaps_the_wait(world):
    world(default_cost=(CostLine(latency_ns=30 * MS, ns_per_byte=0.0),))
    tp = dist.new_group(list(TP))
    a = torch.randn(4096, 4096, device="cuda")
    side = torch.cuda.Stream()

    def compute():
        with torch.cuda.stream(side):
            for _ in range(20):
                a @ a

    torch.cuda.synchronize()
    start = time.perf_counter()
    compute()
    torch.cuda.synchronize()
    compute_s = time.perf_counter() - start
    start = time.perf_counter()
    work = dist.all_reduce(torch.ones(4, device="cuda"), group=tp, async_op=True)
    compute()
    work.wait()
    torch.cuda.synchronize()
    both_s = time.perf_counter() - start
    assert both_s < max(compute_s, 0.030) + 0.5 * min(compute_s, 0.030) + 0.005


def test_replay_arrivals_count_from_the_device_iteration_start(world):
    world(mode="replay")
    tp = dist.new_group(list(TP))
    replay.load_schedule(
        ReplaySchedule(
            virtual_rank=SELF,
            collectives={
                TP: (ScheduledOp(OpKind.ALL_REDUCE, 16, arrival_offset_ns=15 * MS, cost_ns=5 * MS),)
            },
            p2p={},
        )
    )
    t = torch.ones(4, device="cuda")
    torch.cuda.synchronize()

    def iteration():
        replay.mark_iteration_start()  # stamps the device timer on the current stream
        dist.all_reduce(t, group=tp)

    elapsed_ms = device_elapsed_ms(iteration)
    assert 20.0 <= elapsed_ms < 24.0
