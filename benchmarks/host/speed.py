"""How steady this machine's cores are: the same work, timed over and over on every core at once.

A measurement that runs real compute on the host (the demo, the fidelity suite's real-compute cases)
assumes a core does the same work in the same time from one iteration to the next. On a shared
virtual machine it need not: another tenant on the same physical core can slow a core down for
seconds, and the load average does not show it (the time is lost inside the guest's own running
processes). This probe pins one process to each core, runs a fixed unit of work (small matrix
products and an activation through torch, the kind of host work a small real rank does) back to
back, and reports per core how long a unit takes and, in windows of `window_s`, each window's
median against the core's fast state (the lowest decile of the windows' medians: a core can be slow
for the whole probe, so its own median is no reference): the share of windows at least `SLOW_RATIO`
times slower, and the longest such phase. The median unit itself compares one probe with another.

Run: ``python -m benchmarks.host.speed [--seconds S] [--window S] [--out DIR]`` (writes
``<DIR>/<YYYY-MM-DD>-host-speed.json`` and ``.md``), or call `probe` before a measurement and keep
its summary beside the measurement (`benchmarks/demo/run.py` does).
"""

from __future__ import annotations

import argparse
import multiprocessing
import os
import statistics
import sys
import time

from benchmarks.common import RESULTS_DIR, environment, machine_line, today, write_results
from benchmarks.fidelity.processes import run_processes

SLOW_RATIO = 1.2
"""A window this many times slower than the core's fast state counts as a slow phase."""
UNIT_REPEATS = 300
"""Products per unit of work (about 10 ms on a 2026 server core)."""


def _unit(x, w) -> float:
    import torch

    began = time.perf_counter()
    for _ in range(UNIT_REPEATS):
        torch.nn.functional.gelu(x @ w).sum()
    return time.perf_counter() - began


def _time_core(request: tuple[int, float]) -> list[tuple[float, float]]:
    """Pinned to `core`, time units of work back to back for `seconds`: (monotonic start, seconds)."""
    import torch

    core, seconds = request
    torch.set_num_threads(1)
    os.sched_setaffinity(0, {core})
    x, w = torch.randn(64, 64), torch.randn(64, 256)
    samples = []
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        samples.append((time.monotonic(), _unit(x, w)))
    return samples


def available() -> str | None:
    """None where the probe can run, else why not (it pins a forked process to each core)."""
    if not hasattr(os, "sched_getaffinity") or "fork" not in multiprocessing.get_all_start_methods():
        return "the probe pins a forked process to each core, which this platform does not offer"
    return None


def probe(seconds: float, window_s: float = 0.5) -> dict:
    """Time the unit of work on every core this process may use, all at once, for `seconds`; per
    core, the summary (`summarize`).

    Raises:
        ValueError: a duration that is not positive.
        RuntimeError: the platform cannot pin processes (`available`), or a worker failed.
    """
    if seconds <= 0 or window_s <= 0:
        raise ValueError(f"seconds and window_s must be > 0, got {seconds} and {window_s}")
    if (why := available()) is not None:
        raise RuntimeError(why)
    cores = sorted(os.sched_getaffinity(0))
    try:
        per_core = run_processes(
            _time_core, [(core, seconds) for core in cores], connected=False, timeout_s=seconds + 120
        )
    except RuntimeError as exc:
        raise RuntimeError(f"host-speed probe: {exc}") from None
    by_core = dict(zip(cores, per_core, strict=True))
    return {
        "seconds": seconds,
        "window_s": window_s,
        "slow_ratio": SLOW_RATIO,
        "cores": {str(core): summarize(by_core[core], window_s) for core in cores},
    }


