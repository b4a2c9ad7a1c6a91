"""Published kernel measurements the GPU model is held against, shape by shape, each with its source.

These are the kernel-level figures (not end-to-end training results). A few of them are the model's
own anchors (prism_megatron/gpu_model/constants.py): the formula is solved to reproduce those, so
they only check the arithmetic and are marked `anchor=True`; the rest were not used and test the
model's shape dependence (tiles, waves, short k, small m, sequence length, causal mask, head dim).
"""

from __future__ import annotations

import dataclasses

from prism_megatron.gpu_model import constants

XLA_SM90 = (
    "OpenXLA default matmul performance table, xla/service/gpu/model/matmul_interpolator_data.h, "
    "sm_90 (H100) entries, bf16xbf16->bf16 (https://github.com/openxla/xla)"
)
XLA_SM100 = (
    "OpenXLA default matmul performance table, matmul_interpolator_data.h, sm_100 (B200) entries, bf16"
)
MAMF = (
    "S. Bekman, Machine Learning Engineering Open Book, 'Maximum Achievable Matmul FLOPS comparison "
    "table' (https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md)"
)
FA3_FWD = (
    "FlashAttention-3 (arXiv:2407.08608) Fig. 5, forward, head dim 128, H100 80GB SXM5, FlashAttention-3 bars"
)
FA3_BWD = "FlashAttention-3 (arXiv:2407.08608) Fig. 6, backward, H100 80GB SXM5, FlashAttention-3 bars"
CUDNN_FWD = "FlashAttention-3 (arXiv:2407.08608) Fig. 5, forward, head dim 128, H100 80GB SXM5, cuDNN bars"
CUDNN_BWD = "FlashAttention-3 (arXiv:2407.08608) Fig. 6, backward, head dim 128, H100 80GB SXM5, cuDNN bars"
FA2_TEXT = "FlashAttention-2 (arXiv:2307.08691) Sec. 4.1: up to 73 % (fwd) / 63 % (bwd) of A100's 312 TFLOP/s"


@dataclasses.dataclass(frozen=True, kw_only=True)
class GemmFigure:
    gpu: str
    batch: int
    m: int
    n: int
    k: int
    tflops: float
    source: str
    dtype: str = "bf16"
    anchor: bool = False


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttentionFigure:
    gpu: str
    direction: str  # "fwd" or "bwd"
    causal: bool
    head_dim: int
    seq: int
    tflops: float
    source: str
    anchor: bool = False
    kernel: str = "FlashAttention-3"
    """The kernel measured: FlashAttention-3's curve times `--attention-backend flash`, cuDNN's (what
    Transformer Engine's fused attention calls on Hopper, and `auto` takes there) the rest; the
    model is solved from five figures of each (`anchor`) and held against the others."""

    @property
    def batch(self) -> int:
        return 16384 // self.seq  # the papers' setting: batch x seqlen = 16k

    @property
    def heads(self) -> int:
        return 2048 // self.head_dim  # hidden 2048


