"""One real rank of a Llama-3-8B-shaped job at W = 8192 on one device: iteration time and peak memory.

Why: the emulation's point is to run a rank of a production job on the devices one has. This runs
`prism-megatron emulate` exactly as a user types it (capture of one rank per role, simulation of the
8192-rank job, then the emulation with one real rank) and records the real rank's median iteration
time after warm-up, its peak memory (`torch.cuda.max_memory_allocated` over the training steps) and
the simulated iteration time from the run's report.json, to hold against published numbers.

Layout: TP1 x PP4 x DP2048, no sequence parallelism (the built-in entry runs it without apex),
distributed optimizer, micro-batch 1, 2 micro-batches per step (global batch 4096). Each stage holds 8
of the 32 layers; full recompute of every layer keeps the unfused attention's (no Transformer Engine)
32 x 8192 x 8192 score matrices out of the saved activations. Stage 0 (the real rank: the embedding
and the most micro-batches in flight) holds 2.27e9 parameters: bf16 weights and gradients ~8.5 GiB,
fp32 main parameters and Adam moments of a 1/2048 shard ~13 MiB, saved layer inputs 2 x 8 x 64 MiB,
and one layer's recomputed attention (bf16 scores, fp32 softmax) ~20-28 GiB at a time: an estimated
30-40 GiB of 139 GiB.
Time estimated for an H200 (not yet measured): ~150 TFLOP per micro-batch and stage with recompute,
0.3-0.5 s; an emulated step of (2 + 4 - 1) stage slots, 2-3 s; each of the 5 launches (4 capture
passes of 2 iterations, 1 emulation of 4) 15-30 s: 100-150 s of run.sh's 180 s step.

Run: ``python -m benchmarks.gpu.emulated_llama_rank --out DIR [--device cuda|cpu] [--tiny]``; writes
DIR/emulated_llama_rank.json and .md. ``--tiny`` keeps the structure with small sizes (CPU tests).
"""

from __future__ import annotations

import argparse
import os
import sys
import time

from benchmarks.common import environment
from benchmarks.gpu.memory_ground_truth import (
    median_iteration_s,
    peak_groups,
    read_rank,
    run_emulation,
    run_on_device,
)

NAME = "emulated_llama_rank"
WORLD_SIZE = 8192
REAL_RANK = 0
"""Pipeline stage 0 of replica 0: the embedding and the most micro-batches in flight (1F1B)."""
PIPELINE_SIZE = 4
NUM_MICROBATCHES = 2
WARMUP_ITERATIONS = 1
EMULATE_TIMEOUT_S = {"cuda": 170.0, "cpu": 900.0}
"""The command's limit: inside run.sh's 180 s step on the GPU; two shared cores take minutes (a dry run)."""

LLAMA3_8B = {
    "--num-layers": "32", "--hidden-size": "4096", "--ffn-hidden-size": "14336",
    "--num-attention-heads": "32", "--num-query-groups": "8", "--seq-length": "8192",
    "--vocab-size": "128256",
}  # fmt: skip
TINY = {
    "--num-layers": "8", "--hidden-size": "64", "--ffn-hidden-size": "224", "--num-attention-heads": "4",
    "--num-query-groups": "2", "--seq-length": "64", "--vocab-size": "512",
}  # fmt: skip
"""The same structure (GQA 2:1 instead of 4:1, 2 layers per stage) at sizes one CPU runs in seconds."""
STRUCTURE = (
    "--group-query-attention", "--normalization", "RMSNorm", "--swiglu", "--disable-bias-linear",
    "--position-embedding-type", "rope", "--rotary-base", "500000", "--untie-embeddings-and-output-weights",
    "--bf16", "--hidden-dropout", "0", "--attention-dropout", "0", "--use-distributed-optimizer",
    "--recompute-granularity", "full", "--recompute-method", "uniform", "--recompute-num-layers", "1",
)  # fmt: skip


def job_flags(sizes: dict[str, str], train_iters: int) -> list[str]:
    """The Megatron flags of the target job (without --prism-*)."""
    data_parallel_size = WORLD_SIZE // PIPELINE_SIZE
    return [
        *(item for pair in sizes.items() for item in pair),
        "--max-position-embeddings", sizes["--seq-length"], *STRUCTURE,
        "--pipeline-model-parallel-size", str(PIPELINE_SIZE), "--micro-batch-size", "1",
        "--global-batch-size", str(NUM_MICROBATCHES * data_parallel_size),
        "--train-iters", str(train_iters),
    ]  # fmt: skip


