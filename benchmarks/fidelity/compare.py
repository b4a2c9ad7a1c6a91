"""One fidelity case end to end: the capture, the simulation, the real run, the emulation, the numbers.

1. Capture: each slice rank (one per role) runs alone among virtual peers that arrive at once
   (instant mode), recording every op; the graph is built from those recordings. Sleep-compute
   slice ranks run at the same time (each in its own virtual world); real-compute ones one after
   the other, as their compute needs a core each.
   The graph is built by the project's own capture (`prism_megatron.graph.capture`).
2. Simulation of the whole job over the calibrated loopback costs (with the case's straggler as a
   what-if) gives the replay schedule of each real rank.
3. Ground truth: all W ranks real, one forked process each, gloo on loopback.
4. Emulation: only the case's real ranks run, the replay engine times their virtual peers; each
   real rank folds what it measures into the next iteration's schedule (the emulation pass's
   closed loop, `loop.py`), unless the case is run `static`.
Steps 3 and 4 alternate `Case.rounds` times, and each side's iterations are pooled.

The error of a real rank is (emulated median - real median) / real median of its iteration time,
medians over the timed iterations after warm-up. Memory is the rank's peak of live tensor storage
in both runs (the highest over rounds). The rank's compute time (inside megatron-core's forward_step and backward_step) is
recorded in both runs too, for the overhead suite.
"""

from __future__ import annotations

import os
import statistics
import time
from typing import Any

from benchmarks.fidelity import workload
from benchmarks.fidelity.cases import Case
from benchmarks.fidelity.loop import ReplayInputs
from benchmarks.fidelity.processes import run_processes

CAPTURE_ITERATIONS = 8
CAPTURE_WARMUP = 2


def iteration_times_ms(result: dict) -> list[float]:
    return [(end - start) / 1e6 for start, end in zip(result["starts_ns"], result["ends_ns"], strict=True)]


def _captures(job: workload.Job, layout) -> list:
    """Each slice rank alone among instant virtual peers, recording; one `RankCapture` each."""
    from prism_megatron.graph.capture import CapturedIteration, RankCapture

    requests = [
        workload.Request(
            job=job, mode="capture", iterations=CAPTURE_ITERATIONS, real_ranks=(rank,), memory_iterations=0
        )
        for rank in layout.default_slice()
    ]
    if job.gpt_flags:  # compute-bound: one at a time, so slice ranks do not share the cores
        recordings = [run_processes(workload.run, [r], connected=False)[0] for r in requests]
    else:  # sleeping: together, each alone in its own virtual world
        recordings = run_processes(workload.run, requests, connected=False)
    captures = []
    for recorded in recordings:
        iterations = tuple(
            CapturedIteration(
                start_ns=start,
                end_ns=end,
                events=tuple(e for e in recorded["events"] if start <= e.issue_ns < end),
                p2p_calls=tuple(c for c in recorded["exchanges_ns"] if start <= c[0] < end),
            )
            for start, end in zip(recorded["starts_ns"], recorded["ends_ns"], strict=True)
        )
        rank = recorded["virtual_rank"]
        captures.append(
            RankCapture(
                virtual_rank=rank,
                role=layout.role_of(rank).name,
                iterations=iterations,
                num_warmup=CAPTURE_WARMUP,
            )
        )
    return captures


def _simulate(case: Case, captures: list, cost_fn):
    from prism_megatron.graph import LayoutWorld
    from prism_megatron.graph.capture import build_graph
    from prism_megatron.sim import WhatIf, replay_schedules, simulate
    from prism_megatron.topology import Layout

    world = LayoutWorld(Layout(**case.job.layout_kwargs()))
    graph = build_graph(captures, world, case.job.layout_kwargs(), extra={"model": case.kind})
    what_if = WhatIf(stragglers=dict(case.job.stragglers)) if case.job.stragglers else None
    result = simulate(graph, world, cost_fn, what_if)
    return graph, result, replay_schedules(result, case.real_ranks)


def _pooled(runs: list[dict], key: str, warmup: int) -> list[float]:
    """Per-iteration values (ms) of every run after its warm-up, in run order."""
    if key == "iterations":
        return [t for run in runs for t in iteration_times_ms(run)[warmup:]]
    return [v / 1e6 for run in runs for v in run[key][warmup:]]


def _rank_record(case: Case, real: list[dict], emulated: list[dict], simulated_ns: int) -> dict[str, Any]:
    """One real rank's numbers, its runs' iterations after warm-up pooled (see `Case.rounds`)."""
    real_ms, emulated_ms = (
        _pooled(real, "iterations", case.warmup),
        _pooled(emulated, "iterations", case.warmup),
    )
    real_median, emulated_median = statistics.median(real_ms), statistics.median(emulated_ms)
    real_peak = max(run["memory"]["peak_bytes"] for run in real)
    emulated_peak = max(run["memory"]["peak_bytes"] for run in emulated)
    real_compute = statistics.median(_pooled(real, "compute_ns", case.warmup))
    emulated_compute = statistics.median(_pooled(emulated, "compute_ns", case.warmup))
    return {
        "virtual_rank": real[0]["virtual_rank"],
        "real_median_ms": real_median,
        "emulated_median_ms": emulated_median,
        "simulated_ms": simulated_ns / 1e6,
        "error_pct": 100.0 * (emulated_median - real_median) / real_median,
        "real_iterations_ms": real_ms,
        "emulated_iterations_ms": emulated_ms,
        "real_peak_bytes": real_peak,
        "emulated_peak_bytes": emulated_peak,
        "memory_diff_bytes": emulated_peak - real_peak,
        "peak_bytes_every_run": {
            "real": [run["memory"]["peak_bytes"] for run in real],
            "emulated": [run["memory"]["peak_bytes"] for run in emulated],
        },
        "real_compute_median_ms": real_compute,
        "emulated_compute_median_ms": emulated_compute,
        "compute_overhead_pct": 100.0 * (emulated_compute - real_compute) / real_compute,
        "replay": [run["replay"] for run in emulated],
    }


