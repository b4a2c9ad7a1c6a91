"""One fidelity case end to end through the product's passes: capture, simulation, rounds, numbers.

1. Capture: the product's capture passes of the job (`passes.capture`), the graph built from them.
   A case may reuse another case's graph (a straggler is a what-if of the same job: `--prism-graph`
   with `--prism-straggler`, as a user would ask it).
2. Simulation: the driver's, over each cost model (a file of calibrated costs per model: the job
   pattern's is the suite's model, the alone pattern's is reported beside it).
3. Rounds: the all-real run (ground truth) and the product's emulation pass under each cost model
   alternate `Case.rounds` times, real first in even rounds and last in odd ones, so a drift of the
   machine's load hits both sides alike. Every run is a fresh set of processes.

Per real rank and round, the error is (emulated median - real median) / real median of its
iteration times after warm-up; the case reports the rounds' median error, inter-quartile range and
worst round, the pooled medians, and the real run's own spread over rounds (its stability). Memory
is the rank's peak of live tensor storage, the highest over rounds on each side. The rank's compute
time (inside megatron-core's forward_step and backward_step, wall and CPU time) is recorded on both
sides too, per round, for the overhead suite.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from benchmarks.fidelity import passes, stats
from benchmarks.fidelity.cases import Case

PRIMARY = "job"
STABLE_REAL_IQR_PCT = 2.0
"""A case whose real run's round medians spread wider than this (inter-quartile range over median)
has a ground truth that moves more than the targets allow; it is reported and left out of them."""


def group_sizes(job) -> list[int]:
    """Sizes of the groups the case communicates in: p2p pairs, TP, DP, model-parallel (TP x PP)."""
    return sorted({2, job.tp, job.dp, job.tp * job.pp} - {1})


def _after_warmup(run: dict, warmup: int, key: str = "iteration_times_ms") -> list[float]:
    values = run[key][warmup:]
    return [v / 1e6 for v in values] if key.startswith("compute") else list(values)


def _one_side(runs: list[dict], warmup: int) -> dict[str, Any]:
    """One rank's runs of one side (real or an emulation): per-round medians and what they pool."""
    per_round = [statistics.median(_after_warmup(run, warmup)) for run in runs]
    pooled = [t for run in runs for t in _after_warmup(run, warmup)]
    compute = [statistics.median(_after_warmup(run, warmup, "compute_ns")) for run in runs]
    compute_cpu = [statistics.median(_after_warmup(run, warmup, "compute_cpu_ns")) for run in runs]
    return {
        "round_medians_ms": per_round,
        "pooled_median_ms": statistics.median(pooled),
        "iterations_ms": [run["iteration_times_ms"] for run in runs],
        "compute_round_medians_ms": compute,
        "compute_cpu_round_medians_ms": compute_cpu,
        "peak_bytes": max(run["memory"]["peak_bytes"] for run in runs),
        "peak_bytes_every_round": [run["memory"]["peak_bytes"] for run in runs],
        "cpu_share": runs[0].get("cpu_share"),
    }


def _rank_record(real: list[dict], emulated: list[dict], warmup: int, simulated_ns: int) -> dict[str, Any]:
    real_side, emu_side = _one_side(real, warmup), _one_side(emulated, warmup)
    errors = [
        100.0 * (e - r) / r
        for e, r in zip(emu_side["round_medians_ms"], real_side["round_medians_ms"], strict=True)
    ]
    compute, compute_cpu = (
        [100.0 * (e - r) / r for e, r in zip(emu_side[key], real_side[key], strict=True)]
        for key in ("compute_round_medians_ms", "compute_cpu_round_medians_ms")
    )
    return {
        "virtual_rank": real[0]["virtual_rank"],
        "simulated_ms": simulated_ns / 1e6,
        "real": real_side,
        "emulated": emu_side,
        "error_pct": stats.spread(errors),
        "round_errors_pct": errors,
        "pooled_error_pct": 100.0
        * (emu_side["pooled_median_ms"] - real_side["pooled_median_ms"])
        / real_side["pooled_median_ms"],
        "real_round_iqr_pct": stats.relative_iqr_pct(real_side["round_medians_ms"]),
        "schedule_deviation_pct": 100.0
        * (emu_side["pooled_median_ms"] - simulated_ns / 1e6)
        / (simulated_ns / 1e6),
        "memory_diff_bytes": emu_side["peak_bytes"] - real_side["peak_bytes"],
        "compute_overhead_pct": stats.spread(compute),
        "compute_cpu_overhead_pct": stats.spread(compute_cpu),
        "phase": emulated[0]["phase"],
        "phase_summary": emulated[-1]["phase_summary"],
    }


def _timed(sampler_runs: list, own: int, run):
    with stats.LoadSampler() as sampler:
        begin = time.monotonic()
        result = run()
        seconds = time.monotonic() - begin
    sampler_runs.append(sampler.summary(own) | {"seconds": seconds})
    return result


