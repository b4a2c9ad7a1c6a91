"""Fidelity of the emulation against real runs on this CPU machine: iteration time and peak memory.

Each case is a real multi-process run of a configuration (every rank a real process) and the
emulation of the same configuration where one or two ranks are real, on the same machine, in one
invocation. The error of a case is the emulated real rank's median iteration time against the same
rank's median in the real run; memory is the same rank's peak of live tensor storage in both.

* Sleep-compute cases (`cases.py`, `compare.py`): megatron-core's schedules, p2p, DDP and optimizer
  around a model whose layers sleep, so 16 real processes share two cores. PP4 x DP4, PP8 x DP2 with
  VPP 2, TP2 x PP4 x DP2; each with and without overlapped grad reduce and a straggler.
* Real-compute cases (`real_compute.py`): the built-in GPT entry, two real processes (PP2, DP2,
  TP2) against one real rank and one virtual.

Before any case, gloo on loopback is calibrated (`calibrate.py`): the simulator's costs are measured,
never fitted to the cases' iteration times. The suite's cost model is measured under the load of a
job of the case's size (every group communicating at once); each case is also emulated over costs
measured with one group alone, and that error is reported beside the first. Targets (PrismLLM's): mean error <= 0.5 %, no case above
2 %, memory difference 0 bytes; every case is reported, misses included.

Run: ``python -m benchmarks.fidelity.run [--quick | --smoke] [--only NAME ...] [--out DIR]``. Writes
``<DIR>/<YYYY-MM-DD>-fidelity.json`` and ``.md`` (DIR defaults to benchmarks/results/).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: children are forked from this process

import argparse
import statistics
import sys
import time
import traceback
import warnings

from benchmarks.common import EVERY_PACKAGE, RESULTS_DIR, environment, machine_line, today, write_results

TARGET_MEAN_PCT, TARGET_MAX_PCT = 0.5, 2.0


def _imports() -> None:
    """torch and megatron-core once, in the parent: every forked process inherits them."""
    warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")
    warnings.filterwarnings("ignore", category=FutureWarning)
    import megatron.core  # noqa: F401
    import torch  # noqa: F401


def run_suite(only: list[str] | None, quick: bool, smoke: bool = False) -> dict:
    from benchmarks.fidelity.calibrate import calibrate
    from benchmarks.fidelity.cases import real_compute_cases, sleep_cases, smoke_case
    from benchmarks.fidelity.compare import group_sizes, run_case

    cases = [smoke_case()] if smoke else sleep_cases() + real_compute_cases()
    if quick:
        cases = [c for c in cases if c.name.startswith("pp4-dp4")][:2]
    if only:
        cases = [c for c in cases if c.name in only]
    begin = time.monotonic()
    sizes = sorted({n for case in cases for n in group_sizes(case.job)} | {2})
    repetitions = 10 if smoke else 30
    alone = calibrate(sizes, repetitions=repetitions)
    under_load = {
        w: calibrate([n for n in sizes if n <= w], repetitions=repetitions, world_size=w)
        for w in sorted({case.job.world_size for case in cases})
    }
    calibration_s = time.monotonic() - begin
    records, failures = [], []
    for case in cases:
        print(f"fidelity: {case.name} ...", file=sys.stderr, flush=True)
        try:
            record = run_case(case, under_load[case.job.world_size], alternatives={"alone": alone})
        except Exception:  # a failed case is reported, and the others still run
            failures.append({"case": case.name, "error": traceback.format_exc()})
            print(failures[-1]["error"], file=sys.stderr, flush=True)
            continue
        records.append(record)
        print(
            f"fidelity: {case.name}: error {record['error_pct']:+.2f} % "
            f"(alone-calibrated {record['alternatives']['alone']['error_pct']:+.2f} %), memory difference "
            f"{record['memory_diff_bytes']} B",
            file=sys.stderr,
            flush=True,
        )
    return {
        "suite": "fidelity",
        "date": today(),
        "environment": environment(),
        "calibration": {
            "seconds": calibration_s,
            "median_cost_us_alone": alone.as_dict(),
            "median_cost_us_under_load": {str(w): cost.as_dict() for w, cost in under_load.items()},
        },
        "targets": {
            "mean_error_pct": TARGET_MEAN_PCT,
            "max_error_pct": TARGET_MAX_PCT,
            "memory_diff_bytes": 0,
        },
        "summary": summarize(records),
        "summary_alone_calibrated": summarize(
            [r["alternatives"]["alone"] | {"memory_diff_bytes": r["memory_diff_bytes"]} for r in records]
        ),
        "cases": records,
        "failed_cases": failures,
    }


def summarize(records: list[dict]) -> dict:
    errors = [abs(r["error_pct"]) for r in records]
    if not errors:
        return {}
    return {
        "num_cases": len(records),
        "mean_abs_error_pct": statistics.fmean(errors),
        "max_abs_error_pct": max(errors),
        "cases_within_max": sum(e <= TARGET_MAX_PCT for e in errors),
        "cases_with_memory_diff": sum(r["memory_diff_bytes"] != 0 for r in records),
    }


def markdown(record: dict) -> str:
    env, summary = record["environment"], record["summary"]
    lines = [
        f"# Fidelity on CPU ({record['date']})",
        "",
        machine_line(env, EVERY_PACKAGE) + ".",
        "",
        "Error: the emulated real rank's median iteration time against the same rank's in the real run "
        "(all ranks real processes); memory: the rank's peak live tensor storage in both runs. "
        f"Targets: mean |error| <= {TARGET_MEAN_PCT} %, none above {TARGET_MAX_PCT} %, memory difference 0 B.",
        "",
        "Costs under load: measured with every group of a job of the case's size communicating at once "
        "(the suite's model); alone: one group at a time (reported beside it).",
        "",
        "| case | real ranks | real ms | emulated ms | error % | alone: emulated ms | alone: error % "
        "| real peak B | emulated peak B | diff B | load 1 min |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for case in record["cases"]:
        for rank, alone in zip(case["ranks"], case["alternatives"]["alone"]["ranks"], strict=True):
            lines.append(
                f"| {case['case']} | {rank['virtual_rank']} of {'+'.join(map(str, case['real_ranks']))} "
                f"| {rank['real_median_ms']:.1f} | {rank['emulated_median_ms']:.1f} | {rank['error_pct']:+.2f} "
                f"| {alone['emulated_median_ms']:.1f} | {alone['error_pct']:+.2f} "
                f"| {rank['real_peak_bytes']} | {rank['emulated_peak_bytes']} | {rank['memory_diff_bytes']} "
                f"| {case['load_average_1min']['before']:.1f} |"
            )
    for failure in record["failed_cases"]:
        lines.append(
            f"| {failure['case']} | failed: {failure['error'].strip().splitlines()[-1][:120]} | | | | | | | | | |"
        )
    if summary:
        lines += [
            "",
            f"Mean |error| {summary['mean_abs_error_pct']:.2f} %, max {summary['max_abs_error_pct']:.2f} %; "
            f"{summary['cases_within_max']} of {summary['num_cases']} cases within {TARGET_MAX_PCT} %; "
            f"{summary['cases_with_memory_diff']} cases with a memory difference.",
        ]
        alone = record["summary_alone_calibrated"]
        lines.append(
            f"Alone-calibrated: mean |error| {alone['mean_abs_error_pct']:.2f} %, max {alone['max_abs_error_pct']:.2f} %; "
            f"{alone['cases_within_max']} of {alone['num_cases']} cases within {TARGET_MAX_PCT} %."
        )
    calibration = record["calibration"]
    tables = {"alone": calibration["median_cost_us_alone"]} | {
        f"under the load of {w} ranks": costs for w, costs in calibration["median_cost_us_under_load"].items()
    }
    for title, table in tables.items():
        lines += ["", f"Calibrated gloo loopback costs, {title} (median us by message bytes):", ""]
        for key, costs in table.items():
            lines.append(f"- {key}: " + ", ".join(f"{size} B {us}" for size, us in costs.items()))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="two PP4 x DP4 cases only")
    parser.add_argument("--only", nargs="*", default=None, help="case names to run")
    parser.add_argument(
        "--smoke",
        action="store_true",
        help="the CI's small case only (PP2 x DP2); writes <date>-fidelity-smoke.*",
    )
    parser.add_argument("--out", default=RESULTS_DIR, help="directory for the JSON and Markdown results")
    args = parser.parse_args(argv)
    _imports()
    record = run_suite(args.only, args.quick, args.smoke)
    paths = write_results("fidelity-smoke" if args.smoke else "fidelity", record, markdown(record), args.out)
    print(markdown(record))
    print("wrote", *paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
