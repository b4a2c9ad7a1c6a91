"""The GPU model at kernel level: its GEMM, attention and memory-bound times against published figures.

    python -m benchmarks.published.kernels [--out DIR]

For every figure in kernel_figures.py (OpenXLA's measured H100/B200 GEMM table, the MAMF table,
FlashAttention-2/-3's forward and backward curves) the model's throughput at the same shape, in the
source's own FLOP convention (2 m n k per GEMM; 4 b h s^2 d per attention forward, halved when
causal, x 2.5 backward), and the error. Anchors (figures the formulas were solved from) are listed
but kept out of the summary, which counts only the figures the model never saw. Attention has two
curves, each its own anchors: FlashAttention-3's and cuDNN's fused attention (what Transformer
Engine calls on Hopper, `GpuSpec.with_attention_kernel("cudnn")`). Memory-bound functions the
published runs call (Megatron's cross-entropy, unfused and fused, and SwiGLU, jit-fused and eager;
Liger-Kernel's H100 figures) are timed as a modelled run charges them: run on fake tensors under the
model's clock, op by op, or priced as the fused kernel (`fused.activation_time`), each in the
figure's own harness (the call, or the call and `y.sum().backward()`). Writes
benchmarks/results/<date>-kernels.md and .json. No GPU: arithmetic and fake tensors, seconds.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import statistics
from collections.abc import Callable
from unittest import mock

import torch
from torch._subclasses.fake_tensor import FakeTensorMode

from benchmarks import common
from benchmarks.published.kernel_figures import (
    ATTENTION_FIGURES,
    GEMM_FIGURES,
    MEMORY_FIGURES,
    MEMORY_FUNCTIONS,
    AttentionFigure,
    GemmFigure,
    MemoryFigure,
)
from prism_megatron.gpu_model import ModelledClock, ModelledTiming, attention_time, fused, gemm_time, gpu_spec

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


SEQUENCE, BATCH = 2048, 4
"""The memory figures' [sequence, batch] of tokens."""


@contextlib.contextmanager
def _tensor_parallel_of_one():
    """Megatron's cross-entropy outside a job: a tensor-parallel group of one, whose all-reduces are
    the identity (the figures ran TP 1)."""
    from megatron.core.tensor_parallel import cross_entropy

    # megatron-core 0.16 asks parallel_state for the group, rank and size; 0.17+ the group, and takes
    # rank and size from it (get_pg_rank/get_pg_size: 0 and 1 for no group)
    answers = {"get_tensor_model_parallel_group": None, "get_tensor_model_parallel_rank": 0,
               "get_tensor_model_parallel_world_size": 1}  # fmt: skip
    with contextlib.ExitStack() as stack:
        for name, answer in answers.items():
            if hasattr(cross_entropy, name):
                stack.enter_context(mock.patch.object(cross_entropy, name, lambda *a, _v=answer, **k: _v))
        stack.enter_context(mock.patch("torch.distributed.all_reduce", lambda *a, **k: None))
        yield


def _charged_op_by_op(
    gpu: str, inputs: Callable[[], tuple], call: Callable[..., torch.Tensor], mode: str
) -> float:
    """`call(*inputs())` (and, for 'full', `y.sum().backward()`) on fake tensors under the model's
    clock, in ms; the inputs are made before the clock starts, as the figures' harness made them."""
    with FakeTensorMode(), _tensor_parallel_of_one():
        args = inputs()
        clock = ModelledClock(gpu)
        with ModelledTiming(clock):
            y = call(*args)
            if mode == "full":
                y.sum().backward()
    return clock.now_ns / 1e6


def _logits(vocab: int) -> tuple[torch.Tensor, torch.Tensor]:
    logits = torch.randn(SEQUENCE, BATCH, vocab, dtype=torch.bfloat16, requires_grad=True)
    return logits, torch.randint(0, vocab, (SEQUENCE, BATCH))


def _cross_entropy(logits: torch.Tensor, target: torch.Tensor) -> torch.Tensor:
    from megatron.core.tensor_parallel.cross_entropy import vocab_parallel_cross_entropy

    return vocab_parallel_cross_entropy(logits, target)


def _fc1_output(ffn: int) -> tuple[torch.Tensor]:
    return (torch.randn(SEQUENCE, BATCH, 2 * ffn, dtype=torch.bfloat16, requires_grad=True),)


def _eager_swiglu(y: torch.Tensor) -> torch.Tensor:
    gate, up = torch.chunk(y, 2, -1)
    return torch.nn.functional.silu(gate) * up


