"""Time and memory of the simulator on a Llama-3-405B-shaped job, from W = 1024 to 131072.

Why: the emulation re-simulates the job between iterations (closed loop) and `simulate` answers
what-ifs interactively, so a symmetric run must cost the same at any W, and a full per-rank run
(what a straggler or a slow NIC needs) must fit W = 8192 in 10 s on one core and 4 GB.

The job: TP8 x PP16 x DP(W/128), 32 microbatches per replica, 1F1B; 126 layers -> 8 per stage;
sequence 8192, micro-batch 1, hidden 16384. Per microbatch and stage: forward 130 ms and backward
260 ms (2 x 405e9 x 8192 FLOP / 128 ranks at 400 TFLOP/s, backward twice that), each split by 16
TP all-reduces of 256 MiB (two per layer); pipeline messages of 32 MiB (sequence-parallel
activations); then a DP reduce-scatter and all-gather of 6.3 GB (bf16 gradients of 405e9 / 128
parameters), a world-wide grad-norm all-reduce and a 50 ms optimizer step. About 2200 ops per rank.
Costs from the network model's dgx-h100 preset. Full runs carry one straggler (which is what makes
them full).

Each point runs in a fresh process pinned to one core: wall time of building the problem and
simulating (median over repeats), and that process's peak RSS (one repeat; it includes the
interpreter, numpy and torch, listed separately as the baseline).

Run: ``python -m benchmarks.sim.run [--quick] [--out DIR]``. Writes
``<DIR>/<YYYY-MM-DD>-sim.json``, ``.md`` and ``.png`` (DIR defaults to benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import statistics
import subprocess
import sys
import time

from benchmarks.common import (
    RESULTS_DIR,
    environment,
    machine_line,
    pin_to_one_core,
    save_world_size_figure,
    today,
    world_size_figure,
    write_results,
)

WORLD_SIZES = (1024, 2048, 4096, 8192, 16384, 32768, 65536, 131072)
MAX_FULL_W = 32768
"""Full runs beyond this hold O(W x ops) timelines of several GB; the curve stops here."""
BUDGET_S, BUDGET_MB = 10.0, 4096


def job_spec():
    from prism_megatron.sim import PipelineSpec

    return PipelineSpec(
        num_microbatches=32,
        fwd_ns=130_000_000,
        bwd_ns=260_000_000,
        activation_bytes=32 << 20,
        tp_allreduce_bytes=256 << 20,
        tp_allreduces_per_chunk=16,
        dp_grad_bytes=6_300_000_000,
        optimizer_ns=50_000_000,
    )


def measure_one(world_size: int, mode: str) -> dict:
    """One point, in this process (the parent runs it in a child pinned to one core)."""
    import torch  # noqa: F401  (loaded before timing: the extension links it)

    from prism_megatron.graph.world import LayoutWorld
    from prism_megatron.network import CostModel, load_cluster
    from prism_megatron.sim import NetworkCost, WhatIf, layout_pipeline_graph
    from prism_megatron.sim.engine import run_problem
    from prism_megatron.sim.problem import build_problem
    from prism_megatron.topology import Layout

    baseline_mb = resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024
    start = time.perf_counter()
    layout = Layout(world_size=world_size, tp=8, pp=16)
    graph = layout_pipeline_graph(layout, job_spec())
    world = LayoutWorld(layout)
    cost = NetworkCost(CostModel(load_cluster("dgx-h100")))
    what_if = WhatIf(stragglers={world_size // 2 + 3: 1.2}) if mode == "full" else WhatIf()
    problem = build_problem(graph, world, cost, what_if)
    built = time.perf_counter()
    result = run_problem(problem)
    done = time.perf_counter()
    return {
        "world_size": world_size,
        "mode": mode,
        "nodes": problem.num_nodes,
        "ops_simulated": len(result.end_ns),
        "events": result.num_events,
        "iteration_time_ms": result.iteration_time_ns / 1e6,
        "build_s": built - start,
        "simulate_s": done - built,
        "total_s": done - start,
        "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024,
        "baseline_rss_mb": baseline_mb,
    }


def run_child(world_size: int, mode: str) -> dict:
    cmd = [sys.executable, "-m", "benchmarks.sim.run", "--one", str(world_size), mode]
    out = subprocess.run(cmd, check=True, capture_output=True, text=True).stdout
    return json.loads(out.strip().splitlines()[-1])


def measure(world_size: int, mode: str, repeats: int) -> dict:
    runs = [run_child(world_size, mode) for _ in range(repeats)]
    point = dict(runs[0])
    for key in ("build_s", "simulate_s", "total_s"):
        point[key] = statistics.median(r[key] for r in runs)
    point["repeats"] = repeats
    print(
        f"W={world_size:>6} {mode:<9} total {point['total_s']:.2f} s  peak {point['peak_rss_mb']:.0f} MB",
        flush=True,
    )
    return point


def markdown(record: dict) -> str:
    env = record["environment"]
    lines = [
        f"# Simulator: Llama-3-405B-shaped job, TP8 PP16, 32 microbatches ({record['date']})",
        "",
        f"{machine_line(env)}; one core per run.",
        f"Medians of {record['repeats']} runs, each in a fresh process; peak RSS includes the "
        "interpreter and torch (baseline column). Budgets: full W=8192 <= 10 s and <= 4 GB; "
        "symmetric W=131072 <= 10 s.",
        "",
        "| mode | W | nodes | ops simulated | build s | simulate s | total s | peak RSS MB | baseline MB | iteration ms |",
        "|---|---:|---:|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for p in record["points"]:
        lines.append(
            f"| {p['mode']} | {p['world_size']} | {p['nodes']} | {p['ops_simulated']} | {p['build_s']:.2f} | "
            f"{p['simulate_s']:.2f} | {p['total_s']:.2f} | {p['peak_rss_mb']:.0f} | {p['baseline_rss_mb']:.0f} | "
            f"{p['iteration_time_ms']:.1f} |"
        )
    return "\n".join(lines) + "\n"


def plot(record: dict, path: str) -> None:
    fig, (ax_time, ax_mem) = world_size_figure()
    for mode, marker in (("symmetric", "o"), ("full", "s")):
        points = [p for p in record["points"] if p["mode"] == mode]
        ws = [p["world_size"] for p in points]
        ax_time.plot(ws, [p["total_s"] for p in points], marker=marker, label=mode)
        ax_mem.plot(ws, [p["peak_rss_mb"] for p in points], marker=marker, label=mode)
    ax_time.axhline(BUDGET_S, color="grey", linestyle="--", label="10 s budget")
    ax_mem.axhline(BUDGET_MB, color="grey", linestyle="--", label="4 GB budget")
    save_world_size_figure(
        fig,
        [(ax_time, "build + simulate, s"), (ax_mem, "peak RSS, MB")],
        "prism-megatron simulator, Llama-3-405B-shaped TP8 PP16 job, one core",
        path,
    )


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    parser.add_argument("--quick", action="store_true", help="W = 1024 and 8192 only, one run each")
    parser.add_argument("--out", default=RESULTS_DIR)
    parser.add_argument("--one", nargs=2, metavar=("W", "MODE"), help=argparse.SUPPRESS)
    args = parser.parse_args()
    if args.one:
        pin_to_one_core()
        print(json.dumps(measure_one(int(args.one[0]), args.one[1])))
        return
    sizes = (1024, 8192) if args.quick else WORLD_SIZES
    repeats = 1 if args.quick else 3
    points = []
    for mode in ("symmetric", "full"):
        for world_size in sizes:
            if mode == "full" and world_size > MAX_FULL_W:
                continue
            points.append(measure(world_size, mode, repeats))
    record = {
        "suite": "sim",
        "date": today(),
        "environment": environment(),
        "repeats": repeats,
        "points": points,
    }
    json_path, md_path = write_results("sim", record, markdown(record), args.out)
    png_path = os.path.splitext(json_path)[0] + ".png"
    plot(record, png_path)
    print(f"wrote {json_path}, {md_path}, {png_path}")


if __name__ == "__main__":
    main()
