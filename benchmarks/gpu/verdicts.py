"""The GPU run's verdict: one PASS / FAIL / NOT RUN row per stage and check, from what really happened.

Why: a developer lent a GPU for a few minutes runs `benchmarks/gpu/run.sh` once; its last lines must
say, without reading any number, what holds. A verdict comes from the step's record first
(``WORK/steps.tsv``: ok, failed, crashed, timeout, skipped) and only then from the numbers the stage
left (``WORK/<step>/<stage>.json``):

* a step that crashed, timed out or failed is FAIL, with its note (the signal or exit status and the
  first error line), whatever numbers it left;
* a step that passed but left no numbers where a check needs them is FAIL (never PASS);
* a skipped step is NOT RUN with the reason (a missing prerequisite, ``--only``, the time budget);
* a stage that run.sh knows but never reached has a NOT RUN row too: every stage has a row.

In a dry run (``--dry-run``: the CPU and the test device standing in for the GPU) the checks of
correctness are judged as on the GPU; checks of timing are shown as CPU (the CPU's times say
nothing of the GPU's) and never fail the run.

The checks and their bounds:

* backend creation and every op family on the device, 1 and 2 real processes (``backend_ops``);
* more than 32 helper jobs of two real ranks sharing the device, right values (``shared_gpu_jobs``);
* a collective's consumer ordered by streams alone, and the host not blocked (``stream_ordering``);
* the main claim (``main_claim``): compute per iteration and per span within 2 %, iteration within 1 %
  of its simulation, the requested bytes' peak equal to the run without prism (the allocator's peak
  shown beside it) and the allocator's peak within 5 % of the plan;
* the GPU model's kernel times against this GPU's (``model_kernels``): median |error| <= 10 % over
  the configurations' GEMMs, <= 15 % over cuDNN attention, copies beyond the L2 (>= 64 MiB) within 10 %;
* wait-kernel error: median <= 2 us for every wait of >= 100 us (``wait_precision``);
* memory ground truth: TP2 x DP2 against 1 real + 3 virtual, requested and allocator peaks identical
  (``memory_ground_truth``);
* the built-in GPT captured on the GPU: spans within 2 % of torch.profiler (``gpt_capture_profile``);
* a Llama-3-8B-shaped rank at W = 8192: within 1 % of its simulation, compute within 2 %
  (``emulated_llama_rank``).

Run: ``python -m benchmarks.gpu.verdicts --work WORK [--stages a,b,...] [--dry-run] [--md PATH]``;
prints the table; exits 1 when a row is FAIL.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from collections.abc import Callable
from dataclasses import dataclass

WAIT_FROM_US = 100.0
WAIT_MEDIAN_US = 2.0
EMULATED_TOLERANCE = 0.01
COMPUTE_TOLERANCE = 0.02
FOLLOW_UPS = ("_backtrace", "_malloc_check")

Verdict = tuple[str, str]  # (PASS | FAIL | NOT RUN, evidence)


@dataclass(frozen=True, kw_only=True)
class Check:
    label: str
    """What holds when it passes, as the table says it."""
    judge: Callable[[dict], Verdict]
    """From the stage's JSON to a verdict."""
    timing: bool
    """A bound on time: judged on the GPU only (a dry run shows it as CPU)."""


def backend_ops(result: dict, num_processes: int) -> Verdict:
    run = result["runs"].get(str(num_processes))
    if run is None:
        return "FAIL", "no run"
    if not run["created"]:
        return "FAIL", "backend creation failed: " + (run.get("errors") or ["?"])[0].strip().splitlines()[-1]
    if run["failed_ops"]:
        return "FAIL", "wrong results: " + ", ".join(run["failed_ops"])
    return "PASS", f"{len(run['ops'])} ops equal to the host path"


def shared_gpu_jobs(result: dict) -> Verdict:
    if result["errors"]:
        return "FAIL", result["errors"][0].strip().splitlines()[-1]
    if result["wrong"]:
        return "FAIL", f"{len(result['wrong'])} wrong values, first: {result['wrong'][0]}"
    return "PASS", f"{result['helper_jobs_per_process']} helper jobs per process in {result['seconds']:.1f} s"


def stream_order(result: dict) -> Verdict:
    checks = result["checks"]
    held = checks["consumer_after_completion"] and checks["consumer_read_result"]
    held = held and checks["control_discriminates"]
    consumer = result["consumer_after_start_ms"]
    return ("PASS" if held else "FAIL"), (
        f"consumer at >= {consumer['min']:.2f} ms (bound {result['arrival_ms'] + result['cost_ms']:g}), "
        f"result read: {checks['consumer_read_result']}, control told apart: {checks['control_discriminates']}"
    )


