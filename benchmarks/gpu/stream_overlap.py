"""Does compute on another stream run while the wait-until kernel waits, as it would under NCCL?

The replay engine's device wait occupies one thread of one SM on the communication stream; a
collective that waits must not stall compute on other streams. With a wait as long as a block of
matrix products, running both should take about as long as the longer one (overlapped), not their
sum (serialised). Measured both ways round: wait enqueued first, and compute enqueued first (then
the wait's stamp and kernel need an SM slot among the products' blocks). Also reported: how much the
resident wait slows the products (timed with CUDA events on the compute stream).

Run: ``python -m benchmarks.gpu.stream_overlap --out DIR``; writes DIR/stream_overlap.json and .md.
"""

from __future__ import annotations

import json
import statistics
import sys
import time

import torch

from benchmarks.gpu.stage import run_stage
from prism_megatron.replay import clock

MATRIX_N = 8192
PRODUCTS = 20
REPEATS = 5
OVERLAPPED_BELOW = 1.2  # both / max(alone): ~1.0 overlapped, ~2.0 serialised


class Workload:
    """A block of bf16 matrix products on one stream and a wait kernel on another."""

    def __init__(self) -> None:
        self.compute_stream = torch.cuda.Stream()
        self.comm_stream = torch.cuda.Stream()
        self.a = torch.randn(MATRIX_N, MATRIX_N, device="cuda", dtype=torch.bfloat16)
        self.start = torch.zeros(1, dtype=torch.int64, device="cuda")
        self.wait_ns = 0
        self.compute_events: list[tuple[torch.cuda.Event, torch.cuda.Event]] = []

    def compute(self) -> None:
        begin, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        with torch.cuda.stream(self.compute_stream):
            begin.record()
            x = self.a
            for _ in range(PRODUCTS):
                x = (x @ self.a).clamp_(-1, 1)
            end.record()
        self.compute_events.append((begin, end))

    def wait(self) -> None:
        with torch.cuda.stream(self.comm_stream):
            clock.cuda_stamp(self.start)
            clock.cuda_wait_until(self.start, self.wait_ns, 0)

    def wall_ms(self, *parts) -> float:
        """Median host wall time (ms) over REPEATS of enqueueing the parts and synchronising."""
        times_ms = []
        for _ in range(REPEATS):
            torch.cuda.synchronize()
            start_ns = time.monotonic_ns()
            for part in parts:
                part()
            torch.cuda.synchronize()
            times_ms.append((time.monotonic_ns() - start_ns) / 1e6)
        return statistics.median(times_ms)

    def compute_event_ms(self) -> float:
        """Median compute-stream time (ms) of the compute blocks recorded since the last call."""
        times_ms = [begin.elapsed_time(end) for begin, end in self.compute_events]
        self.compute_events.clear()
        return statistics.median(times_ms)


def measure() -> dict[str, object]:
    load = Workload()
    load.wall_ms(load.compute)  # warm-up: cuBLAS handles, kernels, clocks up
    load.compute_events.clear()
    compute_ms = load.wall_ms(load.compute)
    compute_alone_event_ms = load.compute_event_ms()
    load.wait_ns = round(compute_ms * 1e6)
    wait_ms = load.wall_ms(load.wait)
    wait_first_ms = load.wall_ms(load.wait, load.compute)
    wait_first_compute_ms = load.compute_event_ms()
    compute_first_ms = load.wall_ms(load.compute, load.wait)
    compute_first_compute_ms = load.compute_event_ms()
    longer_ms = max(compute_ms, wait_ms)
    result = {
        "matrix_n": MATRIX_N,
        "products": PRODUCTS,
        "repeats": REPEATS,
        "compute_alone_ms": compute_ms,
        "wait_alone_ms": wait_ms,
        "wait_first_both_ms": wait_first_ms,
        "compute_first_both_ms": compute_first_ms,
        "wait_first_ratio_to_longer": wait_first_ms / longer_ms,
        "compute_first_ratio_to_longer": compute_first_ms / longer_ms,
        "ratio_if_serialised": (compute_ms + wait_ms) / longer_ms,
        "compute_slowdown_wait_first": wait_first_compute_ms / compute_alone_event_ms - 1,
        "compute_slowdown_compute_first": compute_first_compute_ms / compute_alone_event_ms - 1,
    }
    result["overlapped"] = max(
        result["wait_first_ratio_to_longer"], result["compute_first_ratio_to_longer"]
    ) < (OVERLAPPED_BELOW)
    return result


def markdown(r: dict[str, object]) -> str:
    verdict = "overlapped" if r["overlapped"] else "NOT overlapped"
    return "\n".join(
        [
            "## Stream overlap of the wait kernel",
            "",
            f"{r['products']} bf16 products of {r['matrix_n']}x{r['matrix_n']} on one stream, a wait of the "
            f"same length on another; medians of {r['repeats']} (host wall time).",
            "",
            "| run | ms | / longer alone | compute slowdown |",
            "|---|---:|---:|---:|",
            f"| compute alone | {r['compute_alone_ms']:.2f} | | |",
            f"| wait alone | {r['wait_alone_ms']:.2f} | | |",
            f"| wait enqueued first, then compute | {r['wait_first_both_ms']:.2f} | "
            f"{r['wait_first_ratio_to_longer']:.3f} | {100 * r['compute_slowdown_wait_first']:.2f} % |",
            f"| compute enqueued first, then wait | {r['compute_first_both_ms']:.2f} | "
            f"{r['compute_first_ratio_to_longer']:.3f} | {100 * r['compute_slowdown_compute_first']:.2f} % |",
            "",
            f"Serialised would be {r['ratio_if_serialised']:.2f}x the longer; verdict (< {OVERLAPPED_BELOW}x both "
            f"ways): **{verdict}**.",
            "",
        ]
    )


def main(argv: list[str] | None = None) -> int:
    result = run_stage("stream_overlap", __doc__.splitlines()[0], measure, markdown, argv)
    if result is None:
        return 2
    print(json.dumps(result, indent=2))
    return 0 if result["overlapped"] else 1


if __name__ == "__main__":
    sys.exit(main())
