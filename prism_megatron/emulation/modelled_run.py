"""A run on a modelled GPU (`--prism-device model:<gpu>`): capture, simulate, report.

What the emulation pass does on a modelled device: nothing, it is not run. Its purpose is to run
real ranks against virtual peers in real time; on a modelled GPU no rank runs in real time (the
device is a model), and the capture already ran the real program of every class of roles at full
size with every op's modelled time. The simulation of that graph over the cluster's network model is
the modelled iteration: every compute span is modelled kernel time, every collective and transfer
has its full-size bytes and the network model's time, and the schedule's overlaps (gradient
reduce-scatter and parameter all-gather on their own streams, pipeline transfers) are the
simulation's. The capture runs `driver.MODELLED_CAPTURE_ITERS` iterations (one warm-up, one
recorded): the modelled times are deterministic, so more would repeat the same spans.

This module makes the report's `ModelledReport` from the simulation and the captured ranks' results.
"""

from __future__ import annotations

from typing import Any

from prism_megatron.emulation.plan import RunPlan
from prism_megatron.report.modelled import ModelledReport

COMPUTE_KINDS = ("gemm", "attention", "memory", "launch")


def peak_tflops(gpu: str) -> tuple[str, float]:
    """The GPU's display name and dense BF16 peak (10^12 FLOP/s), from the GPU model's specs."""
    from prism_megatron.gpu_model import gpu_spec

    spec = gpu_spec(gpu)
    return spec.display_name, spec.bf16_flops_per_s / 1e12


def _attention_kernel(gpu: str, results: dict[int, dict[str, Any]]) -> str | None:
    """The fused attention kernel the captured ranks were timed with, by name (None where no rank
    ran one or said which)."""
    from prism_megatron.gpu_model.specs import attention_kernel_name

    kernels = {(data.get("modelled_device") or {}).get("attention_kernel") for data in results.values()}
    kernels.discard(None)
    return ", ".join(attention_kernel_name(gpu, k) for k in sorted(kernels)) or None


def _over_capacity(plan: RunPlan, results: dict[int, dict[str, Any]]) -> tuple[float, dict[str, int]]:
    """The memory the GPU reports, and the captured roles whose peak allocated memory exceeds it."""
    from prism_megatron.gpu_model import gpu_spec

    capacity = gpu_spec(plan.config.emulation.modelled_gpu).device_memory_bytes
    over: dict[str, int] = {}
    for rank, data in results.items():
        peak = (data.get("memory") or {}).get("peak_bytes")
        if peak is not None and peak > capacity:
            role = plan.layout.role_of(rank).name
            over[role] = max(over.get(role, 0), int(peak))
    return capacity, over


def _compute_split(plan: RunPlan, role: str, results: dict[int, dict[str, Any]]) -> dict[str, float]:
    """Fractions of the role's compute by kind: the last recorded iteration of its own captured rank,
    else of a captured member of its class (or of any captured rank when none of its class left
    results)."""
    members = next((c.members for c in plan.role_classes if role in c.members), ())
    by_role = {plan.layout.role_of(rank).name: data for rank, data in results.items()}
    candidates = [by_role[m] for m in (role, *members) if m in by_role] or list(results.values())
    for data in candidates:
        iterations = (data.get("modelled_device") or {}).get("iterations_by_kind_ns") or []
        if iterations:
            last = iterations[-1]
            total = sum(last.get(kind, 0) for kind in COMPUTE_KINDS)
            if total > 0:
                return {kind: last.get(kind, 0) / total for kind in COMPUTE_KINDS}
    return dict.fromkeys(COMPUTE_KINDS, 0.0)


def modelled_report(
    plan: RunPlan,
    sim_result,
    results: dict[int, dict[str, Any]],
    *,
    model_flops: float | None,
    tokens_per_iteration: int | None,
) -> ModelledReport | None:
    """The modelled iteration of the job (None before the simulation has run)."""
    from prism_megatron.sim import breakdown

    gpu = plan.config.emulation.modelled_gpu
    if gpu is None or sim_result is None:
        return None
    name, peak = peak_tflops(gpu)
    iteration_s = sim_result.iteration_time_ns / 1e9
    world_size = plan.layout.world_size
    tflops = model_flops / (iteration_s * world_size) / 1e12 if model_flops and iteration_s else None
    tokens = (
        tokens_per_iteration / (iteration_s * world_size) if iteration_s and tokens_per_iteration else None
    )
    capacity, over = _over_capacity(plan, results)
    rows = breakdown(sim_result)
    critical = max(rows, key=lambda row: row.compute_ns)
    split = _compute_split(plan, critical.role, results)
    by_kind = {kind: critical.compute_ns * split[kind] / 1e9 for kind in COMPUTE_KINDS}
    by_kind["exposed_communication"] = critical.exposed_comm_ns / 1e9
    by_kind["pipeline_bubble"] = critical.bubble_ns / 1e9
    return ModelledReport(
        gpu=gpu,
        gpu_name=name,
        peak_tflops=peak,
        iteration_time_s=iteration_s,
        tflops_per_gpu=tflops,
        mfu=tflops / peak if tflops is not None else None,
        tokens_per_s_per_gpu=tokens,
        critical_role=critical.role,
        time_by_kind_s=by_kind,
        moe_routing="balanced" if plan.job.model.num_experts else None,
        attention_kernel=_attention_kernel(gpu, results),
        memory_capacity_bytes=capacity,
        over_capacity=over,
    )
