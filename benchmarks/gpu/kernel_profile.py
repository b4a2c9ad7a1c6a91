"""The main claim's job on the GPU under torch.profiler: device time by kernel, for the GPU model.

Why: the modelled GPU (`--prism-device model:h200`) predicts this same job, run by the same program at
the same size (main_claim's MODEL, one process, world size 1); main_claim measures its iteration and
spans, which say how far the prediction is off but not where. This stage runs the job once more under
torch.profiler and writes each kernel's device time and launches over the run, the totals by family
(GEMM kernels by their library names, everything else by name), and each aten op's own device time
(the kernels it launched), so the model's time by kind (gemm, attention, memory-bound) and by op can be
held against the device's. Nothing is judged here: the comparison is made where the model runs (the CPU).

Run: ``python -m benchmarks.gpu.kernel_profile --out DIR``; writes DIR/kernel_profile.json and .md.
Needs a GPU, a CUDA build and megatron-core.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import tempfile

from benchmarks.common import environment
from benchmarks.gpu.main_claim import TRAIN_ITERS, job_flags
from benchmarks.gpu.memory_ground_truth import REPO, _free_port, child_environment, read_rank
from benchmarks.gpu.stage import printed, run_stage

NAME = "kernel_profile"
TIMEOUT_S = 150.0
TOP_KERNELS = 80
GEMM_MARKERS = ("gemm", "nvjet", "cutlass", "xmma", "cublas", "wgmma")
"""Substrings (lower case) of the kernel names cuBLAS and CUTLASS give their matrix multiplies."""


def family(kernel: str) -> str:
    """'gemm' for a matrix-multiply kernel, else 'other' (the memory-bound and softmax kernels)."""
    lower = kernel.lower()
    return "gemm" if any(marker in lower for marker in GEMM_MARKERS) else "other"


def child_main(out_path: str, flags: list[str]) -> int:
    """One process: world size 1 over NCCL, the built-in entry's run under the profiler."""
    import torch
    import torch.distributed as dist
    from torch.autograd import DeviceType
    from torch.profiler import ProfilerActivity, profile

    from prism_megatron.megatron.entry import pretrain

    on_gpu = torch.cuda.is_available()
    dist.init_process_group("nccl" if on_gpu else "gloo")
    # The host's ops too: each aten op's own device time (its kernels') is what the GPU model charges
    # per op. Without a GPU (the flow checked on the CPU) the CPU's times stand in for the kernels'.
    activities = [ProfilerActivity.CPU, *([ProfilerActivity.CUDA] if on_gpu else [])]
    with profile(activities=activities, record_shapes=True) as prof:
        status = pretrain.main(flags)
    if on_gpu:
        torch.cuda.synchronize()
    kernels: dict[str, list[float]] = {}
    for event in prof.events():
        if on_gpu and event.device_type == DeviceType.CUDA:
            totals = kernels.setdefault(event.name, [0.0, 0])
            totals[0] += event.device_time_total
            totals[1] += 1
    ops = [
        {"name": event.key, "device_us": own_us(event, on_gpu), "count": event.count}
        for event in prof.key_averages()
        if event.key.startswith("aten::") and own_us(event, on_gpu) > 0
    ]
    record = {
        "kernels": [{"name": name, "device_us": us, "count": count} for name, (us, count) in kernels.items()],
        "aten_ops": ops,
        "aten_op_calls": op_calls(prof.events(), on_gpu),
    }
    with open(out_path, "w") as f:
        json.dump(record, f)
    return status


def own_us(event, on_gpu: bool) -> float:
    """An op's own time, its children's left out: its kernels' on a GPU, the host's without one."""
    return event.self_device_time_total if on_gpu else event.self_cpu_time_total