def measure(options: argparse.Namespace, work_dir: str) -> dict:
    if options.train_iters <= WARMUP_ITERATIONS:
        raise ValueError(
            f"--train-iters must exceed the {WARMUP_ITERATIONS} warm-up iteration(s), got {options.train_iters}"
        )
    out_dir = os.path.join(work_dir, "run")
    flags = job_flags(TINY if options.tiny else LLAMA3_8B, options.train_iters)
    # The allocator's history names what is live at the peak, to hold against the modelled GPU's
    # (benchmarks/published/against_gpu.py); each allocation pays a Python stack walk.
    prism = [
        "--prism-emulate", "--prism-world-size", str(WORLD_SIZE), "--prism-ranks", str(REAL_RANK),
        "--prism-device", options.device, "--prism-capture-iters", "2", "--prism-memory-history",
        "--prism-out", out_dir,
    ]  # fmt: skip
    begin = time.monotonic()
    report = run_emulation([*flags, *prism], timeout_s=EMULATE_TIMEOUT_S[options.device])
    command_s = time.monotonic() - begin
    rank = read_rank(out_dir, REAL_RANK)
    reported = report["ranks"][str(REAL_RANK)]
    alone_ms, emulated_ms = compute_per_iteration_ms(out_dir, REAL_RANK, options.train_iters)
    return {
        "device": options.device,
        "tiny": options.tiny,
        "world_size": WORLD_SIZE,
        "layout": {"tp": 1, "pp": PIPELINE_SIZE, "dp": WORLD_SIZE // PIPELINE_SIZE},
        "num_microbatches": NUM_MICROBATCHES,
        "real_rank": REAL_RANK,
        "role": reported["role"],
        "job_flags": flags,
        "iteration_s": median_iteration_s(rank, WARMUP_ITERATIONS),
        "iterations_s": [it["time_s"] for it in rank["iterations"]],
        "warmup_iterations": WARMUP_ITERATIONS,
        "report_iteration_time_s": report["iteration_time_s"],
        "simulated_iteration_time_s": report["simulated_iteration_time_s"],
        "tflops_per_gpu": report["tflops_per_gpu"],
        "roles": report["roles"],
        "compute_alone_ms": alone_ms,
        "compute_emulated_ms": emulated_ms,
        "compute_error_pct": 100 * (emulated_ms - alone_ms) / alone_ms if alone_ms else None,
        "peak_bytes": rank["memory"]["peak_bytes"],
        "memory_method": rank["memory"]["method"],
        "memory_at_peak_bytes": rank["memory"]["at_peak_bytes"],
        "at_peak_allocations": peak_groups(rank["memory"]),
        "num_parameters": rank["num_parameters"],
        "command_wall_s": command_s,
        "environment": environment(),
    }


def compute_per_iteration_ms(
    out_dir: str, virtual_rank: int, train_iters: int, captured_rank: int | None = None
) -> tuple[float, float]:
    """The rank's compute per iteration (device time, median after warm-up): run alone (its role's
    capture, `captured_rank`'s, default its own: among instant virtual peers) and emulated (from the
    emulation's op log)."""
    import statistics

    alone, emulated = compute_iterations_ms(out_dir, virtual_rank, captured_rank)
    emulated = emulated[WARMUP_ITERATIONS:] or emulated
    return statistics.median(alone), statistics.median(emulated)


def compute_iterations_ms(
    out_dir: str, virtual_rank: int, captured_rank: int | None = None
) -> tuple[list[float], list[float]]:
    """The rank's compute in each iteration (ms): of its role's capture (`captured_rank`'s, default
    its own; the recorded iterations) and of the emulation (every iteration, warm-up included)."""
    from prism_megatron import files
    from prism_megatron.graph.capture import RankCapture, compute_intervals
    from prism_megatron.report.oplog import load_op_logs

    captured = virtual_rank if captured_rank is None else captured_rank
    capture = RankCapture.load(files.capture_path(os.path.join(out_dir, files.CAPTURE_DIR), captured))
    alone = [sum(b - a for a, b in compute_intervals(it)) / 1e6 for it in capture.recorded()]
    log = load_op_logs(out_dir)[virtual_rank]
    starts = [*log.iteration_starts_ns, float("inf")]
    per_iteration = [0] * len(log.iteration_starts_ns)
    for span in log.compute:
        index = next(i for i in range(len(starts) - 1) if starts[i] <= span.start_ns < starts[i + 1])
        per_iteration[index] += span.end_ns - span.start_ns
    return alone, [ns / 1e6 for ns in per_iteration]


def markdown(result: dict) -> str:
    mib = 2**20
    size = "tiny shrink" if result["tiny"] else "Llama-3-8B shape"
    at_peak = ", ".join(f"{k} {v / mib:.1f}" for k, v in result["memory_at_peak_bytes"].items())
    return "\n".join(
        [
            f"## One emulated rank of a {size}, W = {result['world_size']} ({result['device']})",
            "",
            f"TP1 x PP{result['layout']['pp']} x DP{result['layout']['dp']}, {result['num_microbatches']} "
            f"micro-batches; real rank {result['real_rank']} ({result['role']}), "
            f"{result['num_parameters']} parameters on it.",
            "",
            "| iteration (ms, median) | simulated (ms) | report (ms) | peak memory (MiB) | TFLOP/s per GPU |",
            "|---:|---:|---:|---:|---:|",
            f"| {result['iteration_s'] * 1e3:.1f} | {result['simulated_iteration_time_s'] * 1e3:.1f} | "
            f"{result['report_iteration_time_s'] * 1e3:.1f} | {result['peak_bytes'] / mib:.1f} | "
            f"{'-' if result['tflops_per_gpu'] is None else format(result['tflops_per_gpu'], '.1f')} |",
            "",
            f"Compute per iteration: {result['compute_alone_ms']:.1f} ms with the stage run alone (capture), "
            f"{result['compute_emulated_ms']:.1f} ms emulated ({result['compute_error_pct']:+.2f} %).",
            "",
            f"At the peak (MiB): {at_peak} ({result['memory_method']}). Whole command "
            f"{result['command_wall_s']:.0f} s.",
            "",
        ]
    )


def _options(parser: argparse.ArgumentParser) -> None:
    parser.add_argument("--tiny", action="store_true", help="same structure, small sizes")
    parser.add_argument("--train-iters", type=int, default=4, help="emulated iterations (1 warm-up)")


def main(argv: list[str] | None = None) -> int:
    from benchmarks.gpu.stage import printed

    try:
        result = run_on_device(NAME, __doc__.splitlines()[0], measure, markdown, argv, _options)
    except ValueError as exc:
        print(f"{NAME}: error: {exc}", file=sys.stderr)
        return 2
    return printed(result, markdown)


if __name__ == "__main__":
    sys.exit(main())
