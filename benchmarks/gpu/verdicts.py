"""The GPU run's verdict: one PASS / FAIL / NOT RUN line per check the GPU timing path must pass.

Why: a developer lent a GPU runs `benchmarks/gpu/run.sh` once; its last lines must say, without
reading any number, which of the checks hold. Each check reads the JSON a stage left in its step
directory (``WORK/<step>/<stage>.json``); a stage that did not run, or ran without its numbers,
is NOT RUN (never PASS).

The checks and their bounds:

* backend creation and every op family on CUDA tensors, 1 and 2 real processes (``backend_ops``);
* wait-kernel error: median <= 2 us for every wait of >= 100 us (``wait_precision``);
* the built-in GPT captured on the GPU: every compute span within 2 % of the device-time gap
  between the same ops in a torch.profiler trace of the same iteration (``gpt_capture_profile``);
* memory ground truth: TP2 x DP2, four real processes sharing the GPU against 1 real + 3 virtual,
  ``max_memory_allocated`` identical (``memory_ground_truth``);
* an emulated Llama-3-8B-shaped rank at W = 8192: emulated iteration within 1 % of its simulation,
  its compute within 2 % of the same stage run alone (``emulated_llama_rank``).

Run: ``python -m benchmarks.gpu.verdicts --work WORK``; prints the table, exits 1 when a check failed.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import sys
from collections.abc import Callable

WAIT_FROM_US = 100.0
WAIT_MEDIAN_US = 2.0
SPAN_TOLERANCE = 0.02
EMULATED_TOLERANCE = 0.01
COMPUTE_TOLERANCE = 0.02


def _find(work_dir: str, stage: str) -> dict | None:
    """The stage's JSON from whichever step directory holds it."""
    paths = sorted(glob.glob(os.path.join(work_dir, "*", f"{stage}.json")))
    if not paths:
        return None
    with open(paths[0]) as f:
        return json.load(f)


Verdict = tuple[str, str]  # (PASS | FAIL | NOT RUN, evidence)


def backend_ops(result: dict, num_processes: int) -> Verdict:
    run = result["runs"].get(str(num_processes))
    if run is None:
        return "NOT RUN", "no run"
    if not run["created"]:
        return "FAIL", "backend creation failed"
    if run["failed_ops"]:
        return "FAIL", "wrong results: " + ", ".join(run["failed_ops"])
    return "PASS", f"{len(run['ops'])} ops equal to the host path"


def wait_precision(result: dict) -> Verdict:
    judged = [r for r in result["rows"] if r["target_us"] >= WAIT_FROM_US]
    if not judged:
        return "NOT RUN", "no waits of >= 100 us"
    worst = max(judged, key=lambda r: r["median_us"])
    status = "PASS" if worst["median_us"] <= WAIT_MEDIAN_US else "FAIL"
    return status, f"worst median {worst['median_us']:.2f} us (wait {worst['target_us']:.0f} us)"


def gpt_capture(result: dict) -> Verdict:
    spans = result.get("spans") or []
    if not spans:
        return "NOT RUN", "no span matched to the profiler trace"
    worst = max(spans, key=lambda s: s["error_pct"])
    status = "PASS" if all(s["within"] for s in spans) else "FAIL"
    return status, f"{len(spans)} spans, worst {worst['error_pct']:.2f} % ({worst['captured_us']:.1f} us)"


def memory(result: dict) -> Verdict:
    diff = result["memory_diff_bytes"]
    return (
        "PASS" if diff == 0 else "FAIL"
    ), f"real {result['real_peak_bytes']} B, emulated {result['emulated_peak_bytes']} B"


def llama(result: dict) -> Verdict:
    emulated, simulated = result.get("iteration_s"), result.get("simulated_iteration_time_s")
    compute = result.get("compute_error_pct")
    if emulated is None or simulated is None or compute is None:
        return "NOT RUN", "the stage left no iteration, simulation or compute numbers"
    error = abs(emulated - simulated) / simulated
    status = "PASS" if error <= EMULATED_TOLERANCE and abs(compute) <= 100 * COMPUTE_TOLERANCE else "FAIL"
    return status, f"emulated {100 * error:.2f} % from simulation, compute {compute:+.2f} % vs stage alone"


CHECKS: tuple[tuple[str, str, Callable[[dict], Verdict]], ...] = (
    ("backend + op families on CUDA, 1 process", "backend_ops", lambda r: backend_ops(r, 1)),
    ("backend + op families on CUDA, 2 processes", "backend_ops", lambda r: backend_ops(r, 2)),
    ("wait kernel: median <= 2 us (waits >= 100 us)", "wait_precision", wait_precision),
    ("GPT capture: spans within 2 % of profiler", "gpt_capture_profile", gpt_capture),
    ("memory ground truth: TP2xDP2 peak identical", "memory_ground_truth", memory),
    ("Llama-3-8B rank W=8192: 1 % / 2 %", "emulated_llama_rank", llama),
)


def verdicts(work_dir: str) -> list[tuple[str, str, str]]:
    rows = []
    for label, stage, check in CHECKS:
        result = _find(work_dir, stage)
        if result is None:
            rows.append((label, "NOT RUN", f"{stage} left no results"))
            continue
        try:
            status, evidence = check(result)
        except (KeyError, TypeError, ZeroDivisionError) as exc:
            status, evidence = "NOT RUN", f"{stage}: results without {exc}"
        rows.append((label, status, evidence))
    return rows


def table(rows: list[tuple[str, str, str]]) -> str:
    lines = ["## Verdict", "", "| check | result | evidence |", "|---|---|---|"]
    lines += [f"| {label} | **{status}** | {evidence} |" for label, status, evidence in rows]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="run.sh's work directory")
    parser.add_argument("--md", help="also write the table here")
    args = parser.parse_args(argv)
    rows = verdicts(args.work)
    text = table(rows)
    print(text)
    for label, status, _ in rows:
        print(f"{status:8s} {label}")
    if args.md:
        with open(args.md, "w") as f:
            f.write(text)
    return 1 if any(status == "FAIL" for _, status, _ in rows) else 0


if __name__ == "__main__":
    sys.exit(main())