# b m n k TFLOP/s, transcribed from the sm_90 part of the table (values rounded to 0.1 TFLOP/s).
_SM90 = """
1 1024 2048 256 139.5; 2 256 2048 2048 332.2; 1 256 2048 256 41.8; 4 512 256 256 42.4;
1 4096 512 512 238.8; 4 4096 256 2048 588.7; 1 512 256 512 21.8; 2 2048 256 512 139.2;
2 1024 2048 1024 493.4; 1 256 2048 4096 285.9; 2 512 2048 2048 525.3; 4 1024 2048 2048 712.7;
1 4096 1024 512 343.7; 1 2048 2048 2048 632.0; 4 256 256 256 22.6; 2 256 256 1024 37.0;
1 256 512 4096 91.7; 1 256 1024 256 22.7; 2 256 1024 2048 216.1; 2 2048 4096 1024 678.7;
2 4096 512 256 211.0; 2 4096 4096 2048 763.0; 4 512 2048 1024 487.2; 4 1024 512 2048 514.2;
1 2048 512 2048 347.7; 2 512 512 2048 216.5; 4 4096 512 1024 589.0; 2 1024 256 256 43.7;
1 4096 4096 4096 783.3; 1 512 4096 1024 373.3; 2 256 512 2048 119.6; 1 512 256 4096 91.1;
2 2048 256 4096 378.6; 1 256 1024 4096 172.3; 1 4096 2048 512 447.0; 1 2048 256 1024 135.8;
2 512 1024 2048 349.5; 4 1024 1024 2048 626.1; 4 4096 1024 1024 673.8; 4 1024 256 1024 218.2;
2 512 256 1024 66.6; 4 4096 4096 512 619.9; 1 2048 1024 2048 523.3; 4 256 2048 1024 358.9;
2 4096 1024 4096 750.6; 2 1024 256 4096 306.4; 2 2048 256 256 78.8; 1 512 256 256 11.5;
4 512 256 512 77.9; 1 1024 256 1024 68.3; 1 4096 256 2048 304.7; 1 1024 1024 2048 350.0;
4 4096 512 512 441.5; 2 4096 1024 256 301.6; 2 4096 512 4096 729.7; 2 1024 4096 1024 596.5;
4 256 256 512 41.2; 1 256 4096 2048 324.6; 4 2048 2048 2048 725.7; 1 1024 512 2048 220.0;
2 4096 2048 4096 783.2; 4 4096 1024 512 542.0; 4 4096 4096 256 503.9; 4 2048 512 2048 621.4;
1 512 2048 1024 232.6; 1 4096 512 1024 370.8; 4 512 4096 1024 592.2; 4 256 256 4096 171.6;
1 1024 2048 2048 524.3; 2 2048 2048 1024 600.2; 4 4096 4096 4096 793.1; 4 2048 1024 2048 710.6;
2 4096 2048 256 394.5; 1 4096 1024 1024 488.1; 4 512 256 4096 293.1; 2 1024 256 512 76.4;
4 256 4096 1024 481.9; 4 4096 2048 512 607.5; 2 256 256 512 21.6; 1 1024 2048 1024 373.3;
4 4096 1024 256 393.3; 1 4096 4096 512 543.1; 4 4096 512 4096 728.6; 2 4096 1024 512 445.5;
2 2048 2048 2048 717.7; 1 256 512 1024 39.1; 1 512 2048 2048 342.4; 4 4096 1024 4096 777.6;
1 256 4096 512 138.1; 2 4096 512 512 340.7; 4 2048 256 256 136.1; 1 256 1024 1024 72.5;
4 1024 256 512 135.8; 1 2048 256 512 77.3; 1 1024 256 256 22.0; 1 2048 256 4096 307.5;
4 4096 2048 256 458.5; 4 1024 256 4096 384.0; 2 4096 4096 4096 807.7; 2 512 256 4096 168.6;
2 4096 2048 512 546.4; 2 512 256 512 40.3; 2 2048 1024 2048 629.4; 2 256 4096 1024 358.4;
1 512 1024 2048 216.5; 1 512 256 1024 39.3; 1 256 256 2048 31.1; 2 2048 256 1024 217.2;
1 4096 512 256 142.5; 1 2048 4096 1024 594.2; 4 4096 2048 4096 808.7; 4 1024 4096 1024 674.9;
1 4096 4096 2048 738.7; 1 512 512 2048 114.7; 4 2048 2048 1024 674.0; 2 2048 512 2048 518.7;
2 256 256 4096 91.3; 2 512 4096 1024 486.7; 2 4096 4096 256 464.0; 1 4096 512 4096 650.0;
1 4096 1024 256 216.5; 1 1024 4096 1024 490.3; 1 256 4096 256 78.0; 2 256 256 256 11.6;
4 512 2048 2048 629.4; 2 1024 512 2048 347.7; 4 2048 256 512 235.5; 1 256 4096 4096 412.0;
1 4096 1024 4096 738.5; 4 256 2048 2048 478.5; 1 1024 256 4096 169.7; 4 1024 256 256 80.9;
2 512 256 256 21.7; 1 256 2048 512 78.2; 2 1024 256 1024 136.4; 2 4096 256 2048 508.4;
1 2048 256 256 43.6; 2 1024 1024 2048 519.2; 4 256 512 2048 204.6; 4 512 256 1024 132.4;
1 4096 2048 256 304.0; 4 512 1024 2048 518.2; 4 2048 256 4096 561.9; 2 256 2048 1024 226.3;
2 4096 4096 512 607.7; 2 4096 1024 1024 598.2; 1 256 512 256 11.5
"""

