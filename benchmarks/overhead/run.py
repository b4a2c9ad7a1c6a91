"""What emulation costs the real rank: its compute time, and the host time of each communication op.

Why: the emulation's promise is that a real rank runs as it would in the real job. Whatever the
prism layers add to its own work (the CPU device shim is there in both runs; the backend, the replay
engine, the pipeline interceptor and the virtual world only under emulation) shows up as compute
that is slower than in the real run, or as exchanges that cost more than the real ones. Goals, each
reported met or NOT met:

* compute: the built-in GPT (`benchmarks.fidelity.cases.real_compute_cases`: PP2, DP2, TP2 of two
  ranks), its all-real run against the product's emulation pass with rank 1 real and rank 0 virtual,
  in alternating rounds as the fidelity suite runs them (`benchmarks.fidelity.compare`). Compute =
  time inside megatron-core's forward_step and backward_step, per iteration, median after warm-up,
  the same rank on the same core in both runs. Goal: the median over rounds at most 1 % slower. With
  TP2 the tensor-parallel all-reduces are inside the layers, so that case's "compute" includes them
  (real gloo in one run, the replay engine in the other); PP2 and DP2 are compute alone.
* pipeline exchange: one exchange through megatron-core's communicator, the prism interceptor with
  a virtual neighbour against real gloo between two processes (`exchange.py`). Goal: the
  interceptor's median at most the gloo exchange's (ratio <= 1.0), for each message size.
* per op (reported): the host time of one collective, issued and waited, on a group whose other
  members are virtual (prism, instant mode, zero cost) against the same call on a one-member gloo
  group (torch's own path and a trivial backend). benchmarks/backend measures it in more detail.

Run: ``python -m benchmarks.overhead.run [--quick] [--out DIR]`` (about 8 min on a quiet 2-core
machine; --quick: PP2 and DP2, two rounds, fewer calls). Writes ``<DIR>/<YYYY-MM-DD>-overhead.json``
and ``.md`` (DIR defaults to benchmarks/results/).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")  # before torch: processes are forked from this one

import argparse
import statistics
import sys
import time
import warnings

from benchmarks.common import EVERY_PACKAGE, RESULTS_DIR, environment, machine_line, today, write_results

GOAL_COMPUTE_PCT = 1.0
GOAL_EXCHANGE_RATIO = 1.0
OPS = ("all_reduce", "broadcast", "all_gather_into_tensor")
PER_OP_CALLS = 2000


def _time_ops(num_calls: int) -> dict[str, float]:
    """Median host time (us) of each op on the default group, issued and waited."""
    import torch
    import torch.distributed as dist

    tensor = torch.zeros(1)
    out = torch.zeros(dist.get_world_size())
    calls = {
        "all_reduce": lambda: dist.all_reduce(tensor),
        "broadcast": lambda: dist.broadcast(tensor, src=0),
        "all_gather_into_tensor": lambda: dist.all_gather_into_tensor(out, tensor),
    }
    medians = {}
    for name in OPS:
        samples = []
        for _ in range(num_calls):
            begin = time.perf_counter_ns()
            calls[name]()
            samples.append(time.perf_counter_ns() - begin)
        medians[name] = statistics.median(samples) / 1e3
    return medians


def per_op_overhead(num_calls: int) -> dict:
    """In a fresh process: prism (W = 8, seven virtual peers, instant) against one-member gloo."""
    import torch
    import torch.distributed as dist

    from prism_megatron import backend

    torch.set_num_threads(1)
    dist.init_process_group("gloo", store=dist.HashStore(), rank=0, world_size=1)
    gloo = _time_ops(num_calls)
    dist.destroy_process_group()
    with backend.activate(world_size=8, virtual_rank=0, real_ranks=[0]):
        prism = _time_ops(num_calls)
    return {name: {"gloo_one_member_us": gloo[name], "prism_virtual_peers_us": prism[name]} for name in OPS}


def _compute(cases, work: str) -> list[dict]:
    """Each case's compute overhead per round, through the fidelity suite's passes."""
    from benchmarks.fidelity.calibrate import calibrate
    from benchmarks.fidelity.compare import run_case
    from prism_megatron import files

    cost = calibrate([2], pattern="job", world_size=2, lead_in="busy", repeats=1).cost
    cost_file = os.path.join(work, "costs.json")
    files.write_json(cost.to_dict(), cost_file)
    rows = []
    for case in cases:
        print(f"overhead: {case.name} ({case.rounds} rounds) ...", file=sys.stderr, flush=True)
        record = run_case(case, {"job": cost_file}, os.path.join(work, case.name))
        (rank,) = record["models"]["job"]["ranks"]
        overhead = rank["compute_overhead_pct"]
        rows.append(
            {
                "case": case.name,
                "virtual_rank": rank["virtual_rank"],
                "real_compute_round_medians_ms": rank["real"]["compute_round_medians_ms"],
                "emulated_compute_round_medians_ms": rank["emulated"]["compute_round_medians_ms"],
                "compute_overhead_pct": overhead,
                "compute_cpu_overhead_pct": rank["compute_cpu_overhead_pct"],
                "verdict": "met" if overhead["median"] <= GOAL_COMPUTE_PCT else "NOT met",
                "iteration_error_pct": rank["error_pct"],
                "cpu_share": {"real": rank["real"]["cpu_share"], "emulated": rank["emulated"]["cpu_share"]},
                "load": record["load"],
            }
        )
    return rows


def run_suite(quick: bool) -> dict:
    import dataclasses
    import shutil
    import tempfile

    from benchmarks.fidelity.cases import real_compute_cases
    from benchmarks.fidelity.processes import run_processes
    from benchmarks.overhead import exchange

    cases = real_compute_cases()
    if quick:
        cases = [dataclasses.replace(c, rounds=2) for c in cases[:2]]
    work = tempfile.mkdtemp(prefix="prism-overhead-")
    try:
        compute = _compute(cases, work)
    finally:
        shutil.rmtree(work, ignore_errors=True)
    (per_op,) = run_processes(per_op_overhead, [200 if quick else PER_OP_CALLS], connected=False)
    pipeline = exchange.run(500 if quick else 2000, 3 if quick else 5)
    pipeline["verdict"] = {
        name: "met" if ratio <= GOAL_EXCHANGE_RATIO else "NOT met"
        for name, ratio in pipeline["ratio"].items()
    }
    return {
        "suite": "overhead",
        "date": today(),
        "environment": environment(),
        "goal_compute_overhead_pct": GOAL_COMPUTE_PCT,
        "goal_exchange_ratio": GOAL_EXCHANGE_RATIO,
        "compute": compute,
        "per_op": per_op,
        "pipeline_exchange": pipeline,
        "verdicts": {
            "compute": "met" if all(row["verdict"] == "met" for row in compute) else "NOT met",
            "pipeline_exchange": "met"
            if all(v == "met" for v in pipeline["verdict"].values())
            else "NOT met",
        },
    }


def markdown(record: dict) -> str:
    env = record["environment"]
    verdicts = record["verdicts"]
    lines = [
        f"# Overhead of emulation on the real rank ({record['date']})",
        "",
        machine_line(env, EVERY_PACKAGE) + ".",
        "",
        f"Compute time of rank 1 (inside forward_step and backward_step, median per iteration of each round), "
        f"the all-real run against the product's emulation pass (rank 0 virtual), rounds alternating. Goal: "
        f"the rounds' median at most {record['goal_compute_overhead_pct']} % slower: **{verdicts['compute']}**. "
        "CPU time: the same spans in this thread's CPU time (work done, not waits for a core).",
        "",
        "| case | rounds | real ms | emulated ms | overhead % median | IQR | worst | CPU time: overhead % median "
        "| iteration error % median | verdict |",
        "|---|---|---|---|---|---|---|---|---|---|",
    ]
    for row in record["compute"]:
        overhead, error = row["compute_overhead_pct"], row["iteration_error_pct"]
        real = statistics.median(row["real_compute_round_medians_ms"])
        emulated = statistics.median(row["emulated_compute_round_medians_ms"])
        lines.append(
            f"| {row['case']} | {overhead['n']} | {real:.2f} | {emulated:.2f} | {overhead['median']:+.2f} "
            f"| {overhead['iqr']:.2f} | {overhead['worst']:+.2f} | {row['compute_cpu_overhead_pct']['median']:+.2f} "
            f"| {error['median']:+.2f} | {row['verdict']} |"
        )
    pipeline = record["pipeline_exchange"]
    lines += [
        "",
        f"Pipeline exchange through megatron-core's communicator (send a gradient back, receive an activation), "
        f"median of {pipeline['repetitions']} rounds of {pipeline['calls_per_round']} calls (load "
        f"{pipeline['load_average_1min']:.1f}). Goal: the interceptor at most the real gloo exchange "
        f"(<= {record['goal_exchange_ratio']}x): **{verdicts['pipeline_exchange']}**.",
        "",
        "| message | interceptor, virtual neighbour us | gloo, two processes us | ratio | verdict |",
        "|---|---|---|---|---|",
    ]
    for name, ratio in pipeline["ratio"].items():
        interceptor = pipeline["sides"]["interceptor"][name]["median_us"]
        gloo = pipeline["sides"]["gloo"][name]["median_us"]
        lines.append(
            f"| {name} | {interceptor:.1f} | {gloo:.1f} | {ratio:.2f} | {pipeline['verdict'][name]} |"
        )
    lines += ["", "Host time per op (median us, issued and waited, 4-byte tensor):", ""]
    lines += ["| op | gloo, one member | prism, 7 virtual peers |", "|---|---|---|"]
    for name, row in record["per_op"].items():
        lines.append(f"| {name} | {row['gloo_one_member_us']:.1f} | {row['prism_virtual_peers_us']:.1f} |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="PP2 and DP2, two rounds, fewer calls")
    parser.add_argument("--out", default=RESULTS_DIR, help="directory for the JSON and Markdown results")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    import megatron.core  # noqa: F401  (imported once here; the forked processes inherit it)

    record = run_suite(args.quick)
    paths = write_results("overhead", record, markdown(record), args.out)
    print(markdown(record))
    print("wrote", *paths)
    return 0


if __name__ == "__main__":
    sys.exit(main())
