"""The GPU model at kernel level: its GEMM and attention times against published kernel figures.

    python -m benchmarks.published.kernels [--out DIR]

For every figure in kernel_figures.py (OpenXLA's measured H100/B200 GEMM table, the MAMF table,
FlashAttention-2/-3's forward and backward curves) the model's throughput at the same shape, in the
source's own FLOP convention (2 m n k per GEMM; 4 b h s^2 d per attention forward, halved when
causal, x 2.5 backward), and the error. Anchors (figures the formulas were solved from) are listed
but kept out of the summary, which counts only the figures the model never saw. Attention has two
curves, each its own anchors: FlashAttention-3's and cuDNN's fused attention (what Transformer
Engine calls on Hopper, `GpuSpec.with_attention_kernel("cudnn")`). Writes
benchmarks/results/<date>-kernels.md and .json. Pure arithmetic: seconds, no GPU.
"""

from __future__ import annotations

import argparse
import statistics

import torch

from benchmarks import common
from benchmarks.published.kernel_figures import ATTENTION_FIGURES, GEMM_FIGURES, AttentionFigure, GemmFigure
from prism_megatron.gpu_model import attention_time, gemm_time, gpu_spec

ATTENTION_KERNEL_NAMES = {"FlashAttention-3": "flash", "cuDNN": "cudnn"}
"""A figure's kernel -> the model's name for it (`gpu_model.specs.ATTENTION_KERNELS`)."""

DTYPES = {"bf16": torch.bfloat16, "fp8": torch.float8_e4m3fn}


def gemm_row(fig: GemmFigure) -> dict:
    spec = gpu_spec(fig.gpu)
    ns = gemm_time(spec, fig.m, fig.n, fig.k, DTYPES[fig.dtype], batch=fig.batch)
    model = 2 * fig.batch * fig.m * fig.n * fig.k / ns / 1e3
    return {
        "kind": "gemm",
        "gpu": fig.gpu,
        "shape": f"{fig.batch}x{fig.m}x{fig.n}x{fig.k} {fig.dtype}",
        "published_tflops": fig.tflops,
        "model_tflops": round(model, 1),
        "error_pct": round(100 * (model / fig.tflops - 1), 1),
        "anchor": fig.anchor,
        "source": fig.source,
    }


def attention_row(fig: AttentionFigure) -> dict:
    spec = gpu_spec(fig.gpu).with_attention_kernel(ATTENTION_KERNEL_NAMES.get(fig.kernel, "flash"))
    backward = fig.direction == "bwd"
    ns = attention_time(
        spec,
        batch=fig.batch,
        num_heads=fig.heads,
        num_kv_heads=fig.heads,
        seq_q=fig.seq,
        seq_kv=fig.seq,
        head_dim=fig.head_dim,
        causal=fig.causal,
        backward=backward,
    )
    flops = 4 * fig.batch * fig.seq * fig.seq * fig.heads * fig.head_dim
    flops = flops / (2 if fig.causal else 1) * (2.5 if backward else 1)
    model = flops / ns / 1e3
    mask = "causal" if fig.causal else "non-causal"
    return {
        "kind": "attention" if fig.kernel == "FlashAttention-3" else f"attention ({fig.kernel})",
        "gpu": fig.gpu,
        "shape": f"{fig.direction} d{fig.head_dim} {mask} seq {fig.seq} (b{fig.batch} h{fig.heads})",
        "published_tflops": fig.tflops,
        "model_tflops": round(model, 1),
        "error_pct": round(100 * (model / fig.tflops - 1), 1),
        "anchor": fig.anchor,
        "source": fig.source,
    }


def summary(rows: list[dict]) -> dict:
    held_out = [abs(r["error_pct"]) for r in rows if not r["anchor"]]
    if not held_out:
        return {"held_out": 0}
    return {
        "held_out": len(held_out),
        "median_abs_error_pct": round(statistics.median(held_out), 1),
        "mean_abs_error_pct": round(statistics.fmean(held_out), 1),
        "max_abs_error_pct": round(max(held_out), 1),
        "within_10_pct": sum(e <= 10 for e in held_out),
        "within_25_pct": sum(e <= 25 for e in held_out),
    }


def markdown(rows: list[dict], summaries: dict, env: dict) -> str:
    lines = [
        f"# Kernel level: the GPU model against published kernel figures ({common.today()})",
        "",
        f"Machine: {common.machine_line(env)}. Pure arithmetic of the model (no GPU involved).",
        "",
        "Error = model / published - 1. Anchors (the figures the formulas were solved from) are marked",
        "and left out of the summaries; every other figure is held out.",
        "",
        "| group | held out | median abs error | mean | max | within 10 % | within 25 % |",
        "|---|---|---|---|---|---|---|",
    ]
    for group, s in summaries.items():
        if s["held_out"]:
            lines.append(
                f"| {group} | {s['held_out']} | {s['median_abs_error_pct']} % | {s['mean_abs_error_pct']} % | "
                f"{s['max_abs_error_pct']} % | {s['within_10_pct']} | {s['within_25_pct']} |"
            )
    lines += [
        "",
        "| GPU | kernel | shape | published TFLOP/s | model TFLOP/s | error | anchor |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        lines.append(
            f"| {r['gpu']} | {r['kind']} | {r['shape']} | {r['published_tflops']} | {r['model_tflops']} | "
            f"{r['error_pct']:+.1f} % | {'yes' if r['anchor'] else ''} |"
        )
    lines += ["", "Sources:", ""]
    lines += [f"- {s}" for s in sorted({r["source"] for r in rows})]
    return "\n".join(lines) + "\n"


def groups(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        key = f"{r['gpu']} {r['kind']}"
        if r["kind"].startswith("attention"):
            key += " " + r["shape"].split(" seq")[0].split(" ", 1)[0]
        out.setdefault(key, []).append(r)
    out["all"] = list(rows)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=common.RESULTS_DIR, help="folder for <date>-kernels.md and .json")
    args = parser.parse_args(argv)
    rows = [gemm_row(f) for f in GEMM_FIGURES] + [attention_row(f) for f in ATTENTION_FIGURES]
    summaries = {name: summary(members) for name, members in groups(rows).items()}
    env = common.environment()
    record = {"date": common.today(), "environment": env, "summaries": summaries, "rows": rows}
    paths = common.write_results("kernels", record, markdown(rows, summaries, env), out_dir=args.out)
    for name, s in summaries.items():
        if s["held_out"]:
            print(
                f"{name}: {s['held_out']} held out, median |error| {s['median_abs_error_pct']} %, max {s['max_abs_error_pct']} %"
            )
    print("wrote", *paths)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