_SM90_ANCHORS = {(1, 4096, 4096, 256), (1, 256, 512, 256)}


def _sm90() -> list[GemmFigure]:
    rows = []
    for item in _SM90.replace("\n", " ").split(";"):
        b, m, n, k, tflops = item.split()
        shape = (int(b), int(m), int(n), int(k))
        rows.append(
            GemmFigure(
                gpu="h100",
                batch=shape[0],
                m=shape[1],
                n=shape[2],
                k=shape[3],
                tflops=float(tflops),
                source=XLA_SM90,
                anchor=shape in _SM90_ANCHORS,
            )
        )
    return rows


GEMM_FIGURES: list[GemmFigure] = [
    *_sm90(),
    GemmFigure(gpu="b200", batch=1, m=256, n=256, k=256, tflops=6.8, source=XLA_SM100, anchor=True),
    GemmFigure(gpu="b200", batch=1, m=256, n=512, k=256, tflops=13.4, source=XLA_SM100),
    GemmFigure(gpu="b200", batch=1, m=256, n=1024, k=256, tflops=18.6, source=XLA_SM100),
    GemmFigure(gpu="h100", batch=1, m=2048, n=2048, k=13312, tflops=794.5, source=MAMF, anchor=True),
    GemmFigure(gpu="a100", batch=1, m=1024, n=10240, k=5120, tflops=271.2, source=MAMF, anchor=True),
    GemmFigure(gpu="b200", batch=1, m=1792, n=16128, k=3072, tflops=1745.0, source=MAMF, anchor=True),
    GemmFigure(
        gpu="h100", batch=1, m=1024, n=9216, k=14336, tflops=1402.6, source=MAMF, dtype="fp8", anchor=True
    ),
    GemmFigure(
        gpu="h200", batch=1, m=1280, n=4096, k=12032, tflops=1453.4, source=MAMF, dtype="fp8", anchor=True
    ),
    GemmFigure(
        gpu="b200", batch=1, m=15360, n=4096, k=3072, tflops=3432.5, source=MAMF, dtype="fp8", anchor=True
    ),
]
"""The MAMF rows are anchors: each GPU's per-SM BF16 and FP8 rates are solved from them."""

SEQS = (512, 1024, 2048, 4096, 8192, 16384)


def _curve(direction, causal, head_dim, values, source, anchors=(), kernel="FlashAttention-3"):
    return [
        AttentionFigure(
            gpu="h100",
            direction=direction,
            causal=causal,
            head_dim=head_dim,
            seq=seq,
            tflops=float(v),
            source=source,
            anchor=seq in anchors,
            kernel=kernel,
        )
        for seq, v in zip(SEQS, values, strict=True)
    ]


