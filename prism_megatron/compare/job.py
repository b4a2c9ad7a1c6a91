"""Are two run folders runs of the same job? A comparison across jobs would judge the job, not the change.

The job is what report.json says of the target (world size, parallel sizes, rank order, batch
shape), the model (its FLOPs per iteration stand for its shape), which ranks were real and on what
device. What may differ is what a comparison is for: the code (Megatron, prism-megatron, torch
versions), the cluster, stragglers, and anything else under `prism`.
"""

from __future__ import annotations

from prism_megatron.report.model import RunReport, target_to_json


def job_fields(report: RunReport) -> dict[str, object]:
    """The fields that name the job, flattened ("target.tp", "real_ranks", ...)."""
    fields: dict[str, object] = {f"target.{k}": v for k, v in target_to_json(report.target).items()}
    fields["real_ranks"] = list(report.real_ranks)
    fields["model_flops_per_iteration"] = report.model_flops_per_iteration
    fields["device"] = (report.prism.get("emulation") or {}).get("device")
    return fields


def differing_fields(a: RunReport, b: RunReport) -> dict[str, tuple[object, object]]:
    """Field -> (value in A, value in B), for every job field that differs."""
    fields_a, fields_b = job_fields(a), job_fields(b)
    return {
        key: (fields_a.get(key), fields_b.get(key))
        for key in dict.fromkeys([*fields_a, *fields_b])
        if fields_a.get(key) != fields_b.get(key)
    }


def check_same_job(a: RunReport, b: RunReport, names: tuple[str, str] = ("RUN_A", "RUN_B")) -> None:
    """Raise ValueError naming every field that differs (one line) when A and B are different jobs."""
    differ = differing_fields(a, b)
    if differ:
        shown = "; ".join(f"{key}: {va!r} vs {vb!r}" for key, (va, vb) in differ.items())
        raise ValueError(
            f"{names[0]} and {names[1]} are runs of different jobs ({shown}); compare runs of one "
            "configuration, before and after a change"
        )