def op_calls(events, on_gpu: bool) -> list[dict]:
    """Each aten op's own device time (the CPU's without a GPU) by its tensor inputs' shapes, dtypes
    and strides (strides where this torch's profiler records them): the same key as a modelled run's
    `top_op_calls`, so a layout the GPU ran otherwise shows beside the op. The largest TOP_KERNELS."""
    calls: dict[str, dict] = {}
    for event in events:
        if not event.name.startswith("aten::"):
            continue
        own = own_us(event, on_gpu)
        if own <= 0:
            continue
        shapes = list(event.input_shapes or [])
        dtypes = list(getattr(event, "input_dtypes", None) or [])
        strides = list(getattr(event, "structured_input_strides", None) or [])
        inputs = [
            {
                "shape": shape,
                "dtype": dtypes[i] if i < len(dtypes) else "",
                "stride": strides[i] if i < len(strides) else None,
            }
            for i, shape in enumerate(shapes)
            if isinstance(shape, list) and shape and all(isinstance(n, int) for n in shape)
        ]
        key = json.dumps([event.name, inputs])
        call = calls.setdefault(key, {"name": event.name, "inputs": inputs, "device_us": 0.0, "count": 0})
        call["device_us"] += own
        call["count"] += 1
    return sorted(calls.values(), key=lambda call: -call["device_us"])[:TOP_KERNELS]


def measure(work_dir: str, device: str = "cuda", tiny: bool = False) -> dict:
    flags = job_flags(tiny, 1)
    out_dir = os.path.join(work_dir, "run")
    kernels_path = os.path.join(work_dir, "kernels.json")
    env = child_environment({"MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(_free_port()), "RANK": "0",
                             "WORLD_SIZE": "1", "LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": "1"})  # fmt: skip
    command = [sys.executable, "-m", "benchmarks.gpu.kernel_profile", "--child", kernels_path, *flags,
               "--prism-device", device, "--prism-out", out_dir]  # fmt: skip
    done = subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=TIMEOUT_S)
    if done.returncode != 0:
        raise RuntimeError(f"the profiled run failed (exit {done.returncode}):\n{done.stderr[-4000:]}")
    with open(kernels_path) as f:
        record = json.load(f)
    kernels = sorted(record["kernels"], key=lambda k: -k["device_us"])
    aten_ops = sorted(record["aten_ops"], key=lambda k: -k["device_us"])
    rank = read_rank(out_dir, 0)
    by_family: dict[str, float] = {}
    for kernel in kernels:
        by_family[family(kernel["name"])] = by_family.get(family(kernel["name"]), 0.0) + kernel["device_us"]
    return {
        "job_flags": flags,
        "iterations": TRAIN_ITERS,
        "iterations_s": [it["time_s"] for it in rank["iterations"]],
        "device_us_total": sum(k["device_us"] for k in kernels),
        "device_us_by_family": by_family,
        "num_kernel_names": len(kernels),
        "kernels": kernels[:TOP_KERNELS],
        "aten_ops": aten_ops[:TOP_KERNELS],
        "aten_op_calls": record.get("aten_op_calls", []),
        "environment": environment(),
    }


def markdown(result: dict) -> str:
    per_iteration = 1e-3 / result["iterations"]
    lines = [
        f"## Kernels of the main claim's job on the GPU ({result['iterations']} iterations, profiled)",
        "",
        f"Device time {result['device_us_total'] * per_iteration:.2f} ms per iteration (mean over all "
        f"{result['iterations']}, the warm-up included); iterations (profiled) "
        + ", ".join(f"{t * 1e3:.1f}" for t in result["iterations_s"])
        + " ms.",
        "",
        "| family | ms per iteration |",
        "|---|---:|",
        *(
            f"| {name} | {us * per_iteration:.2f} |"
            for name, us in sorted(result["device_us_by_family"].items())
        ),
        "",
        "| kernel | ms per iteration | launches |",
        "|---|---:|---:|",
        *(
            f"| {k['name'][:90]} | {k['device_us'] * per_iteration:.3f} | {k['count']} |"
            for k in result["kernels"][:25]
        ),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--child"]:
        return child_main(argv[1], argv[2:])
    with tempfile.TemporaryDirectory(prefix=f"prism-{NAME}-") as work_dir:
        result = run_stage(NAME, __doc__.splitlines()[0], lambda: measure(work_dir), markdown, argv)
    return printed(result, markdown)


if __name__ == "__main__":
    sys.exit(main())
