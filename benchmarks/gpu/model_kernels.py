"""The GPU model's kernel times against the same kernels measured on the lent H200.

Why: a modelled run (`--prism-device model:h200`) charges every GEMM, attention call and
memory-bound kernel with prism_megatron.gpu_model's time for it; the model was built from published
H100 kernel figures (benchmarks/published/kernels.py) and never met a real GPU. Here the kernels of
the shipped configurations' layers run on the GPU at their full size, and each measured time is set
beside the model's for the H200: the forward, data-gradient and weight-gradient GEMMs of every
linear layer of a layer and of the output layer (cuBLAS through torch, as Transformer Engine's GEMMs
are cuBLAS too), causal attention forward and backward through torch's cuDNN backend (the kernel
Transformer Engine calls on Hopper) and, apart, its FlashAttention-2 backend, and device copies of a
range of sizes (the memory-bound kernels' bandwidth and the launch floor). Nothing is fitted to these
numbers: they are a test of the model, quoted in the results beside the published-run suite.

Timing: bf16 random data, CUDA events around a run of back-to-back calls (at least ~2 ms of work),
3 warm-up calls, the median of 5 such runs, divided by the calls in a run.

The GPU's own rate at the MAMF's shape (the model's GEMM anchor) is measured before each
configuration and at the end: the first window saw the same shape run at 719 and, minutes later, 689
TFLOP/s (sustained clocks), so each GEMM is also set beside the model rescaled to that measured rate,
which tells the model's shape terms from the GPU's clock of the moment.

Run: ``python -m benchmarks.gpu.model_kernels --out DIR``; writes DIR/model_kernels.json and .md;
exits 2 without a GPU. Needs megatron-core (the configurations are read as every command reads them).
"""

from __future__ import annotations

import functools
import math
import statistics
import sys
from collections.abc import Callable
from pathlib import Path

import torch

from benchmarks.gpu.stage import run_stage

NAME = "model_kernels"
GPU = "h200"
CONFIGS = (
    "gpt-1.7b-48gpus",
    "gpt-7.1b-96gpus",
    "gpt-70b-768gpus",
    "gpt-462b-6144gpus",
    "llama3-405b-16384gpus",
)
"""The published suite's smallest and largest README rows, a middle one, and the Llama 3 row."""
CONFIG_DIR = Path(__file__).resolve().parents[2] / "launch" / "configs"
COPY_BYTES = (1 << 16, 1 << 20, 16 << 20, 256 << 20, 2 << 30)
DEVICE = "cuda"
TRIALS = 5
WARMUP = 3
RUN_NS = 2_000_000
GEMM_MEDIAN_BOUND = 0.10
ATTENTION_MEDIAN_BOUND = 0.15
COPY_BOUND = 0.10
"""Bounds of the verdict: the median |model / measured - 1| of each family (copies: each one judged,
see COPY_JUDGED_FROM_KIB)."""
COPY_JUDGED_FROM_KIB = 64 << 10
"""Copies judged: from 64 MiB, where the source and the destination together exceed the 50 MiB L2 of
an H100 or H200, so HBM's bandwidth sets the time, as the model charges it. Below, the launch (64 KiB,
1 MiB) or the L2 (a 16 MiB copy measured 8.7 us in one window, 6.6 us in the next, against 8.9 us
modelled from HBM) does."""
RESCALED = "gemm, model rescaled to the measured MAMF shape"
"""The summary's family of GEMM errors against the model rescaled to this GPU's MAMF-shape rate."""


def _timed_ns(call: Callable[[], object], expected_ns: float) -> float:
    """Median over TRIALS runs of the device time of one call, in ns."""
    calls = max(1, min(500, math.ceil(RUN_NS / max(expected_ns, 1.0))))
    for _ in range(WARMUP):
        call()
    times = []
    for _ in range(TRIALS):
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        start.record()
        for _ in range(calls):
            call()
        end.record()
        end.synchronize()
        times.append(start.elapsed_time(end) * 1e6 / calls)
    return statistics.median(times)


