"""How the emulation's set-up grows with the target job: W = 1k, 8k, 64k, 131k.

Why: a real rank of a 131072-GPU job must come up, build Megatron's groups, and get its replay
schedule on one CPU core in reasonable time and memory; anything that grows faster than W (or
that grows with W where it should not) shows up here first.

The job: Llama-3-405B-shaped, TP8 x PP16 x DP(W / 128), 32 micro-batches per replica, 1F1B (the
simulator benchmark's job, `benchmarks.sim.run.job_spec`). Each phase runs in a fresh process on one
core, W by W; recorded: wall time and the process's peak RSS (and the baseline after imports).

* topology: the layout, every role and the default slice, one rank's every group, the role of
  every rank (O(W) arrays);
* activation: the prism backend as virtual rank 0 of W (the only real rank), then megatron-core's
  own `initialize_model_parallel` (TP8, PP16) through the runtime that routes its groups: every
  `new_group` of the job, as a real rank does at start-up;
* graph: the execution graph of every role (synthetic, as the capture would give it), its
  expansion's op count over all W ranks, and writing it to disk;
* simulation: one iteration of the whole job (one node per role) and the real rank's replay
  schedule, what the emulation computes before the first iteration.

Run: ``python -m benchmarks.scale.run [--quick] [--out DIR]``. Writes
``<DIR>/<YYYY-MM-DD>-scale.json``, ``.md`` and ``.png`` (DIR defaults to benchmarks/results/).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import subprocess
import sys
import tempfile
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

WORLD_SIZES = (1024, 8192, 65536, 131072)
PHASES = ("topology", "activation", "graph", "simulation")
TP, PP = 8, 16


def _rss_mb() -> float:
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024


def _topology(world_size: int) -> dict:
    from prism_megatron.graph import LayoutWorld
    from prism_megatron.topology import GROUP_KINDS, Layout

    layout = Layout(world_size=world_size, tp=TP, pp=PP)
    roles = layout.roles()
    slice_ranks = layout.default_slice()
    groups = {
        kind: len(layout.group(kind, world_size - 1))
        for kind in GROUP_KINDS
        if layout.has_group(kind, world_size - 1)
    }
    LayoutWorld(layout).role_ids()
    return {"roles": len(roles), "slice": len(slice_ranks), "group_kinds": len(groups)}


def _activation(world_size: int) -> dict:
    import torch.distributed as dist
    from megatron.core import parallel_state

    from prism_megatron.config import EmulationConfig, PrismConfig
    from prism_megatron.megatron.run import runtime

    config = PrismConfig(
        emulation=EmulationConfig(emulate=True, world_size=world_size, ranks="0", device="cpu")
    )
    rt = runtime.Runtime.start(config)
    rt.sizes = runtime.ParallelSizes(tp=TP, pp=PP)
    try:
        rt.bring_up()
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=TP, pipeline_model_parallel_size=PP, create_gloo_process_groups=False
        )
        return {"dp_size": parallel_state.get_data_parallel_world_size(), "world": dist.get_world_size()}
    finally:
        parallel_state.destroy_model_parallel()
        rt.close()


def _graph(world_size: int) -> dict:
    from benchmarks.sim.run import job_spec
    from prism_megatron.graph import ExpandedGraph, LayoutWorld, save_graph
    from prism_megatron.sim import layout_pipeline_graph
    from prism_megatron.topology import Layout

    layout = Layout(world_size=world_size, tp=TP, pp=PP)
    graph = layout_pipeline_graph(layout, job_spec())
    expanded = ExpandedGraph(graph, LayoutWorld(layout))
    with tempfile.TemporaryDirectory() as directory:
        save_graph(graph, directory)
    return {"role_ops": graph.num_ops, "job_ops": expanded.num_ops()}


def _simulation(world_size: int) -> dict:
    from benchmarks.sim.run import job_spec
    from prism_megatron.graph import LayoutWorld
    from prism_megatron.network import CostModel, load_cluster
    from prism_megatron.sim import NetworkCost, layout_pipeline_graph, replay_schedules, simulate
    from prism_megatron.topology import Layout

    layout = Layout(world_size=world_size, tp=TP, pp=PP)
    graph = layout_pipeline_graph(layout, job_spec())
    result = simulate(graph, LayoutWorld(layout), NetworkCost(CostModel(load_cluster("dgx-h100"))))
    (schedule,) = replay_schedules(result, [0]).values()
    return {"iteration_ms": result.iteration_time_ns / 1e6, "scheduled_groups": len(schedule.collectives)}


def measure_one(phase: str, world_size: int) -> dict:
    """One phase at one W, in this process (the parent runs it in a child pinned to one core)."""
    import warnings

    warnings.filterwarnings("ignore")
    import megatron.core  # noqa: F401  (imports before the baseline)
    import prism_megatron._C  # noqa: F401
    import torch  # noqa: F401

    baseline_mb = _rss_mb()
    begin = time.perf_counter()
    facts = {"topology": _topology, "activation": _activation, "graph": _graph, "simulation": _simulation}[
        phase
    ](world_size)
    return {
        "phase": phase,
        "world_size": world_size,
        "seconds": time.perf_counter() - begin,
        "peak_rss_mb": _rss_mb(),
        "baseline_rss_mb": baseline_mb,
        **facts,
    }


def run_child(phase: str, world_size: int) -> dict:
    command = [sys.executable, "-m", "benchmarks.scale.run", "--one", phase, str(world_size)]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run(command, check=True, capture_output=True, text=True, env=env)
    point = json.loads(done.stdout.strip().splitlines()[-1])
    print(
        f"scale: {phase:<10} W={world_size:>6} {point['seconds']:7.2f} s  {point['peak_rss_mb']:7.0f} MB",
        flush=True,
    )
    return point


def markdown(record: dict) -> str:
    env = record["environment"]
    lines = [
        f"# Emulation set-up at scale: TP8 x PP16 x DP(W/128), Llama-3-405B-shaped ({record['date']})",
        "",
        f"{machine_line(env, ('python', 'torch', 'megatron_core', 'prism_megatron'))}; one core per run. "
        "Each phase in a fresh process; peak RSS includes the "
        "interpreter, torch and megatron-core (baseline column).",
        "",
        "| phase | W | seconds | peak RSS MB | baseline MB | facts |",
        "|---|---:|---:|---:|---:|---|",
    ]
    for p in record["points"]:
        facts = {
            k: v
            for k, v in p.items()
            if k not in ("phase", "world_size", "seconds", "peak_rss_mb", "baseline_rss_mb")
        }
        lines.append(
            f"| {p['phase']} | {p['world_size']} | {p['seconds']:.2f} | {p['peak_rss_mb']:.0f} | "
            f"{p['baseline_rss_mb']:.0f} | {json.dumps(facts)} |"
        )
    return "\n".join(lines) + "\n"


def plot(record: dict, path: str) -> None:
    fig, (ax_time, ax_mem) = world_size_figure()
    for phase, marker in zip(PHASES, "osd^", strict=True):
        points = [p for p in record["points"] if p["phase"] == phase]
        ws = [p["world_size"] for p in points]
        ax_time.plot(ws, [p["seconds"] for p in points], marker=marker, label=phase)
        ax_mem.plot(ws, [p["peak_rss_mb"] - p["baseline_rss_mb"] for p in points], marker=marker, label=phase)
    save_world_size_figure(
        fig,
        [(ax_time, "wall time, s"), (ax_mem, "peak RSS above baseline, MB")],
        "prism-megatron set-up of one real rank, TP8 PP16 job, one core",
        path,
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="W = 1024 and 8192 only")
    parser.add_argument("--out", default=RESULTS_DIR)
    parser.add_argument("--one", nargs=2, metavar=("PHASE", "W"), help=argparse.SUPPRESS)
    args = parser.parse_args(argv)
    if args.one:
        pin_to_one_core()
        print(json.dumps(measure_one(args.one[0], int(args.one[1]))))
        return 0
    sizes = WORLD_SIZES[:2] if args.quick else WORLD_SIZES
    points = [run_child(phase, world_size) for phase in PHASES for world_size in sizes]
    record = {"suite": "scale", "date": today(), "environment": environment(), "points": points}
    json_path, md_path = write_results("scale", record, markdown(record), args.out)
    png_path = os.path.splitext(json_path)[0] + ".png"
    plot(record, png_path)
    print(f"wrote {json_path}, {md_path}, {png_path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
