"""What emulation costs the real rank: its compute time, and the host time of each communication op.

Why: the emulation's promise is that a real rank runs as it would in the real job. Whatever the
prism layers add to its own work (the CPU device shim is there in both runs; the backend, the replay
engine, the pipeline interceptor and the virtual world only under emulation) shows up as compute
that is slower than in the real run. Goal: at most 1 % slower.

* Compute time: the built-in GPT (`benchmarks.fidelity.cases.real_compute_cases`: PP2, DP2, TP2 of
  two ranks) run once with both ranks real processes and once with rank 1 real and rank 0 virtual
  (replayed as in the fidelity suite). Compute = time inside megatron-core's forward_step and
  backward_step, per iteration, median after warm-up; the same rank in both runs. With TP2 the
  tensor-parallel all-reduces are inside the layers, so that case's "compute" includes them (real
  gloo in one run, the replay engine in the other); PP2 and DP2 are compute alone.
* Per op: the host time of one collective, issued and waited, on a group whose other members are
  virtual (prism, instant mode, zero cost) against the same call on a one-member gloo group (torch's
  own path and a trivial backend); and the host time of one pipeline exchange through the prism
  interceptor with a virtual neighbour (instant) against the measured cost of a real gloo exchange.
  benchmarks/backend measures the backend's per-op overhead in more detail.

Run: ``python -m benchmarks.overhead.run [--quick] [--out DIR]``. Writes
``<DIR>/<YYYY-MM-DD>-overhead.json`` and ``.md`` (DIR defaults to benchmarks/results/).
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


def exchange_overhead(case) -> float:
    """Median host time (us) of one pipeline exchange through the interceptor, virtual peers instant."""
    from benchmarks.fidelity import workload
    from benchmarks.fidelity.processes import run_processes

    request = workload.Request(
        job=case.job, mode="capture", iterations=4, real_ranks=case.real_ranks, memory_iterations=0
    )
    (recorded,) = run_processes(workload.run, [request], connected=False)
    windows = [(b - a) / 1e3 for a, b in recorded["exchanges_ns"]]
    return statistics.median(windows)


def run_suite(quick: bool) -> dict:
    from benchmarks.fidelity.calibrate import calibrate
    from benchmarks.fidelity.cases import real_compute_cases
    from benchmarks.fidelity.compare import run_case
    from benchmarks.fidelity.processes import run_processes

    cases = real_compute_cases()[:2] if quick else real_compute_cases()
    cost = calibrate([2], repetitions=10 if quick else 30)
    compute = []
    for case in cases:
        print(f"overhead: {case.name} ...", file=sys.stderr, flush=True)
        record = run_case(case, cost)
        (rank,) = record["ranks"]
        compute.append(
            {
                "case": case.name,
                "virtual_rank": rank["virtual_rank"],
                "real_compute_median_ms": rank["real_compute_median_ms"],
                "emulated_compute_median_ms": rank["emulated_compute_median_ms"],
                "compute_overhead_pct": rank["compute_overhead_pct"],
                "iteration_error_pct": rank["error_pct"],
                "load_average_1min": record["load_average_1min"],
            }
        )
    (per_op,) = run_processes(per_op_overhead, [200 if quick else PER_OP_CALLS], connected=False)
    pp2 = next(c for c in cases if c.name == "real-pp2")
    exchange = {
        "prism_interceptor_virtual_peer_us": exchange_overhead(pp2),
        "gloo_real_exchange_cost_us": cost.as_dict()["SEND/n=2"],
    }
    return {
        "suite": "overhead",
        "date": today(),
        "environment": environment(),
        "goal_compute_overhead_pct": GOAL_COMPUTE_PCT,
        "compute": compute,
        "per_op": per_op,
        "pipeline_exchange": exchange,
    }


def markdown(record: dict) -> str:
    env = record["environment"]
    lines = [
        f"# Overhead of emulation on the real rank ({record['date']})",
        "",
        machine_line(env, EVERY_PACKAGE) + ".",
        "",
        "Compute time of rank 1 (inside forward_step and backward_step, median per iteration), both ranks "
        f"real against rank 0 virtual. Goal: at most {record['goal_compute_overhead_pct']} % slower.",
        "",
        "| case | real ms | emulated ms | overhead % | iteration error % |",
        "|---|---|---|---|---|",
    ]
    for row in record["compute"]:
        lines.append(
            f"| {row['case']} | {row['real_compute_median_ms']:.2f} | {row['emulated_compute_median_ms']:.2f} "
            f"| {row['compute_overhead_pct']:+.2f} | {row['iteration_error_pct']:+.2f} |"
        )
    lines += ["", "Host time per op (median us, issued and waited, 4-byte tensor):", ""]
    lines += ["| op | gloo, one member | prism, 7 virtual peers |", "|---|---|---|"]
    for name, row in record["per_op"].items():
        lines.append(f"| {name} | {row['gloo_one_member_us']:.1f} | {row['prism_virtual_peers_us']:.1f} |")
    exchange = record["pipeline_exchange"]
    lines += [
        "",
        f"Pipeline exchange through the interceptor with a virtual neighbour (instant): "
        f"{exchange['prism_interceptor_virtual_peer_us']:.1f} us median; a real gloo exchange on loopback "
        f"costs {exchange['gloo_real_exchange_cost_us']} us by message bytes.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="PP2 and DP2 only, fewer calls")
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
