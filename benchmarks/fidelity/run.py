"""Fidelity of the emulation against real runs on this CPU machine: iteration time and peak memory.

Each case is a real multi-process run of a configuration (every rank a real process, the ground
truth) and the product's emulation of it with one or two ranks real, both through the product's own
passes (`passes.py`: `prism-megatron emulate`'s plan, capture, graph, simulation and emulation
pass; only the process start is the suite's), in `Case.rounds` independent rounds that alternate
the two sides. Every number is a distribution over rounds: the error's median, inter-quartile
range and worst round.

* Sleep-compute cases (`cases.py`): megatron-core's schedules, p2p, DDP and optimizer around a
  model whose layers sleep, so 16 real processes share two cores without computing at once. PP4 x
  DP4, PP8 x DP2 with VPP 2, TP2 x PP4 x DP2; each with and without overlapped grad reduce and a
  straggler (the straggler cases reuse their job's graph, a what-if).
* Real-compute cases: the built-in GPT entry, two real processes (PP2, DP2, TP2) against one real
  rank and one virtual; at most two processes compute at once, one core each.

Before any case, gloo on loopback is calibrated (`calibrate.py`), each pattern `--repeats` times:
the cost model is measured, never fitted to the cases, and its spread is reported. The suite's
model is the job pattern (every group of a job of the case's size at once, out of the cases' kind of
compute); every case is also emulated over the alone pattern's costs and over the concurrent model
(costs alone with the concurrency term, measured at 1..16 groups at once by `concurrency.py` and
driven by the simulated schedule), reported beside it.

Targets, over the rounds' medians, of the cases whose ground truth is stable (`compare.py`):
sleep-compute mean |error| <= 0.5 %, every case <= 2 %, memory difference 0 B; real-compute every
case <= 3 % with an inter-quartile range under 2 %. Every case is reported, misses included, with
how many processes competed for the cores.

Run: ``python -m benchmarks.fidelity.run [--quick | --smoke] [--only NAME ...] [--models job ...] [--offline DIR]
[--plan] [--out DIR]``. The full suite takes about an hour on a quiet 2-core machine (``--plan``
prints the estimate of any selection without running it). Writes
``<DIR>/<YYYY-MM-DD>-fidelity.json`` and ``.md`` (``-fidelity-quick``, ``-fidelity-smoke`` for the
short forms; DIR defaults to benchmarks/results/).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: children are forked from this process

import argparse
import dataclasses
import shutil
import sys
import tempfile
import time
import traceback
import warnings

from benchmarks.common import RESULTS_DIR, environment, today, write_results
from benchmarks.fidelity import estimate, report

MODELS = ("job", "alone", "concurrent")
"""Cost models: the job pattern (every group at once; the suite's), alone (no other group), and
concurrent (alone, with the concurrency term measured at 1..16 groups at once and driven by the
simulated schedule; `concurrency.py`)."""


@dataclasses.dataclass(frozen=True)
class Selection:
    """What one invocation runs."""

    form: str
    """"full", "quick" or "smoke" (the results file's suffix)."""
    cases: tuple
    models: tuple[str, ...]
    repeats: int
    """Independent calibrations per pattern."""
    repetitions: int
    """Repetitions per measured point in each calibration."""


def select(form: str, only: list[str] | None, models: tuple[str, ...]) -> Selection:
    from benchmarks.fidelity.cases import real_compute_cases, sleep_cases, smoke_case

    if form == "smoke":
        return Selection("smoke", (smoke_case(),), ("job",), repeats=1, repetitions=8)
    cases = sleep_cases() + real_compute_cases()
    if form == "quick":
        cases = [dataclasses.replace(c, rounds=2) for c in cases if c.name in ("pp4-dp4", "real-pp2")]
    if only:
        unknown = sorted(set(only) - {c.name for c in cases})
        if unknown:
            raise ValueError(
                f"--only {' '.join(unknown)}: no such case; cases: {', '.join(c.name for c in cases)}"
            )
        cases = [c for c in cases if c.name in only]
    cases = [
        dataclasses.replace(c, graph_of=None) if c.graph_of not in {k.name for k in cases} else c
        for c in cases
    ]
    return Selection(form, tuple(cases), models, repeats=1 if form == "quick" else 3, repetitions=20)


def _imports() -> None:
    """torch and megatron-core once, in the parent: every forked process inherits them."""
    warnings.filterwarnings("ignore", message=".*Transformer Engine and Apex.*")
    warnings.filterwarnings("ignore", category=FutureWarning)
    import megatron.core  # noqa: F401
    import torch  # noqa: F401


def _lead_in(case) -> str:
    return "busy" if case.kind == "real-compute" else "sleep"


def calibrate_all(selection: Selection, work: str) -> tuple[dict, dict]:
    """Every calibration the cases need; (cost file by (model, lead-in, W), Calibration by the same)."""
    from benchmarks.fidelity.calibrate import calibrate
    from benchmarks.fidelity.compare import group_sizes
    from prism_megatron.files import write_json

    needs: dict[tuple[str, str, int], set[int]] = {}
    for case in selection.cases:
        sizes = set(group_sizes(case.job)) | {2}
        for model in selection.models:
            per_job = model != "alone"  # alone: one set for every case
            world = case.job.world_size if per_job else 0
            needs.setdefault((model, _lead_in(case) if per_job else "-", world), set()).update(sizes)
    files, calibrations = {}, {}
    for (model, lead_in, world), sizes in sorted(needs.items()):
        print(
            f"fidelity: calibrating {model} {lead_in} W={world or max(sizes)} ...",
            file=sys.stderr,
            flush=True,
        )
        if model == "concurrent":
            from benchmarks.fidelity.concurrency import LEVELS, ConcurrencyPlan, calibrate_concurrency

            plan = ConcurrencyPlan(group_sizes=tuple(sorted(sizes)), levels=LEVELS, lead_in=lead_in,
                                   repetitions=max(selection.repetitions // 2, 2))  # fmt: skip
            calibration = calibrate_concurrency(plan, num_processes=world, repeats=selection.repeats)
        else:
            calibration = calibrate(
                sorted(sizes),
                pattern=model,
                world_size=world or max(sizes),
                lead_in=lead_in if model == "job" else "sleep",
                repetitions=selection.repetitions,
                repeats=selection.repeats,
            )
        path = os.path.join(work, f"costs-{calibration.name}.json")
        write_json(calibration.cost.to_dict(), path)
        files[(model, lead_in, world)], calibrations[(model, lead_in, world)] = path, calibration
    return files, calibrations


def _cost_key(model: str, case) -> tuple[str, str, int]:
    return (model, _lead_in(case), case.job.world_size) if model != "alone" else (model, "-", 0)


def run_cases(selection: Selection, files: dict, calibrations: dict, work: str) -> tuple[list, list]:
    from benchmarks.fidelity.compare import run_case

    records, failures, graphs = [], [], {}
    for case in selection.cases:
        print(f"fidelity: {case.name} ({case.rounds} rounds) ...", file=sys.stderr, flush=True)
        cost_files = {model: files[_cost_key(model, case)] for model in selection.models}
        draws = calibrations[_cost_key("job", case)].draws if "job" in selection.models else ()
        try:
            record = run_case(
                case, cost_files, os.path.join(work, case.name), graph=graphs.get(case.graph_of), draws=draws
            )
        except Exception:  # a failed case is reported, and the others still run
            failures.append({"case": case.name, "error": traceback.format_exc()})
            print(failures[-1]["error"], file=sys.stderr, flush=True)
            continue
        if record["graph"]["captured_here"]:
            from prism_megatron.graph import load_graph

            graphs[case.name] = load_graph(
                os.path.join(work, case.name, f"emulate-{selection.models[0]}", "graph")
            )
        records.append(record)
        error = record["error_pct"]
        print(
            f"fidelity: {case.name}: error median {error['median']:+.2f} % (IQR {error['iqr']:.2f}, worst "
            f"{error['worst']:+.2f}), memory difference {record['memory_diff_bytes']} B",
            file=sys.stderr,
            flush=True,
        )
    return records, failures


def run_suite(selection: Selection, keep_work: str | None = None, offline: str | None = None) -> dict:
    """Calibrate and run the selection; with `offline`, keep what re-simulates it (`offline.py`)."""
    begin = time.monotonic()
    work = keep_work or tempfile.mkdtemp(prefix="prism-fidelity-")
    try:
        files, calibrations = calibrate_all(selection, work)
        calibration_s = time.monotonic() - begin
        records, failures = run_cases(selection, files, calibrations, work)
        if offline is not None:
            from benchmarks.fidelity.offline import keep

            by_case = {
                case.name: {model: files[_cost_key(model, case)] for model in selection.models}
                for case in selection.cases
            }
            print(
                "fidelity: kept for offline re-simulation:",
                keep(records, work, by_case, offline),
                file=sys.stderr,
            )
    finally:
        if keep_work is None:
            shutil.rmtree(work, ignore_errors=True)
    return {
        "suite": "fidelity",
        "form": selection.form,
        "date": today(),
        "environment": environment(),
        "expected_seconds": estimate.suite_seconds(selection),
        "seconds": time.monotonic() - begin,
        "calibration": {
            "seconds": calibration_s,
            "repeats": selection.repeats,
            "repetitions": selection.repetitions,
            "models": {
                calibration.name: {
                    "pattern": calibration.pattern,
                    "lead_in": calibration.lead_in,
                    "world_size": calibration.world_size,
                    "seconds": calibration.seconds,
                    "median_cost_us": _median_costs(calibration.cost.to_dict()),
                    "concurrency_factors": calibration.cost.to_dict().get("concurrency", {}),
                    "every_draw_us": calibration.spread(),
                }
                for calibration in calibrations.values()
            },
        },
        "targets": report.TARGETS,
        "summary": report.summarize(records),
        "cases": records,
        "failed_cases": failures,
    }


def _median_costs(costs: dict) -> dict:
    """The cost file's tables by the names `Calibration.spread` gives them (batches as BATCH/ops=K)."""
    return costs["costs_us"] | {f"BATCH/ops={k}": v for k, v in costs.get("batches_us", {}).items()}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    form = parser.add_mutually_exclusive_group()
    form.add_argument(
        "--quick", action="store_true", help="pp4-dp4 and real-pp2, two rounds, one calibration each"
    )
    form.add_argument("--smoke", action="store_true", help="the CI's small case only (PP2 x DP2), two rounds")
    parser.add_argument("--only", nargs="*", default=None, help="case names to run")
    parser.add_argument(
        "--models",
        nargs="+",
        choices=MODELS,
        default=list(MODELS),
        help="cost models to emulate over (default: job alone concurrent; job is the suite's)",
    )
    parser.add_argument(
        "--plan", action="store_true", help="print the cases and the expected duration, and exit"
    )
    parser.add_argument("--keep", default=None, metavar="DIR", help="keep the run folders in DIR")
    parser.add_argument(
        "--offline",
        default=None,
        metavar="DIR",
        help="keep every case's graph, cost files and real medians in DIR (python -m benchmarks.fidelity.offline DIR)",
    )
    parser.add_argument("--out", default=RESULTS_DIR, help="directory for the JSON and Markdown results")
    args = parser.parse_args(argv)
    if "job" not in args.models:
        parser.error("--models must include job (the suite's cost model)")
    try:
        selection = select(
            "smoke" if args.smoke else "quick" if args.quick else "full",
            args.only,
            tuple(m for m in MODELS if m in args.models),
        )
    except ValueError as exc:
        parser.error(str(exc))
    print(estimate.describe(selection), file=sys.stderr, flush=True)
    if args.plan:
        return 0
    _imports()
    record = run_suite(selection, args.keep, args.offline)
    suite = "fidelity" if selection.form == "full" else f"fidelity-{selection.form}"
    paths = write_results(suite, record, report.markdown(record), args.out)
    print(report.markdown(record))
    print("wrote", *paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
