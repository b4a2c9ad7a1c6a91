"""Precision of the device wait-until kernel (csrc/replay/wait_kernel.cu) and of the GPU global timer.

Why: on CUDA an op with virtual peers completes when the wait kernel on its stream ends, so the
kernel's lateness, plus the gap before the next kernel on the stream starts, is added to every such
op. Each sample stamps a start, waits until start + target (half as the peers' arrival offset, half as
cost) and stamps again: error = end stamp - (start + target), what the next op on the stream sees.
Target 0 is the baseline: the launch gaps of a stamp, a wait with nothing to wait, and a stamp.
The timer's resolution is measured as the size of its ticks.

Run: ``python -m benchmarks.gpu.wait_precision --out DIR``; writes DIR/wait_precision.json and .md;
exits 1 when the goal is not met, 2 without a GPU.
"""

from __future__ import annotations

import statistics
import sys

from benchmarks.clock.run import summarize_us
from benchmarks.gpu.stage import run_stage
from prism_megatron.replay import clock

# (target ns, samples): about a second per target at most. The baseline takes few samples so that its
# launches fit the device's launch queue and run back to back.
TARGETS = ((0, 300), (10_000, 2000), (100_000, 2000), (1_000_000, 500), (10_000_000, 100))
GOAL_FROM_NS = 100_000
GOAL_MEDIAN_US = 5.0
GOAL_P99_US = 50.0


def timer_resolution() -> dict[str, object]:
    steps_ns = clock.cuda_sample_timer_steps_ns(2000)
    ticking = [s for s in steps_ns if s > 0]
    return {
        "steps_sampled": len(steps_ns),
        "stopped": len(steps_ns) - len(ticking),
        "min_step_ns": min(ticking, default=None),
        "median_step_ns": statistics.median(ticking) if ticking else None,
        "max_step_ns": max(ticking, default=None),
    }


def measure() -> dict[str, object]:
    clock.cuda_measure_wait_errors_ns(10_000, 20)  # warm-up: module load, first launches
    rows = []
    for target_ns, num_waits in TARGETS:
        stats = summarize_us(clock.cuda_measure_wait_errors_ns(target_ns, num_waits))
        rows.append({"target_us": target_ns / 1e3, **stats})
        print(
            f"wait {target_ns / 1e3:7.0f} us  median {stats['median_us']:7.2f}  p99 {stats['p99_us']:7.2f}  "
            f"mean {stats['mean_us']:7.2f}  max {stats['max_us']:8.2f} us  (n={stats['n']})",
            flush=True,
        )
    judged = [r for r in rows if r["target_us"] * 1e3 >= GOAL_FROM_NS]
    goal_met = all(r["median_us"] <= GOAL_MEDIAN_US and r["p99_us"] <= GOAL_P99_US for r in judged)
    return {"timer": timer_resolution(), "rows": rows, "goal_met": goal_met}


def markdown(result: dict[str, object]) -> str:
    timer = result["timer"]
    lines = [
        "## Device wait-until kernel",
        "",
        f"GPU global timer ticks: min {timer['min_step_ns']} ns, median {timer['median_step_ns']} ns, "
        f"max {timer['max_step_ns']} ns over {timer['steps_sampled']} ticks ({timer['stopped']} stalls).",
        "",
        "| target | median (us) | p99 (us) | mean (us) | max (us) | n |",
        "|---:|---:|---:|---:|---:|---:|",
    ]
    for r in result["rows"]:
        label = "0 (baseline)" if r["target_us"] == 0 else f"{r['target_us']:.0f} us"
        lines.append(
            f"| {label} | {r['median_us']:.2f} | {r['p99_us']:.2f} | {r['mean_us']:.2f} | "
            f"{r['max_us']:.2f} | {r['n']} |"
        )
    verdict = "met" if result["goal_met"] else "NOT met"
    lines += [
        "",
        f"Error = next kernel's stamp - (start + target). Goal as on CPU (targets >= 100 us: median <= "
        f"{GOAL_MEDIAN_US:g} us, p99 <= {GOAL_P99_US:g} us): **{verdict}**.",
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    result = run_stage("wait_precision", __doc__.splitlines()[0], measure, markdown, argv)
    if result is None:
        return 2
    print(f"timer: {result['timer']}; goal {'met' if result['goal_met'] else 'NOT met'}")
    return 0 if result["goal_met"] else 1


if __name__ == "__main__":
    sys.exit(main())