ATTENTION_FIGURES: list[AttentionFigure] = [
    *_curve("fwd", False, 128, (467, 565, 625, 638, 646, 648), FA3_FWD, anchors=(512, 16384)),
    *_curve("fwd", True, 128, (292, 423, 521, 579, 602, 616), FA3_FWD, anchors=(16384,)),
    *_curve("fwd", False, 64, (333, 392, 460, 476, 496, 497), FA3_FWD, anchors=(16384,)),
    *_curve("fwd", True, 64, (197, 265, 371, 420, 460, 473), FA3_FWD),
    *_curve("bwd", False, 128, (316, 424, 501, 542, 559, 561), FA3_BWD, anchors=(512, 16384)),
    *_curve("bwd", False, 64, (272, 363, 422, 453, 472, 474), FA3_BWD, anchors=(16384,)),
    *_curve(
        "fwd", False, 128, (497, 574, 617, 609, 600, 595), CUDNN_FWD, anchors=(512, 16384), kernel="cuDNN"
    ),
    *_curve("fwd", True, 128, (315, 410, 484, 518, 529, 539), CUDNN_FWD, anchors=(16384,), kernel="cuDNN"),
    *_curve(
        "bwd", False, 128, (305, 408, 465, 499, 518, 516), CUDNN_BWD, anchors=(512, 16384), kernel="cuDNN"
    ),
    AttentionFigure(
        gpu="a100",
        direction="fwd",
        causal=False,
        head_dim=128,
        seq=16384,
        tflops=0.73 * 312,
        source=FA2_TEXT,
        anchor=True,
    ),
    AttentionFigure(
        gpu="a100",
        direction="bwd",
        causal=False,
        head_dim=128,
        seq=16384,
        tflops=0.63 * 312,
        source=FA2_TEXT,
        anchor=True,
    ),
]
"""FA3 Fig. 5's panels carry no causal label in the text extraction used here; of the two panels per
head dim, the one whose standard-attention bars are the lower (masked work wasted: 26-35 against
74-139 TFLOP/s at head dim 128, 16-18 against 52-73 at 64) is read as the causal one. The
non-causal 512 value is 467 for FlashAttention-3 and 497 for cuDNN (two extractions of the panel
disagree on which bar is which; cuDNN leads at 1k too, so the larger is read as cuDNN's)."""

