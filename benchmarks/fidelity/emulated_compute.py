"""Does a real rank compute as fast when emulated as when captured? The demo's job, one real rank.

Why: the graph's compute spans come from the capture pass, where every virtual peer answers at once
and the rank never waits; in the emulation pass it waits for its virtual peers' times. On the CPU
device its compute is host work, and on a virtual machine host work that follows a sleep runs
slower, so an emulated rank whose waits sleep computes slower than its capture said and its
iteration comes out slower than the simulation of the captured graph. This measures that ratio as a
user's run has it: `prism-megatron emulate` of the demo's job (`commands.demo`: W = 8192, TP8 PP8)
with one real rank (virtual rank 1024, a middle stage: it waits for the pipeline), each run in a
fresh process; per run the capture's median compute per iteration (`capture/capture-01024.json`),
the emulated median compute per iteration after warm-up (`ops/rank-01024.json`), and their ratio.
Capture and emulation are seconds apart in one run, so the ratio holds little of the machine's drift
from run to run (the compute itself moves by a third here).

Run: ``python -m benchmarks.fidelity.emulated_compute [--runs N] [--out DIR]``; writes
``<DIR>/<YYYY-MM-DD>-emulated-compute.json`` and ``.md`` (DIR defaults to benchmarks/results/).
"""

from __future__ import annotations

import argparse
import os
import statistics
import subprocess
import sys
import tempfile

from benchmarks.common import EVERY_PACKAGE, RESULTS_DIR, environment, machine_line, today, write_results
from benchmarks.gpu.emulated_llama_rank import WARMUP_ITERATIONS, compute_iterations_ms

REAL_RANK = 1024
TRAIN_ITERS = 12
CAPTURE_ITERS = 4


def job_flags(out_dir: str) -> list[str]:
    from prism_megatron.commands.demo import DEMO_JOB, MODEL_FLAGS

    return [
        *MODEL_FLAGS,
        "--train-iters", str(TRAIN_ITERS), "--prism-emulate", "--prism-world-size", str(DEMO_JOB["world_size"]),
        "--prism-device", "cpu", "--prism-ranks", str(REAL_RANK), "--prism-capture-iters", str(CAPTURE_ITERS),
        "--prism-out", out_dir,
    ]  # fmt: skip


def run_once(work_dir: str) -> dict:
    out_dir = os.path.join(work_dir, "run")
    done = subprocess.run(
        [sys.executable, "-m", "prism_megatron.cli", "emulate", "--", *job_flags(out_dir)],
        capture_output=True,
        text=True,
        env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )
    if done.returncode != 0:
        raise RuntimeError(f"the emulation failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    captured, emulated = compute_iterations_ms(out_dir, REAL_RANK)
    capture_ms, emulated_ms = statistics.median(captured), statistics.median(emulated[WARMUP_ITERATIONS:])
    return {
        "capture_ms": [round(x, 2) for x in captured],
        "emulated_ms": [round(x, 2) for x in emulated],
        "capture_median_ms": round(capture_ms, 2),
        "emulated_median_ms": round(emulated_ms, 2),
        "ratio": round(emulated_ms / capture_ms, 3),
    }


def markdown(record: dict) -> str:
    runs = record["runs"]
    ratios = [run["ratio"] for run in runs]
    rows = "\n".join(
        f"| {i + 1} | {run['capture_median_ms']:.1f} | {run['emulated_median_ms']:.1f} | {run['ratio']:.2f} |"
        for i, run in enumerate(runs)
    )
    return (
        f"# A real rank's compute, emulated against captured ({record['date']})\n\n"
        f"Machine: {machine_line(record['environment'], EVERY_PACKAGE)}. `python -m "
        f"benchmarks.fidelity.emulated_compute`: the demo's job (W = 8192, TP8 PP8), real rank {REAL_RANK} "
        f"alone, {len(runs)} runs; per run the median compute per iteration in the capture and "
        f"emulated (after {WARMUP_ITERATIONS} warm-up).\n\n"
        "| run | capture ms | emulated ms | ratio |\n|---:|---:|---:|---:|\n"
        f"{rows}\n\nRatio: median {statistics.median(ratios):.2f}, range {min(ratios):.2f} to "
        f"{max(ratios):.2f}.\n"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--runs", type=int, default=5, help="runs (default 5)")
    parser.add_argument(
        "--out", default=RESULTS_DIR, help="where the results go (default benchmarks/results)"
    )
    args = parser.parse_args(argv)
    if args.runs < 1:
        parser.error(f"--runs must be >= 1, got {args.runs}")
    runs = []
    for index in range(args.runs):
        with tempfile.TemporaryDirectory(prefix="prism-emulated-compute-") as work:
            runs.append(run_once(work))
        print(f"run {index + 1}: ratio {runs[-1]['ratio']:.2f}", file=sys.stderr, flush=True)
    record = {"suite": "emulated-compute", "date": today(), "environment": environment(), "runs": runs}
    json_path, md_path = write_results("emulated-compute", record, markdown(record), args.out)
    print(f"wrote {json_path} {md_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
