"""The CPU shim's function mode rewrites exactly the CUDA requests and counts each, and passes
everything else (nearly every call a program makes) through unchanged and uncounted."""

from __future__ import annotations

import torch

from prism_megatron.patches.cpu_shim import CudaToCpuMode


def test_cuda_requests_land_on_the_cpu_and_are_counted_one_each():
    calls: list[None] = []
    x = torch.ones(2)
    with CudaToCpuMode(lambda: calls.append(None)):
        made = torch.zeros(3, device="cuda")
        moved = x.cuda()
        sent = x.to("cuda")
        sent_device = x.to(torch.device("cuda", 0), non_blocking=True)
        pinned = torch.empty(4, pin_memory=True)
    assert made.device.type == sent.device.type == sent_device.device.type == pinned.device.type == "cpu"
    assert moved is x and not pinned.is_pinned()
    assert len(calls) == 5


def test_other_calls_pass_through_unchanged_and_uncounted():
    calls: list[None] = []
    x = torch.arange(6.0)
    with CudaToCpuMode(lambda: calls.append(None)):
        y = x.view(2, 3).t().contiguous() + 1
        half = x.to(torch.float16)
        on_cpu = torch.zeros(2, device="cpu", dtype=torch.int32)
        shape, device = y.shape, y.device
    assert calls == []
    assert y.tolist() == [[1.0, 4.0], [2.0, 5.0], [3.0, 6.0]] and shape == (3, 2) and device.type == "cpu"
    assert half.dtype == torch.float16 and on_cpu.dtype == torch.int32