def layer_shapes(name: str) -> dict:
    """One configuration's per-GPU shapes: tokens per microbatch and sequence shard, the linear
    layers (out, in) after tensor parallelism, attention's heads, head dim and sequence."""
    from prism_megatron.megatron.job.configs import read_config
    from prism_megatron.megatron.job.job import job_from_flags

    target = job_from_flags(read_config(CONFIG_DIR / f"{name}.args")).target
    model, tp, cp = target.model, target.sizes.tp, target.sizes.cp
    heads = model.num_attention_heads
    groups = model.num_query_groups or heads
    head_dim = model.kv_channels or model.hidden_size // heads
    h, ffn = model.hidden_size, model.ffn_hidden_size or 4 * model.hidden_size
    seq = model.seq_length // cp
    return {
        "tokens": target.micro_batch_size * seq,
        "linears": {
            "qkv": ((heads + 2 * groups) * head_dim // tp, h),
            "proj": (h, heads * head_dim // tp),
            "fc1": (ffn * (2 if model.swiglu else 1) // tp, h),
            "fc2": (h, ffn // tp),
            "logits": (model.padded_vocab_size // tp, h),
        },
        "attention": {
            "batch": target.micro_batch_size,
            "heads": heads // tp,
            "kv_heads": groups // tp,
            "seq": seq,
            "head_dim": head_dim,
        },
    }


def anchor_tflops(spec) -> float:
    """This GPU's throughput now at the MAMF's shape, the shape the model's GEMM rate is anchored on."""
    m, n, k = spec.mamf_bf16_m, spec.mamf_bf16_n, spec.mamf_bf16_k
    a = torch.randn(m, k, device=DEVICE, dtype=torch.bfloat16)
    b = torch.randn(k, n, device=DEVICE, dtype=torch.bfloat16)
    expected_ns = 2 * m * n * k / spec.mamf_bf16_flops_per_s * 1e9
    return 2 * m * n * k / _timed_ns(functools.partial(torch.mm, a, b), expected_ns) / 1e3


def gemm_rows(name: str, shapes: dict, spec, anchor: float) -> list[dict]:
    """`anchor`: this GPU's TFLOP/s at the MAMF's shape, measured just before; each row also gives
    the error of the model rescaled to it (its MAMF replaced by what this GPU sustains now), which
    separates the model's shape terms from the GPU's current clock."""
    from prism_megatron.gpu_model import gemm_time

    t, rows = shapes["tokens"], []
    rescale = spec.mamf_bf16_flops_per_s / 1e12 / anchor
    x = torch.randn(t, max(i for _, i in shapes["linears"].values()), device=DEVICE, dtype=torch.bfloat16)
    for layer, (out, inp) in shapes["linears"].items():
        w = torch.randn(out, inp, device=DEVICE, dtype=torch.bfloat16)
        xi, g = x[:, :inp].contiguous(), torch.randn(t, out, device=DEVICE, dtype=torch.bfloat16)
        passes = {  # (m, n, k) of the product, and the call as torch's linear and its backward make it
            "fwd": ((t, out, inp), functools.partial(torch.nn.functional.linear, xi, w)),
            "dgrad": ((t, inp, out), functools.partial(torch.mm, g, w)),
            "wgrad": ((out, inp, t), functools.partial(torch.mm, g.t(), xi)),
        }
        for kind, ((m, n, k), call) in passes.items():
            model_ns = gemm_time(spec, m, n, k, torch.bfloat16)
            measured_ns = _timed_ns(call, model_ns)
            row = _row("gemm", name, f"{layer} {kind}", f"{m}x{n}x{k}", measured_ns, model_ns)
            row["anchor_tflops"] = round(anchor, 1)
            row["error_at_anchor_pct"] = round(100 * (model_ns * rescale / measured_ns - 1), 1)
            rows.append(row)
    return rows


def attention_rows(name: str, shapes: dict, spec) -> list[dict]:
    from torch.nn.attention import SDPBackend, sdpa_kernel

    from prism_megatron.gpu_model import attention_time

    a = shapes["attention"]
    b, n, s, d = a["batch"], a["heads"], a["seq"], a["head_dim"]
    q, k, v = (
        torch.randn(b, n, s, d, device=DEVICE, dtype=torch.bfloat16, requires_grad=True) for _ in range(3)
    )
    shape = f"b{b} h{n} (kv {a['kv_heads']}) s{s} d{d} causal"
    rows = []
    # Each measured kernel against the model's figures for it: cuDNN's own (what a modelled run with
    # --attention-backend auto takes on Hopper), torch's FlashAttention-2 against FlashAttention-3's.
    for label, backend, kernel in (
        ("cuDNN", SDPBackend.CUDNN_ATTENTION, "cudnn"),
        ("FlashAttention-2", SDPBackend.FLASH_ATTENTION, "flash"),
    ):
        for backward in (False, True):
            model_ns = attention_time(
                spec.with_attention_kernel(kernel), batch=b, num_heads=n, num_kv_heads=a["kv_heads"],
                seq_q=s, seq_kv=s, head_dim=d, causal=True, backward=backward,
            )  # fmt: skip
            kind = f"attention {label}"
            pass_name = "bwd" if backward else "fwd"
            try:
                with sdpa_kernel([backend]):
                    if not backward:
                        with torch.no_grad():
                            call = functools.partial(
                                torch.nn.functional.scaled_dot_product_attention, q, k, v, is_causal=True
                            )
                            measured = _timed_ns(call, model_ns)
                    else:
                        out = torch.nn.functional.scaled_dot_product_attention(q, k, v, is_causal=True)
                        call = functools.partial(
                            torch.autograd.grad, out, (q, k, v), torch.randn_like(out), retain_graph=True
                        )
                        measured = _timed_ns(call, model_ns)
            except RuntimeError as exc:
                rows.append({"kind": kind, "config": name, "op": pass_name, "shape": shape,
                             "error": str(exc).splitlines()[0][:200]})  # fmt: skip
                continue
            rows.append(_row(kind, name, pass_name, shape, measured, model_ns))
    return rows


def copy_rows(spec) -> list[dict]:
    from prism_megatron.gpu_model.fused import memory_kernel_time

    rows = []
    for size in COPY_BYTES:
        src = torch.empty(size, device=DEVICE, dtype=torch.uint8).random_(0, 255)
        dst = torch.empty_like(src)
        model_ns = memory_kernel_time(spec, 2 * size)  # read and written once
        measured = _timed_ns(functools.partial(dst.copy_, src), model_ns)
        rows.append(_row("copy", "-", "device copy", f"{size >> 10} KiB", measured, model_ns))
    return rows


def _row(kind: str, config: str, op: str, shape: str, measured_ns: float, model_ns: float) -> dict:
    return {
        "kind": kind,
        "config": config,
        "op": op,
        "shape": shape,
        "measured_us": round(measured_ns / 1e3, 3),
        "model_us": round(model_ns / 1e3, 3),
        "error_pct": round(100 * (model_ns / measured_ns - 1), 1),
    }


def summaries(rows: list[dict]) -> dict[str, dict]:
    kinds: dict[str, list[float]] = {}
    for r in rows:
        if "error_pct" in r:
            kinds.setdefault(r["kind"], []).append(r["error_pct"])
        if "error_at_anchor_pct" in r:
            kinds.setdefault(RESCALED, []).append(r["error_at_anchor_pct"])
    return {
        kind: {
            "n": len(errors),
            "median_abs_error_pct": round(statistics.median(abs(e) for e in errors), 1),
            "median_error_pct": round(statistics.median(errors), 1),
            "max_abs_error_pct": round(max(abs(e) for e in errors), 1),
            "within_10_pct": sum(abs(e) <= 10 for e in errors),
        }
        for kind, errors in kinds.items()
    }


def measure() -> dict:
    from prism_megatron.gpu_model import gpu_spec

    spec = gpu_spec(GPU)
    torch.backends.cuda.matmul.allow_bf16_reduced_precision_reduction = True
    rows = copy_rows(spec)
    anchors = []
    for name in CONFIGS:
        shapes = layer_shapes(name)
        anchors.append(round(anchor_tflops(spec), 1))
        rows += gemm_rows(name, shapes, spec, anchors[-1])
        rows += attention_rows(name, shapes, spec)
        torch.cuda.empty_cache()
        print(f"{name}: {sum(r['config'] == name for r in rows)} kernels timed", flush=True)
    return {
        "gpu": torch.cuda.get_device_name(0),
        "modelled_as": spec.display_name,
        "torch": torch.__version__,
        "cudnn": torch.backends.cudnn.version(),
        "model_mamf_tflops": spec.mamf_bf16_flops_per_s / 1e12,
        "anchor_tflops": [*anchors, round(anchor_tflops(spec), 1)],
        "rows": rows,
        "summary": summaries(rows),
    }


def verdicts(result: dict) -> dict[str, tuple[bool, str]]:
    """Per family: (within its bound, evidence)."""
    summary = result["summary"]
    out = {}
    for family, kind, bound in (
        ("gemm", "gemm", GEMM_MEDIAN_BOUND),
        ("attention", "attention cuDNN", ATTENTION_MEDIAN_BOUND),
    ):
        s = summary.get(kind)
        if s is None:
            out[family] = (False, f"no {kind} kernel timed")
            continue
        holds = s["median_abs_error_pct"] <= 100 * bound
        out[family] = (holds, f"median |error| {s['median_abs_error_pct']} % over {s['n']} kernels "
                       f"(median {s['median_error_pct']:+} %, worst {s['max_abs_error_pct']} %)")  # fmt: skip
    copies = [
        r
        for r in result["rows"]
        if r["kind"] == "copy" and int(r["shape"].split()[0]) >= COPY_JUDGED_FROM_KIB
    ]
    worst = max(copies, key=lambda r: abs(r["error_pct"]), default=None)
    out["copy"] = (
        (worst is not None and abs(worst["error_pct"]) <= 100 * COPY_BOUND),
        f"worst {worst['error_pct']:+} % ({worst['shape']})" if worst else "no copy timed",
    )
    return out


def markdown(result: dict) -> str:
    lines = [
        f"## The GPU model against the lent GPU's kernels ({result['gpu']}, modelled as {result['modelled_as']})",
        "",
        f"torch {result['torch']}, cuDNN {result['cudnn']}. Error = model / measured - 1 (positive: the model "
        "is slower than the GPU). Nothing here is fitted; the model was built from published H100 figures.",
        "",
        f"This GPU at the MAMF's shape (the model's GEMM anchor, {result['model_mamf_tflops']:g} TFLOP/s), "
        f"before each configuration and at the end: {', '.join(f'{a:g}' for a in result['anchor_tflops'])} "
        f"TFLOP/s. `{RESCALED}`: each GEMM against the model with its MAMF replaced by the one measured before its configuration.",
        "",
        "| family | kernels | median abs error | median error | worst | within 10 % |",
        "|---|---:|---:|---:|---:|---:|",
    ]
    for kind, s in result["summary"].items():
        lines.append(
            f"| {kind} | {s['n']} | {s['median_abs_error_pct']} % | {s['median_error_pct']:+} % | "
            f"{s['max_abs_error_pct']} % | {s['within_10_pct']} |"
        )
    lines += [
        "",
        "| family | config | op | shape | measured us | model us | error |",
        "|---|---|---|---|---:|---:|---:|",
    ]
    for r in result["rows"]:
        if "error" in r:
            lines.append(f"| {r['kind']} | {r['config']} | {r['op']} | {r['shape']} | - | - | {r['error']} |")
        else:
            lines.append(
                f"| {r['kind']} | {r['config']} | {r['op']} | {r['shape']} | {r['measured_us']} | "
                f"{r['model_us']} | {r['error_pct']:+} % |"
            )
    lines += [""] + [
        f"- {family}: **{'within' if holds else 'NOT within'}** its bound: {evidence}"
        for family, (holds, evidence) in verdicts(result).items()
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    result = run_stage(NAME, __doc__.splitlines()[0], measure, markdown, argv)
    if result is None:
        return 2
    for family, (holds, evidence) in verdicts(result).items():
        print(f"{family}: {'within' if holds else 'NOT within'} bound: {evidence}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
