"""The run's report from what the passes left in the run folder (`prism_megatron.report` renders it).

`report.json` is written when the run starts (status "running"), and again at the end with status
"ok", "failed" or "interrupted" (stopped by a signal): a failed or interrupted run keeps everything
measured up to its end (the graph, the simulation, the results and op logs of ranks that finished,
the iteration times in the progress files) and says why it ended.
"""

from __future__ import annotations

import dataclasses
import json
import os
from typing import Any

from prism_megatron import files
from prism_megatron.emulation import modelled_run
from prism_megatron.emulation.plan import RunPlan
from prism_megatron.passes.rank import NUM_WARMUP, read_progress
from prism_megatron.report import (
    Failure,
    RankReport,
    RoleReport,
    RunReport,
    iterations_from_times,
    median_iteration_time_s,
    model_flops_per_iteration,
    tflops_per_gpu,
    tokens_per_s_per_gpu,
    write_report,
)
from prism_megatron.report.agreement import agreements
from prism_megatron.report.model import CaptureSummary
from prism_megatron.report.timeline import DEFAULT_MAX_VIRTUAL_TRACKS, modelled_ranks


def rank_results(directory: str) -> dict[int, dict[str, Any]]:
    """The per-rank results files (`rank-<rank>.json`) in a folder, by virtual rank."""
    out = {}
    for path in files.results_paths(directory):
        with open(path, encoding="utf-8") as f:
            data = json.load(f)
        out[int(data["virtual_rank"])] = data
    return out


def measured_results(plan: RunPlan) -> dict[int, dict[str, Any]]:
    """The real ranks' results; for a rank that wrote none (the run failed first), the iteration
    times its progress file holds, so a failed run's report keeps what was measured."""
    results = rank_results(plan.out_dir)
    for rank in plan.real_ranks:
        progress = None if rank in results else read_progress(files.progress_path(plan.out_dir, rank))
        if progress and progress.get("phase") == "emulate" and progress.get("iteration_times_s"):
            phase = {"iteration_times_s": progress["iteration_times_s"], "num_warmup": NUM_WARMUP}
            results[rank] = {"virtual_rank": rank, "prism_phase": phase, "partial": True}
    return results


def model_flops(plan: RunPlan) -> float | None:
    """Model FLOPs of one iteration of the plan's job; None when its flags do not give the model's
    shape or the batch (a Megatron-LM script whose tokenizer sets the vocabulary, for one)."""
    job = plan.job
    if job.global_batch_size is None or job.model.missing(
        "num_layers", "hidden_size", "num_attention_heads", "seq_length", "padded_vocab_size"
    ):
        return None
    return model_flops_per_iteration(job.model, job.global_batch_size)


def iteration_times(results: dict[int, dict[str, Any]]) -> list[float]:
    """Per iteration, the slowest real rank's wall time (the job's step ends when its last rank's does)."""
    per_rank = [r.get("prism_phase", {}).get("iteration_times_s", []) for r in results.values()]
    per_rank = [times for times in per_rank if times]
    if not per_rank:
        return []
    return [max(column) for column in zip(*per_rank, strict=False)]


def capture_summary(plan: RunPlan, graph, walls: dict[str, float], *, made_here: bool) -> CaptureSummary:
    """How `graph` was captured: its roles, classes and captured ranks, and, when this command ran
    the capture passes (`made_here`), how many and how long (`walls`: seconds per phase, a pass named
    capture-N, and "capture" for all of them when they ran at the same time); not when the graph came from --prism-graph or from passes launched by hand."""
    from prism_megatron.graph.classes import graph_classes

    passes = [seconds for name, seconds in walls.items() if name.startswith("capture-")]
    return CaptureSummary(
        num_roles=len(graph.roles),
        captured_ranks=dict(graph.metadata.extra.get("captured_ranks") or {}),
        classes={c.representative: c.members for c in graph_classes(graph)},
        all_roles=plan.config.capture.capture_all_roles,
        num_passes=len(passes) if made_here else None,
        capture_s=walls.get("capture", sum(passes)) if made_here and passes else None,
    )