LIGER_DATA = (
    "Liger-Kernel, benchmark/data/all_benchmark_data.csv at commit ead96b6 "
    "(https://github.com/linkedin/Liger-Kernel), NVIDIA H100 80GB HBM3, medians of triton.testing.do_bench"
)
LIGER_CE = (
    f"{LIGER_DATA}, kernel 'megatron_cross_entropy' (benchmark/scripts/benchmark_megatron_cross_entropy.py "
    "as of the measurement), BF16 logits [2048, 4, V], TP 1, measured 2026-06-15"
)
LIGER_SWIGLU = constants.LIGER_MEGATRON_SWIGLU
MEMORY_FUNCTIONS = {
    "ce_unfused": "Megatron cross-entropy, unfused",
    "ce_native": "Megatron cross-entropy, fused (native)",
    "swiglu_megatron": "Megatron SwiGLU, jit-fused",
    "swiglu_torch": "SwiGLU, eager torch",
}
"""The functions measured: megatron-core's vocab_parallel_cross_entropy (provider 'megatron-unfused'),
its fused_vocab_parallel_cross_entropy (`--cross-entropy-loss-fusion`, impl native; 'megatron-fused'),
its bias_swiglu_impl ('megatron') and silu(y1) * y2 over torch.chunk ('torch')."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryFigure:
    """One memory-bound function at one size: `mode` 'forward' is the call alone, 'full' the call and
    `y.sum().backward()`; `size` is the vocabulary V (cross-entropy) or ffn_local (SwiGLU)."""

    function: str
    mode: str
    size: int
    ms: float
    source: str
    gpu: str = "h100"
    anchor: bool = False


def _liger(function: str, mode: str, size: int, ms: float) -> MemoryFigure:
    source = LIGER_CE if function.startswith("ce_") else LIGER_SWIGLU
    # constants.jit_activation_* are read from the jit-fused SwiGLU's largest figure (its exact values)
    anchor = function == "swiglu_megatron" and size == constants.SWIGLU_FFN
    if anchor:
        ms = 1e3 * (constants.SWIGLU_FWD_S if mode == "forward" else constants.SWIGLU_FULL_S)
    return MemoryFigure(function=function, mode=mode, size=size, ms=ms, source=source, anchor=anchor)


MEMORY_FIGURES = [
    _liger(function, mode, size, ms)
    for function, mode, size, ms in (
        ("ce_unfused", "forward", 4096, 0.5585),
        ("ce_unfused", "forward", 8192, 1.0782),
        ("ce_unfused", "forward", 16384, 2.0663),
        ("ce_unfused", "forward", 32768, 4.0231),
        ("ce_unfused", "forward", 65536, 7.9344),
        ("ce_unfused", "forward", 131072, 15.8124),
        ("ce_unfused", "full", 4096, 0.7676),
        ("ce_unfused", "full", 8192, 1.4552),
        ("ce_unfused", "full", 16384, 2.7819),
        ("ce_unfused", "full", 32768, 5.4108),
        ("ce_unfused", "full", 65536, 10.6675),
        ("ce_unfused", "full", 131072, 21.2458),
        ("ce_native", "forward", 4096, 0.3122),
        ("ce_native", "forward", 8192, 0.6359),
        ("ce_native", "forward", 16384, 1.3467),
        ("ce_native", "forward", 32768, 2.8313),
        ("ce_native", "forward", 65536, 5.7631),
        ("ce_native", "forward", 131072, 11.8098),
        ("ce_native", "full", 4096, 0.5274),
        ("ce_native", "full", 8192, 1.0506),
        ("ce_native", "full", 16384, 2.1582),
        ("ce_native", "full", 32768, 4.4489),
        ("ce_native", "full", 65536, 8.9805),
        ("ce_native", "full", 131072, 18.2305),
        ("swiglu_megatron", "forward", 1024, 0.0232),
        ("swiglu_megatron", "forward", 2048, 0.0604),
        ("swiglu_megatron", "forward", 4096, 0.1137),
        ("swiglu_megatron", "forward", 8192, 0.2202),
        ("swiglu_megatron", "forward", 16384, 0.4329),
        ("swiglu_megatron", "forward", 32768, 0.8585),
        ("swiglu_megatron", "full", 1024, 0.1780),
        ("swiglu_megatron", "full", 2048, 0.3384),
        ("swiglu_megatron", "full", 4096, 0.6570),
        ("swiglu_megatron", "full", 8192, 1.2888),
        ("swiglu_megatron", "full", 16384, 2.5541),
        ("swiglu_megatron", "full", 32768, 5.0841),
        ("swiglu_torch", "forward", 1024, 0.0578),
        ("swiglu_torch", "forward", 2048, 0.1053),
        ("swiglu_torch", "forward", 4096, 0.1976),
        ("swiglu_torch", "forward", 8192, 0.3830),
        ("swiglu_torch", "forward", 16384, 0.7503),
        ("swiglu_torch", "forward", 32768, 1.4953),
        ("swiglu_torch", "full", 1024, 0.1727),
        ("swiglu_torch", "full", 2048, 0.3184),
        ("swiglu_torch", "full", 4096, 0.6027),
        ("swiglu_torch", "full", 8192, 1.1699),
        ("swiglu_torch", "full", 16384, 2.2963),
        ("swiglu_torch", "full", 32768, 4.5732),
    )
]
"""Memory-bound functions the published runs call, measured whole (several kernels each). The model
is held against each as a modelled run charges it: the cross-entropies op by op (a modelled run charges
Megatron's native fused path as the unfused ops it runs), eager SwiGLU op by op, Megatron's jit-fused
SwiGLU as `fused.activation_time`. The largest jit-fused SwiGLU figures are the anchors of
`jit_activation_*_fraction`."""