def no_host_sync(result: dict) -> Verdict:
    host = result["host_ms"]
    return ("PASS" if result["checks"]["host_never_waited"] else "FAIL"), f"host max {host['max']:.3f} ms"


def main_claim(result: dict, part: str) -> Verdict:
    from benchmarks.gpu.main_claim import verdicts as claim_verdicts

    holds, evidence = claim_verdicts(result)[part]
    return ("PASS" if holds else "FAIL"), evidence


def model_kernels(result: dict, family: str) -> Verdict:
    from benchmarks.gpu.model_kernels import verdicts as kernel_verdicts

    holds, evidence = kernel_verdicts(result)[family]
    return ("PASS" if holds else "FAIL"), evidence


def wait_precision(result: dict) -> Verdict:
    judged = [r for r in result["rows"] if r["target_us"] >= WAIT_FROM_US]
    if not judged:
        return "FAIL", "no waits of >= 100 us measured"
    worst = max(judged, key=lambda r: r["median_us"])
    status = "PASS" if worst["median_us"] <= WAIT_MEDIAN_US else "FAIL"
    return status, f"worst median {worst['median_us']:.2f} us (wait {worst['target_us']:.0f} us)"


def gpt_capture(result: dict) -> Verdict:
    if "error" in result:
        return "FAIL", result["error"]
    spans = result.get("spans") or []
    if not spans:
        return "FAIL", "no span matched to the profiler trace"
    worst = max(spans, key=lambda s: s["error_pct"])
    unpaired = result.get("unpaired_spans", 0)
    status = "PASS" if all(s["within"] for s in spans) and not unpaired else "FAIL"
    return status, (
        f"{len(spans)} spans, worst {worst['error_pct']:.2f} % ({worst['captured_us']:.1f} us), "
        f"{unpaired} without their stamp kernels"
    )


def memory(result: dict) -> Verdict:
    diff = result["memory_diff_bytes"]
    return (
        "PASS" if diff == 0 else "FAIL"
    ), f"real {result['real_peak_bytes']} B, emulated {result['emulated_peak_bytes']} B"


def requested_memory(result: dict) -> Verdict:
    real, emulated = result["real_requested_peak_bytes"], result["emulated_requested_peak_bytes"]
    if real is None or emulated is None:
        return "FAIL", "no requested-bytes peak recorded (a CUDA allocator's statistic)"
    return (
        "PASS" if real == emulated else "FAIL"
    ), f"real {real} B, emulated {emulated} B requested at the peak"


def llama(result: dict) -> Verdict:
    emulated, simulated = result.get("iteration_s"), result.get("simulated_iteration_time_s")
    compute = result.get("compute_error_pct")
    if emulated is None or simulated is None or compute is None:
        return "FAIL", "the stage left no iteration, simulation or compute numbers"
    error = abs(emulated - simulated) / simulated
    status = "PASS" if error <= EMULATED_TOLERANCE and abs(compute) <= 100 * COMPUTE_TOLERANCE else "FAIL"
    return status, f"emulated {100 * error:.2f} % from simulation, compute {compute:+.2f} % vs stage alone"


EXIT_IS_ITS_CHECKS = ("main_claim",)
"""Stages whose exit status 1 says only that one of their checks does not hold (after their results
are written): each check reads its own part. Any other failed step is FAIL whatever its numbers say."""

CHECKS: dict[str, tuple[Check, ...]] = {
    "main_claim": tuple(
        Check(label=f"main claim: {part}", judge=lambda r, p=part: main_claim(r, p), timing=part != "memory")
        for part in ("compute", "spans", "iteration", "memory", "plan")
    ),
    "model_kernels": (
        Check(label="GPU model: GEMMs, median within 10 %", judge=lambda r: model_kernels(r, "gemm"), timing=True),
        Check(label="GPU model: cuDNN attention, median within 15 %", judge=lambda r: model_kernels(r, "attention"), timing=True),
        Check(label="GPU model: copies beyond the L2 within 10 %", judge=lambda r: model_kernels(r, "copy"), timing=True),
    ),
    "stream_ordering": (
        Check(label="consumer ordered by streams, reads the result", judge=stream_order, timing=False),
        Check(label="no host sync at the collective", judge=no_host_sync, timing=True),
    ),
    "shared_gpu_jobs": (Check(label="> 32 jobs of two real ranks on one device", judge=shared_gpu_jobs, timing=False),),
    "backend_ops": (
        Check(label="backend + op families, 1 process", judge=lambda r: backend_ops(r, 1), timing=False),
        Check(label="backend + op families, 2 processes", judge=lambda r: backend_ops(r, 2), timing=False),
    ),
    "wait_precision": (Check(label="wait kernel: median <= 2 us (waits >= 100 us)", judge=wait_precision, timing=True),),
    "memory_ground_truth": (
        Check(label="memory ground truth: TP2xDP2 requested peak identical", judge=requested_memory, timing=False),
        Check(label="memory ground truth: TP2xDP2 allocator peak identical", judge=memory, timing=False),
    ),
    "gpt_capture_profile": (Check(label="GPT capture: spans within 2 % of profiler", judge=gpt_capture, timing=True),),
    "emulated_llama_rank": (Check(label="Llama-3-8B rank W=8192: 1 % / 2 %", judge=llama, timing=True),),
}  # fmt: skip


