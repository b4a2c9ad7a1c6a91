"""The built-in GPT captured on the GPU: its compute spans against a torch.profiler trace of the same iteration.

Why: on CUDA the host runs ahead of the device, so a capture that read the host clock would record
launch gaps as compute. The capture reads the device timeline instead: each time it keeps (the
iteration's start and end, each op's issue and where the program waited on it, each pipeline call's
span) is a stamp kernel on the compute stream writing the GPU global timer. This stage captures one
real rank of a GPT job (PP2 x DP4 at W = 8, every other rank virtual) and profiles its last iteration
with torch.profiler (CUPTI's clock, independent of the global timer): each compute span the capture
recorded, between two ops on the compute stream, must be within 2 % of the device-time gap between the
same two ops' marks in the trace. Spans under 50 us (an op straight after another) are not judged.

Run: ``python -m benchmarks.gpu.gpt_capture_profile --out DIR``; writes DIR/gpt_capture_profile.json
and .md. Needs a GPU, a CUDA build and megatron-core.
"""

from __future__ import annotations

import collections
import json
import os
import sys
import tempfile

import torch

from benchmarks.gpu.stage import run_stage

NAME = "gpt_capture_profile"
TOLERANCE = 0.02
JUDGED_FROM_NS = 50_000
ITERATIONS = 3
GPT_FLAGS = (
    "--num-layers", "4", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "1024",
    "--vocab-size", "32000", "--micro-batch-size", "2", "--global-batch-size", "32", "--bf16",
    "--hidden-dropout", "0", "--attention-dropout", "0", "--train-iters", "1",
)  # fmt: skip
"""PP2 x DP4: 4 micro-batches per step on the real rank, forward and backward of ~ms each on an H200."""
REAL_RANK = 0


def _request(job, device: str):
    """One real rank among instant virtual peers (no graph: the pass records nothing itself; this
    stage marks and records the iterations)."""
    from benchmarks.fidelity import workload

    argv = ("builtin", "--prism-emulate", "--prism-world-size", str(job.world_size), "--prism-ranks", str(REAL_RANK),
            "--prism-device", device)  # fmt: skip
    return workload.Request(job=job, mode="capture", argv=argv, iterations=ITERATIONS, device=device)


def _captured_iteration(profile_path: str | None):
    """Run ITERATIONS iterations of the real rank; the last under the profiler. Returns the last
    iteration (device times) and its compute-stream marks in issue order."""
    import prism_megatron.replay as replay
    from benchmarks.fidelity import programs, workload
    from prism_megatron.graph.capture import CapturedIteration
    from prism_megatron.replay import timeline

    job = workload.Job(tp=1, pp=2, dp=4, gpt_flags=GPT_FLAGS)
    rt = workload._bring_up(_request(job, "cuda"))
    program = programs.build(job, REAL_RANK, device="cuda")
    windows = workload._Windows()
    workload._record_exchanges(rt.p2p_class, windows)
    iteration = None
    for number in range(ITERATIONS):
        profiling = number == ITERATIONS - 1
        profiler = (
            torch.profiler.profile(activities=[torch.profiler.ProfilerActivity.CUDA]) if profiling else None
        )
        if profiler:
            profiler.__enter__()
        calls_before = len(windows.marks)
        replay.start_recording()
        start = replay.mark_iteration_start()
        program.step()
        end = timeline.mark()
        events = replay.stop_recording()
        if profiler:
            torch.cuda.synchronize()
            profiler.__exit__(None, None, None)
            profiler.export_chrome_trace(profile_path)
        start_ns, end_ns = timeline.resolve([start, end])
        calls = windows.ns()[calls_before:]
        iteration = CapturedIteration(start_ns, end_ns, tuple(events), tuple(calls))
    rt.close()
    return iteration


def compute_stream_times(iteration) -> list[int]:
    """Every time the capture took from a mark on the compute stream, in order: the start, each
    op's issue and completion (where the program waited), each pipeline call's span, the end.
    (Ops' arrivals are written by wait kernels on other streams: not among them.)"""
    times = {iteration.start_ns, iteration.end_ns}
    for e in iteration.events:
        times.add(e.issue_ns)
        if e.complete_ns >= 0:
            times.add(e.complete_ns)
    for enter, exit_ in iteration.p2p_calls:
        times.update((enter, exit_))
    return sorted(times)


def stamp_kernels_by_stream(trace_path: str) -> dict[int, list[float]]:
    """Start times (us, CUPTI's clock) of the stamp kernels in the trace, per CUDA stream."""
    with open(trace_path) as f:
        trace = json.load(f)
    by_stream: dict[int, list[float]] = collections.defaultdict(list)
    for event in trace.get("traceEvents", []):
        if event.get("cat") == "kernel" and "stamp_kernel" in event.get("name", ""):
            by_stream[int(event.get("args", {}).get("stream", -1))].append(float(event["ts"]))
    return {stream: sorted(starts) for stream, starts in by_stream.items()}


