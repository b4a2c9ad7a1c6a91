"""Does `prism-megatron compare` tell noise from a regression? Repeated pairs of one configuration.

Why: a regression gate that cries wolf is switched off, and one that misses a straggler is useless.
The issue's bar: two runs of the same configuration are judged "same" in at least 9 of 10 pairs,
and a run with a straggler on the critical path against one without is judged a regression (exit 1).

What runs: one emulation of a tiny built-in GPT job (W=8, PP2 x DP4, virtual rank 1 real) that
captures the job's execution graph, then `--pairs` pairs of emulations of that graph
(`--prism-graph`, the README's gate workflow), each run a fresh process under `nice`, plus one pair
of a run without and a run with `--prism-straggler 5:3` (rank 5 is rank 1's next pipeline stage,
so its slowness sits on rank 1's critical path). Then `compare` judges the second run of each pair
against the first with the thresholds below.

Why this design, measured here (the result records both notes): on this shared 2-core machine (load
around 20 from other builds) two runs of one configuration minutes apart differed by 16-50 % in
iteration time (`SEQUENTIAL_NOTE`): a pair measured one after the other compares the load, not the
code, so the two runs of a pair run at the same time. Even at the same time, two runs that each
captured their own graph differed by 13 % (`CAPTURE_NOTE`): each capture times the slice's spans
from a few iterations on a loaded machine, and the simulated virtual peers inherit that noise. A gate
therefore emulates one graph before and after the change: the closed loop re-times every real
rank's role from what it measures, so a change in the code the real ranks run shows, while the
capture's noise is shared. Run folders live under `--work` and are reused when they finished, so an
interrupted benchmark resumes; `--fresh` starts over.

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
from prism_megatron import files

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
CAPTURE_NOTE = (
    "Two runs that each captured their own graph, run at the same time: iteration time -13.0 % "
    "(p 0.015), simulated iteration time -13.1 %, judged an improvement at a 10 % threshold."
)
SEQUENTIAL_NOTE = (
    "Before this design, runs 2k and 2k+1 ran one after the other (same flags, each capturing): of the 3 "
    "pairs done at a load average of 20, the iteration time changed by -9.1 % (p 0.041), +25.7 % (p 0.002) "
    "and +21.5 % (p 0.002), two judged regressions at a 10 % threshold: the load drift, not the code."
)


def _finished(out_dir: str) -> bool:
    report = os.path.join(out_dir, files.REPORT_JSON)
    if not os.path.isfile(report):
        return False
    with open(report, encoding="utf-8") as f:
        return json.load(f).get("status") == "ok"


def emulate_pair(runs: list[tuple[str, list[str]]]) -> list[dict]:
    """Both runs of a pair in fresh, niced processes at the same time; a finished run is reused."""
    started = []
    for out_dir, extra in runs:
        if _finished(out_dir):
            started.append((out_dir, None, None))
            continue
        shutil.rmtree(out_dir, ignore_errors=True)
        command = ["nice", "-n", "10", sys.executable, "-m", "prism_megatron.cli", "emulate"]
        command += ["--nproc-per-node", "2", "--", *MEGATRON_ARGS, *extra, "--prism-out", out_dir]
        env = {**os.environ, "PYTHONWARNINGS": "ignore", "OMP_NUM_THREADS": "1"}
        process = subprocess.Popen(
            command, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, text=True, env=env
        )
        started.append((out_dir, process, time.monotonic()))
    out = []
    for out_dir, process, start_s in started:
        if process is None:
            out.append({"out": out_dir, "reused": True, "wall_s": None})
            continue
        _, stderr = process.communicate()
        if process.returncode != 0:
            raise RuntimeError(
                f"emulation into {out_dir} failed (exit {process.returncode}):\n{stderr[-3000:]}"
            )
        out.append({"out": out_dir, "reused": False, "wall_s": round(time.monotonic() - start_s, 1)})
    return out


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
        f"Job: built-in GPT `{' '.join(MEGATRON_ARGS)}`; one run captured the graph, every pair emulates it "
        "(`--prism-graph`), its two runs at the same time. Gate: "
        f"`--max-regression {MAX_REGRESSION_PCT:g} --max-memory-regression {MAX_MEMORY_REGRESSION_PCT:g}`; "
        f"test: {record['test']}.",
        "",
        f"Pairs of the same configuration judged same: **{same} of {len(record['pairs'])}** "
        f"(target >= {TARGET_SAME}); straggler `{STRAGGLER}` against a run without it, at once: **{record['straggler']['verdict']}**, "
        f"exit {record['straggler']['exit']} (target: regression, exit 1). Bar {met}.",
        f"Median |iteration-time change| between the runs of a pair: {record['median_abs_change_pct']:.2f} % "
        f"(spread {record['min_abs_change_pct']:.2f} .. {record['max_abs_change_pct']:.2f} %).",
        "",
        f"Sequential pairs, for comparison: {SEQUENTIAL_NOTE}",
        "",
        f"Each run capturing its own graph, for comparison: {CAPTURE_NOTE}",
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
    (graph_run,) = emulate_pair([(os.path.join(args.work, "graph-run"), [])])
    graph = ["--prism-graph", os.path.join(graph_run["out"], files.GRAPH_DIR)]
    print(f"compare bench: graph run: {graph_run}", file=sys.stderr, flush=True)
    runs = []
    for k in range(args.pairs):
        pair = [(os.path.join(args.work, f"pair-{k:02d}-{side}"), graph) for side in "ab"]
        runs += emulate_pair(pair)
        print(f"compare bench: pair {k}: {runs[-2:]}", file=sys.stderr, flush=True)
    straggler_pair = [
        (os.path.join(args.work, "straggler-a"), graph),
        (os.path.join(args.work, "straggler-b"), [*graph, "--prism-straggler", STRAGGLER]),
    ]
    straggler_runs = emulate_pair(straggler_pair)
    print(f"compare bench: straggler pair: {straggler_runs}", file=sys.stderr, flush=True)
    if args.runs_only:
        return 0
    pairs = []
    for k in range(args.pairs):
        a, b = runs[2 * k]["out"], runs[2 * k + 1]["out"]
        pairs.append(pair_row(a, b, compare(a, b, os.path.join(args.work, f"compare-{k:02d}"))))
    base, slow = (r["out"] for r in straggler_runs)
    straggler_doc = compare(base, slow, os.path.join(args.work, "compare-straggler"))
    straggler = pair_row(base, slow, straggler_doc)
    changes = [abs(p["iteration_change_pct"]) for p in pairs]
    record = {
        "date": today(),
        "environment": environment(),
        "megatron_args": MEGATRON_ARGS,
        "test": pairs and straggler_doc["doc"]["test"],
        "graph_run": graph_run,
        "runs": [*runs, *straggler_runs],
        "pairs_run_at_once": True,
        "pairs_share_one_graph": True,
        "sequential_note": SEQUENTIAL_NOTE,
        "capture_note": CAPTURE_NOTE,
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
