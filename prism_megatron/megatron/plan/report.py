"""The plan as text (for a terminal) and as JSON-ready dicts (for files and benchmarks)."""

from __future__ import annotations

import dataclasses
from typing import Any

from prism_megatron.megatron.job.job import Job
from prism_megatron.megatron.plan.rank_plan import RankPlan
from prism_megatron.topology import format_ranks

_CATEGORIES = (
    ("parameters", "parameters"),
    ("gradients", "gradients"),
    ("optimizer_main_params", "optimizer: main params"),
    ("optimizer_grad_copies", "optimizer: fp32 grad copies"),
    ("optimizer_moments", "optimizer: moments"),
    ("activations", "activations (estimate)"),
)


def gib(num_bytes: float) -> str:
    return f"{num_bytes / 2**30:.2f} GiB"


def job_summary(job: Job) -> dict[str, Any]:
    """The derived sizes of the job that a reader needs to check a plan (the target job's, then the
    plan's own settings)."""
    a, target = job.args, job.target
    sizes = target.sizes
    return {
        "world_size": target.world_size,
        "tp": sizes.tp,
        "pp": sizes.pp,
        "vpp": sizes.vpp,
        "cp": sizes.cp,
        "ep": sizes.ep,
        "etp": sizes.etp,
        "dp": target.data_parallel_size,
        "order": sizes.order,
        "num_microbatches": target.schedule.num_microbatches,
        "padded_vocab_size": target.model.padded_vocab_size,
        "params_dtype": str(a.params_dtype).removeprefix("torch."),
        "distributed_optimizer": a.use_distributed_optimizer,
        "recompute": a.recompute_granularity or "none",
        "layers_per_stage": list(target.schedule.layers_per_stage or ()),
        "ignored_flags": list(job.flags.ignored),
    }


def rank_dict(plan: RankPlan) -> dict[str, Any]:
    """One rank's plan as plain data: bytes per category with sources, buffers, Megatron's estimate."""
    categories = {
        name: {"bytes": getattr(plan, name).bytes, "source": getattr(plan, name).source}
        for name, _ in _CATEGORIES
    }
    return {
        "virtual_rank": plan.virtual_rank,
        "coords": plan.coords,
        "num_params": plan.num_params,
        "bytes": categories,
        "static_bytes": plan.static_bytes,
        "total_bytes": plan.total_bytes,
        "chunks": [dataclasses.asdict(chunk) for chunk in plan.chunks],
        "buffers": [
            {**dataclasses.asdict(b), "param_dtype": str(b.param_dtype), "grad_dtype": str(b.grad_dtype)}
            for b in plan.buffers
        ],
        "megatron_estimate": {**dataclasses.asdict(plan.megatron), "total_bytes": _megatron_total(plan)},
        "differences": plan.differences,
        "seconds": round(plan.seconds, 3),
        "built_as": plan.built_as,
    }


def _numbers(plan: RankPlan) -> tuple:
    """Everything the text report prints for a rank, except its identity."""
    return (
        plan.coords["pp"],
        plan.num_params,
        tuple(getattr(plan, name).bytes for name, _ in _CATEGORIES),
        tuple(plan.differences),
    )


def _megatron_total(plan: RankPlan) -> int:
    return plan.megatron.weight_and_optimizer_bytes + plan.megatron.activation_bytes


def format_text(job: Job, plans: list[RankPlan]) -> str:
    """A terminal report: the job, then per rank the categories beside Megatron's estimate."""
    s = job_summary(job)
    lines = [
        f"job: {s['world_size']} GPUs, TP{s['tp']} PP{s['pp']}"
        + (f" VPP{s['vpp']}" if s["vpp"] else "")
        + f" CP{s['cp']} EP{s['ep']} ETP{s['etp']} DP{s['dp']}, {s['num_microbatches']} microbatches, "
        f"{s['params_dtype']}, distributed optimizer {'on' if s['distributed_optimizer'] else 'off'}, "
        f"recompute {s['recompute']}"
    ]
    alike: dict[tuple, list[RankPlan]] = {}
    for plan in plans:
        alike.setdefault(_numbers(plan), []).append(plan)
    for group in alike.values():
        plan = group[0]
        coords = " ".join(f"{k}={v}" for k, v in plan.coords.items())
        lines.append("")
        lines.append(f"rank {plan.virtual_rank} ({coords}): {plan.num_params / 1e9:.3f} B parameters")
        for name, label in _CATEGORIES:
            quantity = getattr(plan, name)
            lines.append(f"  {label:<28} {gib(quantity.bytes):>12}   {quantity.source}")
        lines.append(f"  {'total':<28} {gib(plan.total_bytes):>12}")
        m = plan.megatron
        lines.append(
            f"  Megatron's estimate: weights+optimizer {gib(m.weight_and_optimizer_bytes)} "
            f"({m.num_params / 1e9:.3f} B params x {m.bytes_per_param:.2f} B), activations "
            f"{gib(m.activation_bytes)} ({m.activation_formula}); plan: {gib(plan.static_bytes)} + "
            f"{gib(plan.activations.bytes)}"
        )
        lines.extend(f"    - {note}" for note in plan.differences)
        if len(group) > 1:
            others = format_ranks([p.virtual_rank for p in group[1:]])
            lines.append(f"  the same for rank(s) {others}")
    return "\n".join(lines)