OFFSET_WINDOW_NS = 2_000
"""Differences (kernel start - mark) within this count as one clock offset: a stamp reads the timer at
its own start, so a mark and its own kernel differ by the offset plus well under a microsecond."""


def clock_offset_ns(times: list[int], starts_us: list[float]) -> float | None:
    """The offset from the device timer to the trace's clock: the value that the most (mark, kernel)
    differences agree on within OFFSET_WINDOW_NS (each true pair gives it; unrelated pairs scatter)."""
    differences = sorted(ts * 1e3 - t for t in times for ts in starts_us)
    best, best_count, low = None, 0, 0
    for high, value in enumerate(differences):
        while value - differences[low] > OFFSET_WINDOW_NS:
            low += 1
        if high - low + 1 > best_count:
            best_count, best = high - low + 1, (differences[low] + value) / 2
    return best


def pair_marks(times: list[int], starts_us: list[float]) -> dict[int, float]:
    """Each mark's own stamp kernel (start, us), by identity rather than by position: on the trace's
    clock (less the offset), the mark and the kernel are each other's nearest. A stamp kernel of a mark
    the capture does not keep, or a missing one, leaves the other pairs as they are, where pairing by
    sorted position would shift every span after it; a span that really differs still pairs."""
    offset = clock_offset_ns(times, starts_us)
    if offset is None:
        return {}
    on_device = [ts * 1e3 - offset for ts in starts_us]
    paired = {}
    for t in times:
        j = min(range(len(on_device)), key=lambda k: abs(on_device[k] - t))
        if min(times, key=lambda other: abs(on_device[j] - other)) == t:
            paired[t] = starts_us[j]
    return paired


def compare(iteration, stamps: dict[int, list[float]]) -> dict:
    """Each captured compute span against the same marks' gap in the trace."""
    from prism_megatron.graph.capture import compute_intervals

    times = compute_stream_times(iteration)
    pairings = {stream: pair_marks(times, starts) for stream, starts in stamps.items()}
    stream = max(pairings, key=lambda s: len(pairings[s]), default=None)
    if stream is None or len(pairings[stream]) < len(times) / 2:
        found = {s: len(p) for s, p in pairings.items()}
        return {"error": f"no stream has stamp kernels for half of the {len(times)} marks (paired: {found})"}
    at = pairings[stream]
    spans, unpaired = [], 0
    for a, b in compute_intervals(iteration):
        captured_ns = b - a
        judged = captured_ns >= JUDGED_FROM_NS
        if a not in at or b not in at:
            unpaired += judged
            continue
        profiled_ns = (at[b] - at[a]) * 1e3
        error = abs(captured_ns - profiled_ns) / profiled_ns if profiled_ns > 0 else float("inf")
        spans.append({"captured_us": captured_ns / 1e3, "profiled_us": profiled_ns / 1e3,
                      "error_pct": 100 * error if judged else 0.0, "judged": judged,
                      "within": (not judged) or error <= TOLERANCE})  # fmt: skip
    return {"stream": stream, "num_marks": len(times), "num_stamps": len(stamps[stream]),
            "num_paired": len(at), "unpaired_spans": unpaired, "spans": spans}  # fmt: skip


def measure() -> dict:
    with tempfile.TemporaryDirectory(prefix="prism-profile-") as scratch:
        trace_path = os.path.join(scratch, "trace.json")
        iteration = _captured_iteration(trace_path)
        result = compare(iteration, stamp_kernels_by_stream(trace_path))
    result["iteration_ms"] = (iteration.end_ns - iteration.start_ns) / 1e6
    result["num_ops"] = len(iteration.events)
    judged = [s for s in result.get("spans", []) if s["judged"]]
    result["spans"] = judged
    result["ok"] = bool(judged) and all(s["within"] for s in judged) and not result.get("unpaired_spans")
    return result


def markdown(result: dict) -> str:
    lines = ["## The built-in GPT captured on the GPU against torch.profiler", ""]
    if "error" in result:
        return "\n".join([*lines, f"Not compared: {result['error']}", ""])
    spans = result["spans"]
    worst = max((s["error_pct"] for s in spans), default=0.0)
    lines += [
        f"One iteration of {result['iteration_ms']:.1f} ms, {result['num_ops']} ops; {len(spans)} compute spans "
        f">= {JUDGED_FROM_NS / 1e3:.0f} us, worst {worst:.2f} % from the trace (bound {100 * TOLERANCE:g} %): "
        f"**{'met' if result['ok'] else 'NOT met'}**.",
        "",
        "| captured (us) | profiler (us) | error (%) |",
        "|---:|---:|---:|",
        *(f"| {s['captured_us']:.1f} | {s['profiled_us']:.1f} | {s['error_pct']:.2f} |" for s in spans[:40]),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    result = run_stage(NAME, __doc__.splitlines()[0], measure, markdown, argv)
    if result is None:
        return 2
    print(markdown(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
