"""How long host work takes when k processes of this machine start it at the same moment.

Between two compute sleeps every process of a sleep-compute case runs some host work (megatron-core's
schedule, the step's Python, the p2p call: about 0.6 ms a step on this machine, the captured spans'
`overhead_ns`). The capture measures it with the core to itself. In the ground truth, stages that
step in lockstep (every stage of an interleaved pipeline whose micro-batches all warm up, every
data-parallel replica of a stage) wake together, and 16 processes share two cores: each waits for a
core before its host work runs, which no capture and no communication cost sees. This measures that
wait with no program of the suite: k processes (1, 2, 4, ... up to `--max`) wait for common
instants as the sleep model's compute waits (the replay clock's wait: lowered timer slack, a sleep
and a spin over its last 100 us) and each then runs a burst of Python work that takes `--burst-ms`
alone; per k, the mean and the largest time from the instant to the end of a burst, over `--rounds`
instants. The cores are those the process may run on (`os.sched_getaffinity`; a cgroup CPU quota
below them is not seen).

The mean, set against the one-process row (a burst right after a sleep, woken, as every step's host
work is), is what a step costs a rank when k ranks step together; a queue that serves the bursts
one at a time to completion on C cores predicts (k / C + 1) / 2 times that row, printed beside it.
What this costs a suite whose ranks step together, against a simulation that does not know it:
`benchmarks/results/*-mechanism-diagnose.md`.

    python -m benchmarks.fidelity.host_bursts [--burst-ms 0.6] [--max 16] [--rounds 40] [--out DIR]
"""

from __future__ import annotations

import argparse
import os
import statistics
import sys
import time

from benchmarks.common import RESULTS_DIR, environment, machine_line, today, write_results

GAP_S = 0.06
"""Seconds between two common instants: every burst has ended long before the next one."""
LEAD_ROUNDS = 3
"""Instants left out of every process's numbers (the processes start and settle)."""


def _work(count: int) -> int:
    total = 0
    for i in range(count):
        total += i * i
    return total


def burst_count(burst_ms: float) -> int:
    """Loop iterations of `_work` that take `burst_ms` alone on this process's core."""
    count = 20_000
    while True:
        begin = time.perf_counter()
        _work(count)
        took_ms = (time.perf_counter() - begin) * 1e3
        if took_ms > 5.0:
            return max(1, round(count * burst_ms / took_ms))
        count *= 2


def burst_alone_ms(count: int, repeats: int = 21) -> float:
    """The burst's median time on this process's core, alone and warm."""
    times = []
    for _ in range(repeats):
        begin = time.perf_counter()
        _work(count)
        times.append((time.perf_counter() - begin) * 1e3)
    return statistics.median(times)


def _bursts(request: tuple[int, list[int]]) -> list[tuple[float, float]]:
    """Wait for each instant as the sleep model's compute waits, run the burst; (ms from the instant
    to the burst's end, to its start) per instant. `request`: (loop count, instants in ns)."""
    from prism_megatron.replay import clock

    count, instants_ns = request
    clock.lower_timer_slack()
    out = []
    for instant in instants_ns:
        clock.wait_until_ns(instant)
        woke = clock.now_ns()
        _work(count)
        out.append(((clock.now_ns() - instant) / 1e6, (woke - instant) / 1e6))
    return out


def measure(k: int, count: int, rounds: int) -> dict:
    """k processes, `rounds` common instants: mean and largest completion, mean wake-up delay (ms).

    Raises:
        RuntimeError: a process failed or reported nothing in time (`processes.run_processes`)."""
    from benchmarks.fidelity.processes import run_processes
    from prism_megatron.replay import clock  # noqa: F401  (imported here, not in each child after its fork)

    first = time.monotonic_ns() + 500_000_000
    instants = [first + round(GAP_S * 1e9) * r for r in range(rounds + LEAD_ROUNDS)]
    per_process = run_processes(
        _bursts, [(count, instants)] * k, connected=False, timeout_s=60 + GAP_S * len(instants)
    )
    kept = [samples[LEAD_ROUNDS:] for samples in per_process]
    completions = [done for samples in kept for done, _ in samples]
    return {
        "processes": k,
        "mean_completion_ms": statistics.fmean(completions),
        "mean_largest_completion_ms": statistics.fmean(
            max(samples[r][0] for samples in kept) for r in range(rounds)
        ),
        "mean_wake_ms": statistics.fmean(woke for samples in kept for _, woke in samples),
    }


def run(burst_ms: float, max_processes: int, rounds: int) -> dict:
    count = burst_count(burst_ms)
    alone_ms = burst_alone_ms(count)
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else os.cpu_count() or 1
    rows = []
    k = 1
    while k <= max_processes:
        row = measure(k, count, rounds)
        one = rows[0]["mean_completion_ms"] if rows else row["mean_completion_ms"]
        row["fifo_prediction_ms"] = one * max(1.0, (k / cores + 1.0) / 2.0)
        rows.append(row)
        k *= 2
    return {
        "suite": "host-bursts",
        "date": today(),
        "environment": environment(),
        "cores": cores,
        "burst_ms_asked": burst_ms,
        "burst_alone_ms": alone_ms,
        "rounds": rounds,
        "rows": rows,
    }


def markdown(record: dict) -> str:
    alone = record["burst_alone_ms"]
    lines = [
        f"# Host work of k processes started together, {record['date']}",
        "",
        machine_line(record["environment"]),
        "",
        f"A burst of Python work takes {alone:.3f} ms alone; {record['rounds']} common instants per row, "
        f"{record['cores']} cores. Completion: from the instant to the burst's end; the FIFO column "
        "serves the bursts one at a time, each as long as the one-process row's.",
        "",
        "| processes | mean completion ms | x one process | FIFO on the cores predicts ms | mean largest ms | mean wake-up ms |",
        "|---|---|---|---|---|---|",
    ]
    one = record["rows"][0]["mean_completion_ms"]
    for row in record["rows"]:
        lines.append(
            f"| {row['processes']} | {row['mean_completion_ms']:.3f} | {row['mean_completion_ms'] / one:.2f} | "
            f"{row['fifo_prediction_ms']:.3f} | {row['mean_largest_completion_ms']:.3f} | {row['mean_wake_ms']:.3f} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument(
        "--burst-ms", type=float, default=0.6, help="host work per process and instant, alone (ms)"
    )
    parser.add_argument(
        "--max", type=int, default=16, help="largest number of processes (powers of two up to it)"
    )
    parser.add_argument("--rounds", type=int, default=40, help="common instants per number of processes")
    parser.add_argument("--out", default=RESULTS_DIR, help="directory for the JSON and Markdown results")
    args = parser.parse_args(argv)
    if not 0.01 <= args.burst_ms <= 50.0:
        parser.error(f"--burst-ms must be from 0.01 to 50 ms, got {args.burst_ms}")
    if not 1 <= args.max <= 256:
        parser.error(f"--max must be from 1 to 256 processes, got {args.max}")
    if args.rounds < 1:
        parser.error(f"--rounds must be at least 1, got {args.rounds}")
    record = run(args.burst_ms, args.max, args.rounds)
    text = markdown(record)
    print(text)
    print("wrote", *write_results("host-bursts", record, text, args.out))
    return 0


if __name__ == "__main__":
    sys.exit(main())