def _rounds(case: Case, plans: dict, root: str) -> tuple[list, dict, list]:
    """Real and emulated runs, alternating; (real runs, emulated runs by model, load per run)."""
    job = case.job
    real_runs, emulated_runs, load = [], {name: [] for name in plans}, []

    def real():
        out = os.path.join(root, "real")
        real_runs.append(_timed(load, job.world_size, lambda: passes.real(job, out, case.iterations)))

    def emulated():
        for name, plan in plans.items():
            emulated_runs[name].append(
                _timed(
                    load, len(case.real_ranks), lambda plan=plan: passes.emulate(plan, job, case.iterations)
                )
            )

    for number in range(case.rounds):
        order = (real, emulated) if number % 2 == 0 else (emulated, real)
        for side in order:
            side()
    return real_runs, emulated_runs, load


def capture_graph(case: Case, plan):
    """The product's capture of the case's job, and the graph it makes."""
    return passes.capture(plan, case.job)


def run_case(case: Case, cost_files: dict[str, str], root: str, *, graph=None, draws=()) -> dict[str, Any]:
    """Run the case's passes and compare (see the module docstring).

    Args:
        cost_files: cost model name -> file of measured costs (`PRIMARY` first).
        root: the case's working folder (one run folder per cost model, one for the real runs).
        graph: reuse this graph instead of capturing (a what-if of another case's job).
        draws: the primary model's individual calibrations; the case's graph is simulated over each,
            so the results say how far one calibration draw moves the prediction.
    """
    from prism_megatron.graph import LayoutWorld
    from prism_megatron.sim import WhatIf, simulate

    job, wall = case.job, {}
    plans = {
        name: passes.plan(
            job,
            real_ranks=case.real_ranks,
            out_dir=os.path.join(root, f"emulate-{name}"),
            cost_file=path,
            iterations=case.iterations,
            capture_iters=case.capture_iters,
        )
        for name, path in cost_files.items()
    }
    begin = time.monotonic()
    captured = graph is None
    if captured:
        graph = capture_graph(case, plans[PRIMARY])
    simulated = {name: passes.simulate(plan, graph) for name, plan in plans.items()}
    world = LayoutWorld(plans[PRIMARY].layout)
    what_if = WhatIf(stragglers=dict(job.stragglers))
    by_draw = [simulate(graph, world, draw, what_if).iteration_time_ns / 1e6 for draw in draws]
    wall["capture_and_simulate_s"] = time.monotonic() - begin
    begin = time.monotonic()
    real_runs, emulated_runs, load = _rounds(case, plans, root)
    wall["rounds_s"] = time.monotonic() - begin
    models = {}
    for name in plans:
        ranks = [
            _rank_record(
                [run[r] for run in real_runs],
                [run[i] for run in emulated_runs[name]],
                case.warmup,
                simulated[name].finish_ns(r),
            )
            for i, r in enumerate(case.real_ranks)
        ]
        models[name] = {"simulated_iteration_ms": simulated[name].iteration_time_ns / 1e6, "ranks": ranks}
    return _record(case, models, graph, captured, by_draw, load, wall)


def _record(case: Case, models: dict, graph, captured: bool, by_draw: list, load: list, wall: dict) -> dict:
    job = case.job
    primary = models[PRIMARY]["ranks"]
    real_iqr = max(r["real_round_iqr_pct"] for r in primary)
    # The case's error in a round: its real ranks' mean (two real ranks of one TP pair move together).
    round_errors = [
        statistics.fmean(column) for column in zip(*(r["round_errors_pct"] for r in primary), strict=True)
    ]
    return {
        "case": case.name,
        "kind": case.kind,
        "layout": job.layout_kwargs() | {"dp": job.dp},
        "model": {"gpt_flags": list(job.gpt_flags)}
        if job.gpt_flags
        else {
            "num_microbatches": job.num_microbatches,
            "num_layers": job.num_layers,
            "fwd_ms_per_layer": job.fwd_ms,
            "bwd_ms_per_layer": job.bwd_ms,
        },
        "overlap_grad_reduce": job.overlap_grad_reduce,
        "stragglers": [list(s) for s in job.stragglers],
        "real_ranks": list(case.real_ranks),
        "graph": {"captured_here": captured, "num_ops": graph.num_ops, "roles": sorted(graph.roles)},
        "rounds": case.rounds,
        "iterations": case.iterations,
        "warmup": case.warmup,
        "num_processes": {"real": job.world_size, "emulated": len(case.real_ranks)},
        "models": models,
        "simulated_ms_by_calibration_draw": by_draw,
        "stable": real_iqr <= STABLE_REAL_IQR_PCT,
        "real_round_iqr_pct": real_iqr,
        "round_errors_pct": round_errors,
        "error_pct": stats.spread(round_errors),
        "memory_diff_bytes": max((r["memory_diff_bytes"] for r in primary), key=abs),
        "load": load,
        "wall": wall,
    }