def read_steps(work_dir: str) -> dict[str, tuple[str, str]]:
    """Each step's (status, note) from steps.tsv; the last record of a name wins."""
    steps: dict[str, tuple[str, str]] = {}
    path = os.path.join(work_dir, "steps.tsv")
    if os.path.exists(path):
        with open(path) as f:
            for line in f:
                name, status, _seconds, note = [*line.rstrip("\n").split("\t", 3), "", "", ""][:4]
                steps[name] = (status, note)
    return steps


def _find(work_dir: str, step: str, stage: str) -> dict | None:
    paths = sorted(glob.glob(os.path.join(work_dir, step, f"{stage}.json")))
    if not paths:
        return None
    with open(paths[0]) as f:
        return json.load(f)


def _judged(check: Check, result: dict | None, dry_run: bool) -> Verdict:
    if result is None:
        return "FAIL", "the stage passed but left no results"
    try:
        status, evidence = check.judge(result)
    except (KeyError, TypeError, ZeroDivisionError, IndexError) as exc:
        return "FAIL", f"results without {exc}"
    if dry_run and check.timing:
        return "CPU", f"not judged on the CPU: {evidence}"
    return status, evidence


def stage_rows(work_dir: str, stage: str, steps: dict, dry_run: bool) -> list[tuple[str, str, str, str]]:
    """(stage, check, status, evidence) rows of one stage: its step's fate first, then its checks."""
    checks = CHECKS.get(stage) or (None,)
    if stage not in steps:
        return [(stage, c.label if c else "ran", "NOT RUN", "run.sh never reached it") for c in checks]
    status, note = steps[stage]
    if status == "skipped":
        return [(stage, c.label if c else "ran", "NOT RUN", note) for c in checks]
    result = _find(work_dir, stage, stage) if checks != (None,) else None
    if status == "failed" and result is not None and stage in EXIT_IS_ITS_CHECKS:
        return [(stage, c.label, *_judged(c, result, dry_run)) for c in checks]
    if status in ("crashed", "timeout", "failed"):
        evidence = f"{status}: {note}".rstrip(": ")
        return [(stage, c.label if c else "ran", "FAIL", evidence) for c in checks]
    if checks == (None,):
        return [(stage, "ran", "PASS", "exit status 0")]
    return [(stage, c.label, *_judged(c, result, dry_run)) for c in checks]


def verdicts(
    work_dir: str, stages: list[str] | None = None, dry_run: bool = False
) -> list[tuple[str, str, str, str]]:
    """Rows for the named stages (run.sh's list, in its order), then for any other step it recorded."""
    steps = read_steps(work_dir)
    named = list(stages or [])
    named += [s for s in steps if s not in named and not s.endswith(FOLLOW_UPS)]
    named += [s for s in CHECKS if s not in named]
    rows = []
    for stage in named:
        rows += stage_rows(work_dir, stage, steps, dry_run)
        for follow_up in FOLLOW_UPS:
            if stage + follow_up in steps:
                status, note = steps[stage + follow_up]
                rows.append((stage + follow_up, "diagnosis", "INFO", f"{status}: {note}".rstrip(": ")))
    return rows


def table(rows: list[tuple[str, str, str, str]], dry_run: bool) -> str:
    title = "## Verdict (dry run: CPU and test device)" if dry_run else "## Verdict"
    lines = [title, "", "| stage | check | result | evidence |", "|---|---|---|---|"]
    lines += [f"| {stage} | {label} | **{status}** | {evidence} |" for stage, label, status, evidence in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="run.sh's work directory")
    parser.add_argument("--stages", default="", help="run.sh's stages in order, comma-separated")
    parser.add_argument("--dry-run", action="store_true", help="timing checks are not judged (CPU)")
    parser.add_argument("--md", help="also write the table here")
    args = parser.parse_args(argv)
    rows = verdicts(args.work, [s for s in args.stages.split(",") if s], args.dry_run)
    text = table(rows, args.dry_run)
    print(text)
    for stage, label, status, _ in rows:
        print(f"{status:8s} {stage}: {label}")
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    return 1 if any(status == "FAIL" for *_, status, _ in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
