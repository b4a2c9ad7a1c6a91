"""`make bench`: every CPU benchmark suite in sequence, then one summary of what ran.

Each suite runs as ``python -m benchmarks.<suite>.run [its flags] --out DIR`` in its own process and
writes its own ``<date>-<suite>.json`` and ``.md``; this driver records each suite's exit status
and wall time and writes ``<date>-bench.md`` (and ``.json``) with the versions and the machine. The
flags below keep the whole sequence within about 35 minutes on a 2-core machine: the suites that
have a long full form (clock, backend, sim, fidelity: about an hour) run their quick form here; run
one alone for its full form. A suite that fails is reported and the others still run; the exit status is 1 if any failed.

Run: ``python -m benchmarks.run [--only SUITE ...] [--out DIR]`` (``make bench``).
"""

from __future__ import annotations

import argparse
import os
import subprocess
import sys
import time

from benchmarks.common import EVERY_PACKAGE, RESULTS_DIR, environment, machine_line, today, write_results

SUITES: tuple[tuple[str, tuple[str, ...], str], ...] = (
    ("topology", ("--quick",), "rank-group arithmetic at full scale"),
    ("clock", ("--quick",), "precision of the replay engine's timed waits"),
    ("backend", ("--quick",), "prism backend: host overhead per op, completion error, world creation"),
    ("network", (), "collective cost model against published nccl-tests numbers"),
    ("plan", (), "memory plan of every shipped configuration"),
    ("sim", ("--quick",), "simulator time and memory"),
    ("scale", (), "one real rank's set-up from W = 1k to 131k"),
    ("overhead", (), "what emulation costs the real rank's compute and each op"),
    ("fidelity", ("--quick",), "emulated against real runs: iteration time and memory (quick form)"),
)
"""(suite, flags for this driver, what it measures), in the order they run."""


def _results_stem(name: str, flags: tuple[str, ...]) -> str:
    """The fidelity suite's quick form writes its own files, so it never stands for the full run's."""
    return f"{name}-quick" if name == "fidelity" and "--quick" in flags else name


def run_suite(name: str, flags: tuple[str, ...], out_dir: str) -> dict:
    command = [sys.executable, "-m", f"benchmarks.{name}.run", *flags, "--out", out_dir]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    print(f"bench: {name} {' '.join(flags)}", file=sys.stderr, flush=True)
    begin = time.monotonic()
    done = subprocess.run(command, env=env, capture_output=True, text=True)
    seconds = time.monotonic() - begin
    status = "ok" if done.returncode == 0 else f"failed (exit {done.returncode})"
    print(f"bench: {name}: {status} in {seconds:.0f} s", file=sys.stderr, flush=True)
    return {
        "suite": name,
        "flags": list(flags),
        "status": status,
        "seconds": seconds,
        "results": f"{today()}-{_results_stem(name, flags)}.md",
        "stderr_tail": "" if done.returncode == 0 else done.stderr[-3000:],
    }


def markdown(record: dict) -> str:
    env = record["environment"]
    lines = [
        f"# Benchmarks on CPU ({record['date']})",
        "",
        f"{machine_line(env, EVERY_PACKAGE)} (load at the start). Total {record['seconds'] / 60:.1f} min.",
        "",
        "| suite | measures | flags | status | wall s | results |",
        "|---|---|---|---|---:|---|",
    ]
    for row in record["suites"]:
        lines.append(
            f"| {row['suite']} | {row['measures']} | {' '.join(row['flags']) or '-'} | {row['status']} "
            f"| {row['seconds']:.0f} | [{row['results']}]({row['results']}) |"
        )
    for row in record["suites"]:
        if row["stderr_tail"]:
            lines += ["", f"## {row['suite']} failed", "", "```", row["stderr_tail"].strip(), "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--only", nargs="*", default=None, choices=[name for name, _, _ in SUITES])
    parser.add_argument("--out", default=RESULTS_DIR, help="directory for every suite's results")
    args = parser.parse_args(argv)
    record = {"suite": "bench", "date": today(), "environment": environment(), "suites": []}
    begin = time.monotonic()
    for name, flags, measures in SUITES:
        if args.only and name not in args.only:
            continue
        record["suites"].append({**run_suite(name, flags, args.out), "measures": measures})
    record["seconds"] = time.monotonic() - begin
    paths = write_results("bench", record, markdown(record), args.out)
    print("wrote", *paths)
    return 0 if all(row["status"] == "ok" for row in record["suites"]) else 1


if __name__ == "__main__":
    sys.exit(main())
