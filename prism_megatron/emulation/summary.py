"""The few lines a finished run prints: emulated vs simulated time, the capture, roles, real ranks, outputs."""

from __future__ import annotations

import os
import statistics
from collections.abc import Sequence

from prism_megatron import files
from prism_megatron.emulation.driver import RunOutcome
from prism_megatron.report.agreement import RankAgreement, describe

_MIB = 2**20


def format_summary(outcome: RunOutcome) -> str:
    report, plan = outcome.report, outcome.plan
    lines = [f"run folder: {plan.out_dir} (status {report.status})"]
    if report.failure is not None:
        lines.append(f"failure: {report.failure.message}")
    measured = [it for it in report.iterations if not it.warmup]
    if report.iteration_time_s is not None:
        lines.append(
            f"emulated iteration time:  {report.iteration_time_s * 1e3:9.2f} ms  (median of {len(measured)} "
            f"iterations after {len(report.iterations) - len(measured)} warm-up, slowest real rank)"
        )
    if report.modelled is not None:
        lines.append(report.modelled.summary_line())
        if (warning := report.modelled.memory_warning()) is not None:
            lines.append(warning)
    if report.simulated_iteration_time_s is not None:
        lines.append(
            f"simulated iteration time: {report.simulated_iteration_time_s * 1e3:9.2f} ms  (graph as captured"
            + _against_capture(report)
            + ")"
        )
    lines += agreement_lines(report.agreement)
    for rank, data in sorted(outcome.results.items()):
        between = _between_iterations(data.get("prism_phase") or {})
        if between:
            lines.append(f"real rank {rank} between iterations (in none of their times): {between}")
    closed = _closed_loop_s(report)
    if closed is not None:
        lines.append(
            f"closed loop, last schedule: {closed * 1e3:7.2f} ms  (simulation with the last measured spans)"
        )
    if report.capture is not None:
        lines.append(f"capture: {report.capture.describe()}")
    if report.tflops_per_gpu is not None:
        lines.append(f"model throughput: {report.tflops_per_gpu:.4f} TFLOP/s per GPU")
    if report.roles:
        lines.append("")
        lines.append(
            f"{'role':<14} {'ranks':>6} {'compute ms':>11} {'exposed comm ms':>16} {'bubble ms':>10}"
        )
        for role in report.roles:
            lines.append(
                f"{role.role:<14} {role.count:>6} {role.compute_s * 1e3:>11.2f} "
                f"{role.exposed_comm_s * 1e3:>16.2f} {role.bubble_s * 1e3:>10.2f}"
            )
    if report.ranks:
        lines.append("")
        lines.append(f"{'real rank':>9} {'role':<14} {'peak memory MiB':>16}  at the peak (MiB)")
        for rank, data in sorted(report.ranks.items()):
            peak = (
                "-"
                if data.peak_memory_allocated_bytes is None
                else f"{data.peak_memory_allocated_bytes / _MIB:.1f}"
            )
            parts = ", ".join(f"{k} {v / _MIB:.1f}" for k, v in data.memory_by_category.items() if v)
            lines.append(f"{rank:>9} {data.role or '-':<14} {peak:>16}  {parts}")
    lines.append("")
    for name in (files.REPORT_MD, files.REPORT_JSON, files.TIMELINE_JSON):
        if name in outcome.written or name.removesuffix(".json") in outcome.written:
            lines.append(f"wrote {os.path.join(plan.out_dir, name)}")
    graph_dir = plan.path(files.GRAPH_DIR)
    if os.path.isfile(os.path.join(graph_dir, files.GRAPH_FILE)):  # a run that failed first wrote none
        lines.append(f"wrote {graph_dir}/ (reuse: --prism-graph, prism-megatron simulate)")
    return "\n".join(lines)


def agreement_lines(found: Sequence[RankAgreement]) -> list[str]:
    """Per real rank, its emulated iterations against the schedule each ran: its simulation, its
    expected time, its replay with the iteration's own measurements (where recorded), and the rank's
    compute against the schedule's."""
    lines = []
    for agreement in found:
        lines.append(
            f"real rank {agreement.virtual_rank}: emulated against the simulation of the schedule each "
            f"iteration ran: {describe(agreement)}"
        )
        if agreement.expected_s is not None:
            lines.append(
                f"real rank {agreement.virtual_rank}: emulated against that schedule's expected time (replayed "
                f"with each iteration it was simulated from): {describe(agreement, 'expected')}"
            )
        if agreement.replayed_s is not None:
            lines.append(
                f"real rank {agreement.virtual_rank}: emulated against that schedule replayed with the "
                f"iteration's own measurements: {describe(agreement, 'replayed')}"
            )
        if agreement.compute_drift_pct is not None:
            lines.append(
                f"real rank {agreement.virtual_rank}: its compute in each iteration against what that schedule "
                f"assumed: "
                f"{describe(agreement, 'compute')}"
            )
    return lines


def _against_capture(report) -> str:
    """'; real ranks' median compute in the emulation against the capture's: rank 0 +12.3 %, ...'
    (`RankAgreement.compute_against_capture_pct`), or ''."""
    parts = [
        f"rank {a.virtual_rank} {a.compute_against_capture_pct:+.1f} %"
        for a in report.agreement
        if a.compute_against_capture_pct is not None
    ]
    return (
        f"; real ranks' median compute in the emulation against the capture's: {', '.join(parts)}"
        if parts
        else ""
    )


def _closed_loop_s(report) -> float | None:
    finals = [a.closed_loop_final_s for a in report.agreement if a.closed_loop_final_s is not None]
    return statistics.median(finals) if finals else None


def _between_iterations(phase: dict) -> str | None:
    """The host work between iterations and the wait for the agreed start, medians in ms."""
    resimulation = phase.get("resimulation_s") or []
    starts = phase.get("agreed_starts") or []
    parts = []
    if resimulation:
        parts.append(f"re-simulation {statistics.median(resimulation) * 1e3:.2f} ms")
    if starts:
        waited = statistics.median(s["waited_s"] for s in starts) * 1e3
        late = [s["late_s"] for s in starts if s["late_s"] > 10e-6]
        parts.append(f"wait for the agreed start {waited:.2f} ms")
        parts.append(
            f"started more than 10 us late {len(late)} of {len(starts)} times"
            + (f" (at most {max(late) * 1e6:.0f} us)" if late else "")
        )
    return ", ".join(parts) if parts else None