def build_report(
    plan: RunPlan,
    *,
    status: str,
    sim_result=None,
    results: dict[int, dict[str, Any]] | None = None,
    failure: Failure | None = None,
    capture: CaptureSummary | None = None,
) -> RunReport:
    """The RunReport of what is known now (results: the emulated ranks' results files)."""
    from prism_megatron.sim import breakdown, rank_breakdown

    results = results or {}
    # A modelled run measured no iteration: its captured iterations are modelled compute alone, and
    # its iteration is the simulation's (`modelled`).
    times = [] if plan.modelled else iteration_times(results)
    iterations = iterations_from_times(times, num_warmup=NUM_WARMUP)
    iteration_time_s = median_iteration_time_s(iterations)
    flops = model_flops(plan)
    ranks = {
        v: RankReport.from_pieces(
            v,
            memory=data.get("memory"),
            breakdown=rank_breakdown(sim_result, v) if sim_result is not None else None,
            role=plan.layout.role_of(v).name,
            cpu_share=data.get("cpu_share"),
        )
        for v, data in results.items()
        if v in _real_ranks(plan)
    }
    modelled = None
    if plan.modelled:
        job = plan.job
        modelled = modelled_run.modelled_report(
            plan,
            sim_result,
            results,
            model_flops=flops,
            tokens_per_iteration=(job.global_batch_size or 0) * (job.model.seq_length or 0) or None,
        )
    patches: dict[str, int] = {}
    for data in results.values():
        for name, calls in (data.get("patches_used") or {}).items():
            patches[name] = patches.get(name, 0) + int(calls)
    return RunReport(
        target=plan.job,
        real_ranks=_real_ranks(plan),
        status=status,
        iterations=iterations,
        iteration_time_s=iteration_time_s,
        ranks=ranks,
        roles=tuple(RoleReport.from_breakdown(row) for row in breakdown(sim_result)) if sim_result else (),
        simulated_iteration_time_s=sim_result.iteration_time_ns / 1e9 if sim_result is not None else None,
        model_flops_per_iteration=flops,
        tflops_per_gpu=(
            tflops_per_gpu(flops, iteration_time_s, plan.layout.world_size)
            if flops and iteration_time_s
            else None
        ),
        tokens_per_s_per_gpu=(
            tokens_per_s_per_gpu(
                plan.job.global_batch_size,
                plan.job.model.seq_length,
                iteration_time_s,
                plan.layout.world_size,
            )
            if iteration_time_s and plan.job.global_batch_size and plan.job.model.seq_length
            else None
        ),
        failure=failure,
        prism=dataclasses.asdict(plan.config),
        patches=patches or None,
        capture=capture,
        agreement=agreements({v: data for v, data in results.items() if v in plan.real_ranks}),
        modelled=modelled,
    )


def _real_ranks(plan: RunPlan) -> tuple[int, ...]:
    """The ranks that ran the real program: on a modelled GPU the captured ones (no emulation pass)."""
    return tuple(sorted(plan.slice_ranks)) if plan.modelled else plan.real_ranks


def write_running(plan: RunPlan) -> None:
    """report.json saying the run is under way (plain, without rendering: the run has just begun)."""
    write_plain(plan, status="running")


def write_plain(
    plan: RunPlan, *, status: str, message: str | None = None, sim_result=None, capture=None
) -> None:
    """report.json alone (no rendering, no results read): the start of a run, or the last word of a
    run whose full report could not be written."""
    from prism_megatron.report import schema

    failure = Failure(message=message) if message else None
    doc = build_report(plan, status=status, sim_result=sim_result, failure=failure, capture=capture).to_json()
    schema.validate(doc)
    os.makedirs(plan.out_dir, exist_ok=True)
    files.write_json(doc, plan.path(files.REPORT_JSON), indent=1)


def write_final(plan: RunPlan, report: RunReport, sim_result=None):
    """report.md, timeline.json, the plots, then report.json (last: see `write_report`); returns
    what was written. On a modelled GPU the timeline draws the ranks --prism-ranks names first (the
    ranks the user asked about), then the captured ones and one per role (`modelled_ranks`)."""
    virtual_ranks = None
    if plan.modelled and sim_result is not None:
        asked = [r for r in plan.real_ranks if r not in report.real_ranks]
        virtual_ranks = modelled_ranks(sim_result, [*asked, *report.real_ranks], DEFAULT_MAX_VIRTUAL_TRACKS)
    return write_report(
        report, plan.out_dir, sim_result=sim_result, layout=plan.layout, virtual_ranks=virtual_ranks
    )
