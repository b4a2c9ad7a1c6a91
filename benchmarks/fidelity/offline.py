"""The offline loop: keep a suite run's graphs, cost files and real medians; re-simulate every case in seconds.

A fidelity run costs an hour on a quiet machine, almost all of it the real runs. Whoever works on
the simulation or the cost model needs only what those runs measured: each case's graph, the cost
files it was simulated over and the real ranks' median iteration times. `keep` copies them into a
folder (`run.py --offline DIR` does it at the end of a run); `resimulate` simulates every kept
case again with the code of now, over the kept costs or another cost file, and sets the result
beside the real medians, case by case, in about a second each.

    python -m benchmarks.fidelity.offline DIR [--cost FILE] [--model job] [--only CASE ...]

The error here is the simulation's against the real run, not the emulation's: the emulation
follows its simulation to within its schedule deviation (reported by the suite per case), so a
change that moves the simulation toward the real medians moves the emulation with it.
"""

from __future__ import annotations

import argparse
import os
import shutil
import statistics
import sys
import time
from collections.abc import Sequence

from prism_megatron import files

INDEX = "cases.json"


def keep(records: Sequence[dict], work: str, cost_files: dict, out: str) -> str:
    """Copy each case's graph and cost files and its real medians into `out`; return the index path.

    Args:
        records: the suite's case records (`compare.run_case`).
        work: the suite's working folder (one folder per case, as `run.py` lays it out).
        cost_files: per case name, cost model name -> the cost file the case was simulated over.
    """
    os.makedirs(out, exist_ok=True)
    graphs: dict[str, str] = {}
    cases = []
    for record in records:
        name = record["case"]
        if record["graph"]["captured_here"]:
            source = os.path.join(work, name, f"emulate-{next(iter(record['models']))}", "graph")
            shutil.copytree(source, os.path.join(out, "graphs", name), dirs_exist_ok=True)
            graphs[_base(name, record)] = name
        costs = {}
        for model, path in cost_files[name].items():
            kept = os.path.join("costs", os.path.basename(path))
            os.makedirs(os.path.join(out, "costs"), exist_ok=True)
            shutil.copyfile(path, os.path.join(out, kept))
            costs[model] = kept
        primary = next(iter(record["models"].values()))
        cases.append(
            {
                "case": name,
                "graph": os.path.join("graphs", graphs.get(_base(name, record), name)),
                "layout": record["layout"],
                "stragglers": record["stragglers"],
                "costs": costs,
                "real_median_ms": {
                    str(rank["virtual_rank"]): rank["real"]["pooled_median_ms"] for rank in primary["ranks"]
                },
                "real_round_iqr_pct": record["real_round_iqr_pct"],
            }
        )
    return files.write_json({"cases": cases}, os.path.join(out, INDEX))


def _base(name: str, record: dict) -> str:
    """The case whose graph a straggler case reuses: its name without the "-straggler" suffix."""
    return name.removesuffix("-straggler") if record["stragglers"] else name


def resimulate(folder: str, *, model: str = "job", cost_file: str | None = None, only=None) -> list[dict]:
    """Every kept case simulated again: per real rank, the simulated and real times and the error.

    Raises:
        ValueError: not a kept folder, or a case without the model's costs (naming what is there).
    """
    from prism_megatron.graph import LayoutWorld, load_graph
    from prism_megatron.passes.closed_loop import network_cost
    from prism_megatron.sim import WhatIf, simulate
    from prism_megatron.topology import Layout

    index = os.path.join(folder, INDEX)
    if not os.path.isfile(index):
        raise ValueError(f"{folder}: no {INDEX} here (make one with run.py --offline DIR)")
    rows = []
    for case in files.read_json(index, "offline cases")["cases"]:
        if only and case["case"] not in only:
            continue
        if cost_file is None and model not in case["costs"]:
            raise ValueError(f"case {case['case']}: no {model!r} costs kept; kept: {sorted(case['costs'])}")
        begin = time.monotonic()
        layout = case["layout"]
        world = LayoutWorld(Layout(**{k: v for k, v in layout.items() if k != "dp"}))
        cost = network_cost(cost_file or os.path.join(folder, case["costs"][model]))
        what_if = WhatIf(stragglers={int(r): float(f) for r, f in case["stragglers"]})
        result = simulate(load_graph(os.path.join(folder, case["graph"])), world, cost, what_if)
        for rank, real_ms in case["real_median_ms"].items():
            simulated_ms = result.finish_ns(int(rank)) / 1e6
            rows.append(
                {
                    "case": case["case"],
                    "virtual_rank": int(rank),
                    "real_ms": real_ms,
                    "simulated_ms": simulated_ms,
                    "error_pct": 100.0 * (simulated_ms - real_ms) / real_ms,
                    "rounds": result.num_rounds,
                    "seconds": time.monotonic() - begin,
                }
            )
    return rows


def table(rows: Sequence[dict]) -> str:
    lines = [f"{'case':<34} {'rank':>4} {'real ms':>10} {'simulated ms':>13} {'error %':>8} {'s':>5}"]
    for row in rows:
        lines.append(
            f"{row['case']:<34} {row['virtual_rank']:>4} {row['real_ms']:>10.2f} {row['simulated_ms']:>13.2f} "
            f"{row['error_pct']:>+8.2f} {row['seconds']:>5.1f}"
        )
    if rows:
        errors = [abs(row["error_pct"]) for row in rows]
        lines.append(
            f"mean |error| {statistics.fmean(errors):.2f} %, max {max(errors):.2f} % over {len(rows)}"
        )
    return "\n".join(lines)


def main(argv: Sequence[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("folder", help="a folder made by run.py --offline")
    parser.add_argument("--model", default="job", help="which kept costs to simulate over (default: job)")
    parser.add_argument("--cost", default=None, help="simulate every case over this cost file instead")
    parser.add_argument("--only", nargs="*", default=None, help="case names")
    args = parser.parse_args(argv)
    try:
        rows = resimulate(args.folder, model=args.model, cost_file=args.cost, only=args.only)
    except ValueError as exc:
        parser.error(str(exc))
    print(table(rows))
    return 0


if __name__ == "__main__":
    sys.exit(main())