def summarize(samples: list[tuple[float, float]], window_s: float) -> dict:
    """One core's units, `(monotonic start, seconds)`: the median unit, the fast state's unit (the
    lowest decile of the windows' medians), each window's median over it, the share of slow windows
    and the longest run of them."""
    if not samples:
        raise ValueError("no unit of work finished: give the probe more seconds")
    first = samples[0][0]
    windows: dict[int, list[float]] = {}
    for at, took in samples:
        windows.setdefault(int((at - first) // window_s), []).append(took)
    last = max(windows)
    if last > 0 and (samples[-1][0] + samples[-1][1] - first) < (last + 0.5) * window_s:
        del windows[last]  # the probe ended early in it: too little of a window to judge
    # A window in which no unit started lies inside one unit longer than the window: as slow as that unit.
    medians, previous = [], None
    for index in range(max(windows) + 1):
        if index in windows:
            medians.append(statistics.median(windows[index]))
            previous = windows[index][-1]
        else:
            medians.append(previous)
    fast_s = statistics.quantiles(medians, n=10)[0] if len(medians) >= 10 else min(medians)
    ratios = [m / fast_s for m in medians]
    longest = run = 0
    for ratio in ratios:
        run = run + 1 if ratio >= SLOW_RATIO else 0
        longest = max(longest, run)
    return {
        "units": len(samples),
        "median_unit_ms": statistics.median(s for _, s in samples) * 1e3,
        "fast_unit_ms": fast_s * 1e3,
        "window_ratios": [round(r, 3) for r in ratios],
        "slow_share": sum(r >= SLOW_RATIO for r in ratios) / len(ratios),
        "longest_slow_s": longest * window_s,
        "max_ratio": max(ratios),
    }


def describe(result: dict) -> str:
    """'core 0: unit 11.2 ms, 12 % of 0.5 s windows >= 1.2x its fast state (longest 3.0 s, worst
    1.52x); core 1: ...'."""
    parts = []
    for core, c in result["cores"].items():
        parts.append(
            f"core {core}: unit {c['median_unit_ms']:.1f} ms, {100 * c['slow_share']:.0f} % of "
            f"{result['window_s']:g} s windows >= {result['slow_ratio']:g}x its fast state "
            f"(longest {c['longest_slow_s']:.1f} s, worst {c['max_ratio']:.2f}x)"
        )
    return "; ".join(parts)


def markdown(record: dict) -> str:
    result = record["probe"]
    lines = [
        f"# Host speed: the same work on every core at once ({record['date']})",
        "",
        machine_line(record["environment"]) + ".",
        f"`python -m benchmarks.host.speed --seconds {result['seconds']:g} --window {result['window_s']:g}`: "
        f"{UNIT_REPEATS} products of 64x64 by 64x256 with a GELU per unit, one process pinned to each core. "
        f"A window is slow at >= {result['slow_ratio']:g}x its core's fast state (the lowest decile of its "
        "windows' medians).",
        "",
        "| core | units | median unit ms | fast state ms | slow windows | longest slow phase s | worst window |",
        "|---:|---:|---:|---:|---:|---:|---:|",
    ]
    for core, c in result["cores"].items():
        lines.append(
            f"| {core} | {c['units']} | {c['median_unit_ms']:.2f} | {c['fast_unit_ms']:.2f} | "
            f"{100 * c['slow_share']:.0f} % | "
            f"{c['longest_slow_s']:.1f} | {c['max_ratio']:.2f}x |"
        )
    lines += ["", "Each window's median unit over its core's fast state, in order:", ""]
    for core, c in result["cores"].items():
        lines.append(f"- core {core}: " + " ".join(f"{r:.2f}" for r in c["window_ratios"]))
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--seconds", type=float, default=60.0, help="how long to time (default 60)")
    parser.add_argument("--window", type=float, default=2.0, help="window of the phases, seconds (default 2)")
    parser.add_argument("--out", default=RESULTS_DIR)
    args = parser.parse_args(argv)
    record = {"suite": "host-speed", "date": today(), "environment": environment()}
    record["probe"] = probe(args.seconds, args.window)
    print(describe(record["probe"]), file=sys.stderr)
    for path in write_results("host-speed", record, markdown(record), args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