def _fused_ms(gpu: str, price: Callable[..., int], mode: str, output_bytes: int, **shape) -> float:
    """A fused kernel as `price(spec, **shape, backward=...)` charges it: forward, and for 'full' its
    backward and the harness's `y.sum()` (one read of the output, as ops.py charges it)."""
    spec = gpu_spec(gpu)
    ns = price(spec, **shape, backward=False)
    if mode == "full":
        ns += price(spec, **shape, backward=True) + fused.memory_kernel_time(spec, output_bytes + 2)
    return ns / 1e6


@functools.cache
def _native_cross_entropy_is_one_kernel() -> bool:
    """What a modelled run makes of Megatron's native fused cross-entropy (`--cross-entropy-loss-fusion`
    with its default impl): `Fusions` decides, as it does in a run of Megatron's default flags."""
    from prism_megatron.megatron.run.modelled_fusions import Fusions

    defaults = argparse.Namespace(
        swiglu=False, bias_gelu_fusion=True, add_bias_linear=True, gradient_accumulation_fusion=True,
        bias_dropout_fusion=True, apply_rope_fusion=True, position_embedding_type="rope",
        cross_entropy_loss_fusion=True, cross_entropy_fusion_impl="native",
    )  # fmt: skip
    return Fusions.from_args(defaults).cross_entropy


def memory_row(fig: MemoryFigure) -> dict:
    tokens = SEQUENCE * BATCH
    if fig.function == "ce_native" and _native_cross_entropy_is_one_kernel():
        model = _fused_ms(fig.gpu, fused.cross_entropy_time, fig.mode, tokens * 4,
                          tokens=tokens, vocab=fig.size, dtype=torch.bfloat16)  # fmt: skip
    elif fig.function in ("ce_unfused", "ce_native"):  # the native path charged as the unfused ops run
        model = _charged_op_by_op(fig.gpu, lambda: _logits(fig.size), _cross_entropy, fig.mode)
    elif fig.function == "swiglu_torch":
        model = _charged_op_by_op(fig.gpu, lambda: _fc1_output(fig.size), _eager_swiglu, fig.mode)
    else:
        model = _fused_ms(fig.gpu, fused.activation_time, fig.mode, tokens * fig.size * 2,
                          tokens=tokens, ffn_hidden=fig.size, dtype=torch.bfloat16, gated=True)  # fmt: skip
    dimension = "V" if fig.function.startswith("ce_") else "ffn_local"
    return {
        "kind": f"memory: {MEMORY_FUNCTIONS[fig.function]}",
        "gpu": fig.gpu,
        "shape": f"{fig.mode} {dimension} {fig.size} ({SEQUENCE}x{BATCH} tokens)",
        "published_ms": round(fig.ms, 4),
        "model_ms": round(model, 4),
        "error_pct": round(100 * (model / fig.ms - 1), 1),
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
        f"Machine: {common.machine_line(env)}. The model's arithmetic, and for the memory-bound functions "
        "their ops on fake tensors under its clock (no GPU involved).",
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
        if "published_tflops" in r:
            lines.append(
                f"| {r['gpu']} | {r['kind']} | {r['shape']} | {r['published_tflops']} | {r['model_tflops']} | "
                f"{r['error_pct']:+.1f} % | {'yes' if r['anchor'] else ''} |"
            )
    lines += [
        "",
        "Memory-bound functions, timed whole (forward: the call; full: the call and `y.sum().backward()`):",
        "",
        "| GPU | function | shape | published ms | model ms | error | anchor |",
        "|---|---|---|---|---|---|---|",
    ]
    for r in rows:
        if "published_ms" in r:
            lines.append(
                f"| {r['gpu']} | {r['kind'].removeprefix('memory: ')} | {r['shape']} | {r['published_ms']} | "
                f"{r['model_ms']} | {r['error_pct']:+.1f} % | {'yes' if r['anchor'] else ''} |"
            )
    lines += ["", "Sources:", ""]
    lines += [f"- {s}" for s in sorted({r["source"] for r in rows})]
    return "\n".join(lines) + "\n"


def groups(rows: list[dict]) -> dict[str, list[dict]]:
    out: dict[str, list[dict]] = {}
    for r in rows:
        key = f"{r['gpu']} {r['kind']}"
        if r["kind"].startswith(("attention", "memory")):
            key += " " + r["shape"].split(" ", 1)[0]
        out.setdefault(key, []).append(r)
    out["all"] = list(rows)
    return out


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--out", default=common.RESULTS_DIR, help="folder for <date>-kernels.md and .json")
    args = parser.parse_args(argv)
    rows = [gemm_row(f) for f in GEMM_FIGURES] + [attention_row(f) for f in ATTENTION_FIGURES]
    rows += [memory_row(f) for f in MEMORY_FIGURES]
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
