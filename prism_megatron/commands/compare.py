"""Compare two run folders of one job, metric by metric: the regression gate for a Megatron change."""

from __future__ import annotations

import argparse
import json
import os

NAME = "compare"
HELP = "compare two run folders of one job (before and after a change): exit 1 on a regression"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Judge run B against run A (two --prism-out folders of the same job). The verdict rests on the "
        "headline metrics: iteration time, throughput, peak memory per real rank. The breakdown (each real "
        "rank's measured compute / exposed communication / bubble, each role's simulated breakdown, memory "
        "by category) is reported and named where it moved, and gated only with --gate-breakdown. A metric "
        "regresses when it moved the wrong way beyond the threshold and, where both runs have "
        "per-iteration samples, a Mann-Whitney U test says the shift is not noise. When the runs emulated "
        "different graphs, the output says how much of the change their captures alone explain. Exit "
        "status: 0 no regression, 1 a regression, 2 bad input (not run folders, runs of different jobs: "
        "the fields that differ are named)."
    )
    parser.add_argument("run_a", metavar="RUN_A", help="the run before the change (the baseline)")
    parser.add_argument("run_b", metavar="RUN_B", help="the run after the change (the one judged)")
    parser.add_argument(
        "--max-regression",
        type=float,
        default=5.0,
        metavar="PCT",
        help="largest growth of a time metric, in %% of its scale in RUN_A, that is not a regression "
        "(default: 5)",
    )
    parser.add_argument(
        "--max-memory-regression",
        type=float,
        default=1.0,
        metavar="PCT",
        help="the same for peak memory and each memory category (default: 1)",
    )
    parser.add_argument(
        "--gate-breakdown",
        action="store_true",
        help="let a breakdown metric's regression (a bubble, a role's simulated compute, a memory "
        "category) fail the gate too; by default only the headline metrics decide",
    )
    parser.add_argument(
        "--alpha", type=float, default=0.05, help="significance level of the rank test (default: 0.05)"
    )
    parser.add_argument(
        "--out",
        default=None,
        help="folder for compare.md, compare.json and compare.png (default: RUN_B/compare)",
    )
    parser.add_argument(
        "--json", action="store_true", help="print the JSON document instead of the Markdown diff"
    )


def run(args: argparse.Namespace) -> int:
    from prism_megatron import files
    from prism_megatron.compare import REGRESSION, Thresholds, compare_runs
    from prism_megatron.compare.render import plot_png, to_markdown

    thresholds = Thresholds(
        max_regression_pct=args.max_regression,
        max_memory_regression_pct=args.max_memory_regression,
        alpha=args.alpha,
        gate_breakdown=args.gate_breakdown,
    )
    out_dir = args.out or os.path.join(args.run_b, files.COMPARE_DIR)
    if os.path.isdir(args.run_b):
        files.check_output(out_dir, "--out" if args.out else f"RUN_B/{files.COMPARE_DIR}", directory=True)
    result = compare_runs(args.run_a, args.run_b, thresholds)
    plot_name = files.COMPARE_PNG
    try:
        files.write_atomically(
            os.path.join(out_dir, plot_name), plot_png(result.run_a, result.run_b, result.judged, thresholds)
        )
    except Exception as exc:  # a plot must never cost the verdict
        plot_name = None
        print(f"compare: plot skipped ({type(exc).__name__}: {exc})", flush=True)
    markdown = to_markdown(result.doc, result.judged, plot_name=plot_name)
    files.write_atomically(os.path.join(out_dir, files.COMPARE_MD), markdown)
    files.write_json(result.doc, os.path.join(out_dir, files.COMPARE_JSON), indent=1)
    if args.json:
        print(json.dumps(result.doc, indent=1))
    else:
        print(markdown, end="")
        print(f"\nwrote {out_dir}/compare.md, compare.json" + (", compare.png" if plot_name else ""))
    return 1 if result.verdict == REGRESSION else 0
