"""How long a selection of the fidelity suite takes, before it runs (`--plan` prints it).

The sleep-compute cases' steps are fixed by their sleeps, so their durations follow from the job:
a 1F1B iteration takes (micro-batches + PP - 1) stage-steps (with VPP, (micro-batches + (PP - 1) /
VPP)), a stage-step being a micro-batch's forward and backward over the stage's layers; a straggler
on the critical path adds about a fifth. The GPT's iteration and the start-up of a set of processes
are measured constants of a quiet 2-core machine. On a loaded machine everything takes longer.
"""

from __future__ import annotations

from benchmarks.fidelity.calibrate import LARGE_SIZES_BYTES, LEAD_IN_S, SIZES_BYTES
from benchmarks.fidelity.concurrency import LEVELS as CONCURRENCY_LEVELS

STARTUP_S = {"sleep-compute": 3.0, "real-compute": 5.0}
"""Forking a pass's processes, bring-up, model and optimizer, teardown (quiet machine)."""
GPT_ITERATION_S = 0.25
"""The tiny GPT's iteration with one thread (126-242 ms in the 2026-11-29 run)."""
MEMORY_ITERATIONS = {"sleep-compute": 2, "real-compute": 0}
STEP_S = {"job": LEAD_IN_S + 0.01, "alone": 0.01, "concurrent": LEAD_IN_S + 0.01}
"""One measured op of a calibration: the job pattern's lead-in and op, or the alone pattern's
barrier, jitter and op (the concurrent pattern's are the job pattern's, at each of its levels)."""


def iteration_s(case) -> float:
    job = case.job
    if job.gpt_flags:
        return GPT_ITERATION_S
    stage_step_s = job.num_layers / job.pp * (job.fwd_ms + job.bwd_ms) / 1e3
    fill = (job.pp - 1) / (job.vpp or 1)
    return (job.num_microbatches + fill) * stage_step_s * (1.2 if job.stragglers else 1.0)


def _run_s(case, iterations: int) -> float:
    return STARTUP_S[case.kind] + (iterations + MEMORY_ITERATIONS[case.kind]) * iteration_s(case)


def case_seconds(case, num_models: int) -> float:
    """Capture (unless the case reuses a graph), then every round's real run and emulations."""
    from prism_megatron.topology import Layout

    capture = 0.0
    if case.graph_of is None:
        slice_size = len(Layout(**case.job.layout_kwargs()).default_slice())
        capture = slice_size * _run_s(case, case.capture_iters)
    return capture + case.rounds * (1 + num_models) * _run_s(case, case.iterations)


def calibration_seconds(selection) -> float:
    from benchmarks.fidelity.compare import group_sizes

    total, seen = 0.0, set()
    for case in selection.cases:
        for model in selection.models:
            key = (model, case.kind, case.job.world_size if model != "alone" else 0)
            if key in seen:
                continue
            seen.add(key)
            sizes = set(group_sizes(case.job)) | {2}
            steps = sum(len(SIZES_BYTES) + (len(LARGE_SIZES_BYTES) if n == 2 else 0) for n in sizes)
            steps += len(SIZES_BYTES) + len(LARGE_SIZES_BYTES)  # the exchanges
            if model == "concurrent":
                steps = (len(sizes) + 1) * len(SIZES_BYTES) * len(CONCURRENCY_LEVELS)
            else:
                steps += 2 * (len(SIZES_BYTES) + len(LARGE_SIZES_BYTES))  # the two-peer batches
            total += selection.repeats * (selection.repetitions + 3) * steps * STEP_S[model]
    return total


def suite_seconds(selection) -> float:
    return calibration_seconds(selection) + sum(
        case_seconds(c, len(selection.models)) for c in selection.cases
    )


def describe(selection) -> str:
    """One line per case and the total, for the terminal."""
    lines = [
        f"fidelity ({selection.form}): {len(selection.cases)} cases, models {', '.join(selection.models)}, "
        f"calibrations x{selection.repeats}: about {calibration_seconds(selection) / 60:.1f} min"
    ]
    for case in selection.cases:
        reuse = f", graph of {case.graph_of}" if case.graph_of else ""
        lines.append(
            f"  {case.name}: {case.rounds} rounds x {case.iterations} iterations of ~{iteration_s(case):.2f} s"
            f"{reuse}: about {case_seconds(case, len(selection.models)) / 60:.1f} min"
        )
    lines.append(
        f"expected duration on a quiet 2-core machine: about {suite_seconds(selection) / 60:.0f} min"
    )
    return "\n".join(lines)