def _real_run(case: Case) -> list[dict]:
    """All W ranks real, one forked process each; results by virtual rank."""
    request = workload.Request(job=case.job, mode="real", iterations=case.iterations)
    return run_processes(workload.run, [request] * case.job.world_size)


def _emulated_run(case: Case, inputs: ReplayInputs) -> list[dict]:
    """The case's real ranks only, each replaying; results in `case.real_ranks` order."""
    request = workload.Request(
        job=case.job,
        mode="emulate",
        iterations=case.iterations,
        real_ranks=case.real_ranks,
        replay_inputs=inputs,
    )
    return run_processes(workload.run, [request] * len(case.real_ranks))


def group_sizes(job: workload.Job) -> list[int]:
    """Sizes of the groups the case communicates in: p2p pairs, TP, DP, model-parallel (TP x PP)."""
    return sorted({2, job.tp, job.dp, job.tp * job.pp} - {1})


def _replay_inputs(case: Case, captures: list, cost_fn, static: bool):
    """The simulation of the case under one cost model, and what its emulated ranks replay."""
    graph, result, _ = _simulate(case, captures, cost_fn)
    inputs = ReplayInputs(
        graph=graph,
        layout_kwargs=case.job.layout_kwargs(),
        cost_fn=cost_fn,
        stragglers=dict(case.job.stragglers),
        real_ranks=case.real_ranks,
        static=static,
    )
    return result, inputs


def _ranks(case: Case, real_runs: list, emulated_runs: list, result) -> list[dict[str, Any]]:
    return [
        _rank_record(
            case, [run[r] for run in real_runs], [run[i] for run in emulated_runs], result.finish_ns(r)
        )
        for i, r in enumerate(case.real_ranks)
    ]


def run_case(
    case: Case, cost_fn=None, *, static: bool = False, alternatives: dict | None = None
) -> dict[str, Any]:
    """Run the case's passes and compare (see the module docstring).

    Args:
        static: the emulated ranks keep the first replay schedule throughout instead of folding
            what they measure into the next (the emulation pass's closed loop).
        cost_fn: the simulator's communication costs; None calibrates gloo on loopback right before
            the case, for the group sizes it uses (so the costs are those of the machine as loaded
            at the time of the case).
        alternatives: other cost models by name; each gets its own simulation and emulated runs
            against the same real runs, recorded under ``alternatives`` (the error a different
            network model would give).
    """
    from benchmarks.fidelity.calibrate import calibrate
    from prism_megatron.topology import Layout

    job = case.job
    wall = {}
    begin = time.monotonic()
    if cost_fn is None:
        cost_fn = calibrate(group_sizes(job))
    wall["calibrate_s"] = time.monotonic() - begin
    load_before = os.getloadavg()[0]
    begin = time.monotonic()
    captures = _captures(job, Layout(**job.layout_kwargs()))
    models = {"primary": cost_fn, **(alternatives or {})}
    simulated = {name: _replay_inputs(case, captures, cost, static) for name, cost in models.items()}
    wall["capture_and_simulate_s"] = time.monotonic() - begin
    real_runs, emulated_runs = [], {name: [] for name in models}
    for _ in range(case.rounds):  # alternate, so a change of load on the machine hits both alike
        begin = time.monotonic()
        real_runs.append(_real_run(case))
        wall["real_s"] = wall.get("real_s", 0.0) + time.monotonic() - begin
        begin = time.monotonic()
        for name, (_, inputs) in simulated.items():
            emulated_runs[name].append(_emulated_run(case, inputs))
        wall["emulate_s"] = wall.get("emulate_s", 0.0) + time.monotonic() - begin
    result = simulated["primary"][0]
    ranks = _ranks(case, real_runs, emulated_runs["primary"], result)
    record = {
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
        "num_real_processes_ground_truth": job.world_size,
        "rounds": case.rounds,
        "closed_loop": not static,
        "simulated_iteration_ms": result.iteration_time_ns / 1e6,
        "ranks": ranks,
        "error_pct": statistics.fmean(r["error_pct"] for r in ranks),
        "memory_diff_bytes": max((r["memory_diff_bytes"] for r in ranks), key=abs),
        "wall": wall,
        "load_average_1min": {"before": load_before, "after": os.getloadavg()[0]},
        "calibration_us": cost_fn.as_dict() if hasattr(cost_fn, "as_dict") else None,
    }
    record["alternatives"] = {}
    for name in alternatives or {}:
        other = _ranks(case, real_runs, emulated_runs[name], simulated[name][0])
        record["alternatives"][name] = {
            "simulated_iteration_ms": simulated[name][0].iteration_time_ns / 1e6,
            "error_pct": statistics.fmean(r["error_pct"] for r in other),
            "ranks": [
                {k: r[k] for k in ("virtual_rank", "emulated_median_ms", "simulated_ms", "error_pct")}
                for r in other
            ],
        }
    return record
