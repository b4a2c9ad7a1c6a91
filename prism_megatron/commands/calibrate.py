"""Fit the network cost model to nccl-tests logs and write a cluster file for --prism-cluster."""

from __future__ import annotations

import argparse
import math
import os

NAME = "calibrate"
HELP = "fit the network cost model to nccl-tests logs and write a cluster YAML"
MAX_RMS_ERROR_PCT = 25.0
"""The largest RMS relative error of the fitted times a written cluster may have (--max-error).
The model's fits of real nccl-tests logs stay within about 10 %; far above, the logs and the model
disagree (times that fall as sizes grow, a base cluster of another system)."""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Read the stdout of nccl-tests programs (all_reduce_perf, all_gather_perf, reduce_scatter_perf, "
        "alltoall_perf, broadcast_perf, reduce_perf, sendrecv_perf), or the JSON files they write with "
        "-J FILE.json, from one or several node counts, fit "
        "the latencies and bandwidth efficiencies of the cost model, and write a cluster file."
    )
    parser.add_argument(
        "logs",
        nargs="+",
        metavar="NCCL_TESTS_LOG",
        help="a log file (stdout, or the JSON of -J); prefix it with the program (all_gather:run3.log) when neither the log nor the "
        "file name says which program wrote it",
    )
    parser.add_argument("--out", required=True, help="the cluster file to write (.yaml, or .json)")
    parser.add_argument(
        "--base",
        default="dgx-h100",
        help="preset or cluster file giving what logs cannot measure: link rates, NICs, topology "
        "(default: dgx-h100)",
    )
    parser.add_argument("--name", default=None, help="name of the calibrated cluster (default: from --out)")
    parser.add_argument(
        "--max-error",
        type=float,
        default=MAX_RMS_ERROR_PCT,
        metavar="PCT",
        help="refuse (exit 2, no file written) a fit whose RMS relative time error exceeds PCT %% "
        f"(default: {MAX_RMS_ERROR_PCT:g}): its cluster would mispredict every op",
    )


def run(args: argparse.Namespace) -> int:
    from prism_megatron import files
    from prism_megatron.network import load_cluster, save_cluster
    from prism_megatron.network.calibration import calibrate
    from prism_megatron.network.nccl_tests import OPS, read_nccl_tests

    if not (math.isfinite(args.max_error) and args.max_error > 0):
        raise ValueError(f"--max-error must be a positive percentage, got {args.max_error:g}")
    files.check_output(args.out, "--out")
    base = load_cluster(args.base)
    runs = []
    for log in args.logs:
        op, path = _split_log_argument(log, OPS)
        if not os.path.isfile(path):
            raise ValueError(f"NCCL_TESTS_LOG {path!r} is not a file")
        runs += read_nccl_tests(path, op=op)
    name = args.name or os.path.splitext(os.path.basename(args.out))[0]
    result = calibrate(base, runs, name=name)
    rows = [row for run in runs for row in run.rows]
    print(
        f"{len(runs)} run(s), {len(result.relative_errors)} rows; fit settled in {result.iterations} round(s)"
    )
    _print_parameters(base, result)
    _print_residuals(runs, result.relative_errors)
    worst = max(abs(e) for e in result.relative_errors)
    print(f"time error: RMS {result.rms_relative_error:.1%}, worst row {worst:.1%}")
    if len(rows) < len(result.fitted):
        print(
            f"warning: {len(rows)} row(s) for {len(result.fitted)} fitted parameters: the logs cannot tell "
            "them apart, so the pull towards the base cluster decides; give logs with more sizes"
        )
    for warning in result.warnings:
        print(f"warning: {warning}")
    if result.rms_relative_error * 100 > args.max_error:
        raise ValueError(
            f"the fit's RMS time error {result.rms_relative_error:.1%} exceeds the bound {args.max_error:g}% "
            f"(--max-error); no cluster written. The rows above disagree with the cost model: check that the "
            f"logs are whole (times grow with size) and come from a system like the base {base.name}"
        )
    sources = sorted({run.source for run in runs})
    header = (
        f"Calibrated by prism-megatron calibrate from {len(runs)} nccl-tests run(s) on base {base.name}:\n"
        + "\n".join(f"  {os.path.basename(s)}" for s in sources)
        + f"\nRMS relative error of the fitted times: {result.rms_relative_error:.1%}"
    )
    save_cluster(
        result.spec.replace(description=f"{base.description}; calibrated from nccl-tests"),
        args.out,
        header=header,
    )
    print(f"wrote {args.out}")
    return 0


def _print_parameters(base, result) -> None:
    from prism_megatron.network.parameters import FITTED_PARAMETERS, parameters_of

    before, after = parameters_of(base), parameters_of(result.spec)
    print(f"{'parameter':20s} {'base':>12s} {'fitted':>12s}")
    for key in FITTED_PARAMETERS:
        shown = _display(key, after[key]) if key in result.fitted else "(kept)"
        print(f"{key:20s} {_display(key, before[key]):>12s} {shown:>12s}")


def _print_residuals(runs, errors) -> None:
    """Each row's measured and fitted time, and the residual (fitted / measured - 1)."""
    print(f"{'row':32s} {'bytes':>12s} {'measured us':>12s} {'fitted us':>12s} {'residual':>9s}")
    measured = [(run, row) for run in runs for row in run.rows]
    for (run, row), error in zip(measured, errors, strict=True):
        where = f"{os.path.basename(run.source)}:{row.line_number}"
        fitted_us = row.time_us * (1 + error)
        print(f"{where:32.32s} {row.size_bytes:>12d} {row.time_us:>12.2f} {fitted_us:>12.2f} {error:>+9.1%}")


def _split_log_argument(log: str, ops) -> tuple[str | None, str]:
    prefix, sep, rest = log.partition(":")
    if sep and prefix in ops:
        return prefix, rest
    return None, log


def _display(key: str, value: float) -> str:
    """Latencies in us, inverse bandwidths as GB/s (what a reader compares with datasheets)."""
    if key.endswith("_ns_per_byte"):
        return f"{1.0 / value:.1f} GB/s" if value > 0 and math.isfinite(value) else "-"
    return f"{value / 1e3:.2f} us"
