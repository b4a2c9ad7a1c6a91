"""Does `prism-megatron compare` tell noise from a regression? Repeated pairs of one configuration.

Why: a regression gate that cries wolf is switched off, and one that misses a straggler is useless.
The issue's bar: two runs of the same configuration are judged "same" in at least 9 of 10 pairs,
and a run with a straggler on the critical path against one without is judged a regression (exit 1).

What runs: `2 x --pairs` emulations of one tiny built-in GPT job (W=8, PP2 x DP4, virtual rank 1
real, every run captures its own graph, as a before/after pair around a code change would), each
in a fresh process under `nice`, plus one run with `--prism-straggler 5:3` (rank 5 is rank 1's
next pipeline stage, so its slowness sits on rank 1's critical path). Then `compare` judges run
2k against run 2k+1 for every k, and the straggler run against run 0, with the thresholds below.
Run folders live under `--work` and are reused when they finished, so an interrupted benchmark
resumes; `--fresh` starts over.

Run: ``python -m benchmarks.compare.run [--pairs 10] [--work DIR] [--out DIR]``. Writes
``<DIR>/<YYYY-MM-DD>-compare.json`` and ``.md`` (DIR defaults to benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import subprocess
import sys
import tempfile
import time

from benchmarks.common import EVERY_PACKAGE, RESULTS_DIR, environment, machine_line, today, write_results

MEGATRON_ARGS = [
    *("--num-layers", "2", "--hidden-size", "32", "--num-attention-heads", "4", "--seq-length", "16"),
    *("--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters", "7"),
    *("--pipeline-model-parallel-size", "2", "--prism-emulate", "--prism-world-size", "8"),
    *("--prism-ranks", "1", "--prism-device", "cpu"),
]
STRAGGLER = "5:3"
MAX_REGRESSION_PCT = 10.0
"""The gate's time threshold: on a shared 2-core machine run-to-run drift of a few percent is
normal (the fidelity benchmark saw 30 % between runs minutes apart), so 5 % would gate on load."""
MAX_MEMORY_REGRESSION_PCT = 1.0
TARGET_SAME = 9


def emulate(out_dir: str, extra: list[str]) -> dict:
    """One emulation in a fresh, niced process; reused when `out_dir` holds a finished run."""
    report = os.path.join(out_dir, "report.json")
    if os.path.isfile(report):
        with open(report, encoding="utf-8") as f:
            if json.load(f).get("status") == "ok":
                return {"out": out_dir, "reused": True, "wall_s": None}
    shutil.rmtree(out_dir, ignore_errors=True)
    command = ["nice", "-n", "10", sys.executable, "-m", "prism_megatron.cli", "emulate"]
    command += ["--nproc-per-node", "2", "--", *MEGATRON_ARGS, *extra, "--prism-out", out_dir]
    start_s = time.monotonic()
    done = subprocess.run(
        command, capture_output=True, text=True, env={**os.environ, "PYTHONWARNINGS": "ignore"}
    )
    if done.returncode != 0:
        raise RuntimeError(
            f"emulation into {out_dir} failed (exit {done.returncode}):\n{done.stderr[-3000:]}"
        )
    return {"out": out_dir, "reused": False, "wall_s": round(time.monotonic() - start_s, 1)}


def compare(run_a: str, run_b: str, out_dir: str) -> dict:
    """`prism-megatron compare --json` of two run folders: its exit status and its document."""
    command = [sys.executable, "-m", "prism_megatron.cli", "compare", run_a, run_b, "--json"]
    command += ["--max-regression", str(MAX_REGRESSION_PCT)]
    command += ["--max-memory-regression", str(MAX_MEMORY_REGRESSION_PCT), "--out", out_dir]
    done = subprocess.run(command, capture_output=True, text=True)
    if done.returncode not in (0, 1):
        raise RuntimeError(f"compare {run_a} {run_b} failed (exit {done.returncode}): {done.stderr[-2000:]}")
    return {"exit": done.returncode, "doc": json.loads(done.stdout)}


def pair_row(a: str, b: str, result: dict) -> dict:
    doc = result["doc"]
    iteration = next(m for m in doc["metrics"] if m["metric"] == "iteration time")
    flagged = [m["metric"] for m in doc["metrics"] if m["verdict"] in ("regression", "improvement")]
    return {
        "a": os.path.basename(a),
        "b": os.path.basename(b),
        "exit": result["exit"],
        "verdict": doc["verdict"],
        "iteration_ms_a": round(iteration["a"] * 1e3, 2),
        "iteration_ms_b": round(iteration["b"] * 1e3, 2),
        "iteration_change_pct": round(iteration["change_pct"], 2),
        "iteration_p_value": iteration.get("p_value"),
        "flagged": flagged,
    }


def markdown(record: dict) -> str:
    env = record["environment"]
    same = record["num_same"]
    met = "met" if same >= TARGET_SAME and record["straggler"]["exit"] == 1 else "NOT met"
    lines = [
        f"# compare: repeated pairs and a straggler ({record['date']})",
        "",
        machine_line(env, EVERY_PACKAGE) + ".",
        f"Job: built-in GPT `{' '.join(MEGATRON_ARGS)}`, each run capturing its own graph. Gate: "
        f"`--max-regression {MAX_REGRESSION_PCT:g} --max-memory-regression {MAX_MEMORY_REGRESSION_PCT:g}`; "
        f"test: {record['test']}.",
        "",
        f"Pairs of the same configuration judged same: **{same} of {len(record['pairs'])}** "
        f"(target >= {TARGET_SAME}); straggler `{STRAGGLER}` against run 0: **{record['straggler']['verdict']}**, "
        f"exit {record['straggler']['exit']} (target: regression, exit 1). Bar {met}.",
        f"Median |iteration-time change| between pairs: {record['median_abs_change_pct']:.2f} % "
        f"(spread {record['min_abs_change_pct']:.2f} .. {record['max_abs_change_pct']:.2f} %).",
        "",
        "| pair | iteration ms A | iteration ms B | change % | p | verdict | exit | flagged metrics |",
        "|---|---:|---:|---:|---:|---|---:|---|",
    ]
    for row in [*record["pairs"], record["straggler"]]:
        p = "-" if row["iteration_p_value"] is None else f"{row['iteration_p_value']:.3f}"
        lines.append(
            f"| {row['a']} vs {row['b']} | {row['iteration_ms_a']:.1f} | {row['iteration_ms_b']:.1f} | "
            f"{row['iteration_change_pct']:+.1f} | {p} | {row['verdict']} | {row['exit']} | "
            f"{', '.join(row['flagged']) or '-'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--pairs", type=int, default=10)
    parser.add_argument("--work", default=os.path.join(tempfile.gettempdir(), "prism-compare-bench"))
    parser.add_argument("--fresh", action="store_true", help="delete earlier runs under --work first")
    parser.add_argument("--runs-only", action="store_true", help="make the runs, judge nothing")
    parser.add_argument("--out", default=RESULTS_DIR)
    args = parser.parse_args(argv)
    if args.fresh:
        shutil.rmtree(args.work, ignore_errors=True)
    os.makedirs(args.work, exist_ok=True)
    runs = []
    for index in range(2 * args.pairs):
        runs.append(emulate(os.path.join(args.work, f"run-{index:02d}"), []))
        print(f"compare bench: run {index}: {runs[-1]}", file=sys.stderr, flush=True)
    straggler_run = emulate(os.path.join(args.work, "straggler"), ["--prism-straggler", STRAGGLER])
    print(f"compare bench: straggler run: {straggler_run}", file=sys.stderr, flush=True)
    if args.runs_only:
        return 0
    pairs = []
    for k in range(args.pairs):
        a, b = runs[2 * k]["out"], runs[2 * k + 1]["out"]
        pairs.append(pair_row(a, b, compare(a, b, os.path.join(args.work, f"compare-{k:02d}"))))
    straggler_doc = compare(
        runs[0]["out"], straggler_run["out"], os.path.join(args.work, "compare-straggler")
    )
    straggler = pair_row(runs[0]["out"], straggler_run["out"], straggler_doc)
    changes = [abs(p["iteration_change_pct"]) for p in pairs]
    record = {
        "date": today(),
        "environment": environment(),
        "megatron_args": MEGATRON_ARGS,
        "test": pairs and straggler_doc["doc"]["test"],
        "runs": [*runs, straggler_run],
        "pairs": pairs,
        "num_same": sum(p["verdict"] == "same" for p in pairs),
        "straggler": straggler,
        "median_abs_change_pct": statistics.median(changes),
        "min_abs_change_pct": min(changes),
        "max_abs_change_pct": max(changes),
    }
    paths = write_results("compare", record, markdown(record), args.out)
    print(markdown(record))
    print("wrote " + " and ".join(paths))
    return 0 if record["num_same"] >= TARGET_SAME and straggler["exit"] == 1 else 1


if __name__ == "__main__":
    sys.exit(main())
