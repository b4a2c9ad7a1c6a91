"""Every number the GPU model uses, with its unit and the public source it was read from.

The model's whole claim to honesty is here: a constant comes from a datasheet, a kernel library's
published benchmark or a paper's kernel figure, never from an end-to-end training result (those are
the test set, benchmarks/published/). `tests/unit/test_gpu_model_constants.py` fails on a constant
without a source, unit or value.

Keys are `<gpu>.<quantity>`; the quantities each GPU must have are `GPU_QUANTITIES`. Values are SI
(FLOP/s, bytes/s, bytes, ns) so no reader converts units. Where a constant is derived (dense =
sparse / 2, per GPU = per 8-GPU board / 8, efficiency = measured / peak) `note` shows the arithmetic.
Where a number is an assumption carried from another GPU, `note` says so in words: those are the
model's weakest points and the report names them.
"""

from __future__ import annotations

import dataclasses


@dataclasses.dataclass(frozen=True, kw_only=True)
class Constant:
    value: float
    """The number, in `unit`."""
    unit: str
    """SI unit of `value` ("FLOP/s", "bytes/s", "bytes", "ns", "count", "fraction", "tile")."""
    source: str
    """Where the number was read: a document title and its address, and the figure or table."""
    note: str = ""
    """How the value follows from the source when it is not read verbatim, or what is assumed."""


# --- sources, named once -----------------------------------------------------------------------

H100_DATASHEET = (
    "NVIDIA H100 Tensor Core GPU datasheet, H100 SXM column "
    "(https://resources.nvidia.com/en-us-tensor-core/nvidia-tensor-core-gpu-datasheet)"
)
H200_DATASHEET = (
    "NVIDIA H200 Tensor Core GPU datasheet, H200 SXM column (https://www.nvidia.com/en-us/data-center/h200/)"
)
A100_DATASHEET = (
    "NVIDIA A100 Tensor Core GPU datasheet, A100 80GB SXM column "
    "(https://www.nvidia.com/content/dam/en-zz/Solutions/Data-Center/a100/pdf/"
    "nvidia-a100-datasheet-us-nvidia-1758950-r4-web.pdf)"
)
NVML_MEMORY = (
    "Modal, 'Why does an NVIDIA H100 80GB card offer 85.52 GB?' "
    "(https://thundergolfer.com/blog/nvidia-gpu-memory-capacity): the memory NVML (nvidia-smi) reports "
    "per GPU, in MiB; the datasheets' GB are rounded figures"
)
B200_DATASHEET = (
    "NVIDIA HGX B200 / DGX B200 datasheet, 8-GPU figures (https://www.nvidia.com/en-us/data-center/hgx/)"
)
HOPPER_WHITEPAPER = (
    "NVIDIA H100 Tensor Core GPU Architecture white paper and Hopper Tuning Guide: H100 SXM5 has "
    "132 SMs and a 50 MB L2 (https://docs.nvidia.com/cuda/hopper-tuning-guide/index.html)"
)
AMPERE_WHITEPAPER = (
    "NVIDIA A100 Tensor Core GPU Architecture white paper: 108 SMs, 40 MB L2 "
    "(https://images.nvidia.com/aem-dam/en-zz/Solutions/data-center/nvidia-ampere-architecture-whitepaper.pdf)"
)
BLACKWELL_GUIDE = "NVIDIA Blackwell Tuning Guide: 126 MB L2 per GPU (https://docs.nvidia.com/cuda/blackwell-tuning-guide/index.html)"
SCALING_BOOK_GPUS = (
    "J. Austin et al., How to Scale Your Model, chapter 'How to Think About GPUs': H100 has 132 SMs, "
    "B200 has 148 SMs (https://jax-ml.github.io/scaling-book/gpus/)"
)
MAMF_TABLE = (
    "S. Bekman, Machine Learning Engineering Open Book, compute/accelerator/README.md, 'Maximum "
    "Achievable Matmul FLOPS comparison table' (torch.matmul, mean of 100 after 50 warm-up, best shape "
    "of a brute-force search) (https://github.com/stas00/ml-engineering/blob/master/compute/accelerator/README.md)"
)
XLA_MATMUL_TABLE = (
    "OpenXLA default matmul performance table, xla/service/gpu/model/matmul_interpolator_data.h "
    "(measured GEMM FLOP/s by (b, m, n, k) for sm_90 and sm_100) (https://github.com/openxla/xla)"
)
XLA_LAUNCH = (
    "OpenXLA GPU performance model, xla/service/gpu/model/gpu_performance_model_base.h: "
    "kKernelLaunchOverhead = 1 us per kernel, which XLA's comment calls an estimate 'in the absence of "
    "easy ways to query' it: a compiler's cost-model figure, not a measurement (https://github.com/openxla/xla)"
)
CAST_VECTORISE_H100 = (
    "PyTorch pull request #137053, '[CUDA][AMP] Speed up fp16/bf16 casts on H100+' (2024): an FP32 to "
    "FP16 cast of 2^31 elements on a power-limited H100 PCIe took 9.108 ms in ATen's unrolled elementwise "
    "kernel and 6.943 ms once vectorised (https://github.com/pytorch/pytorch/pull/137053)"
)
CAST_VECTORISE_A100 = (
    "PyTorch pull request #195542, '[ATen] Vectorize bf16/fp16 -> fp32 copies on CUDA' (2026), A100 "
    "table: a BF16 to FP32 cast of 67,108,864 elements, 362.46 us unrolled against 322.09 us vectorised, "
    "means of 200 iterations (https://github.com/pytorch/pytorch/pull/195542)"
)
LIGER_MEGATRON_SWIGLU = (
    "Liger-Kernel, benchmark/data/all_benchmark_data.csv, kernel 'megatron_swiglu', provider 'megatron' "
    "(megatron-core's bias_swiglu_impl, its @jit_fuser functions; script "
    "benchmark/scripts/benchmark_megatron_swiglu.py), NVIDIA H100 80GB HBM3, BF16 input [2048, 4, 2 x ffn_local], "
    "medians of triton.testing.do_bench, measured 2026-07-26 against megatron-core 0.16.1 (the pull request "
    "that added it, #1326), the file at commit ead96b6 (https://github.com/linkedin/Liger-Kernel)"
)
HBM_FORUM = (
    "NVIDIA Developer Forums, 'Trouble to Reach Peak Bandwidth of A100': a streaming read kernel "
    "reaches 1.80 of 2.04 TB/s, 88 % per Nsight Compute; the thread cites a GTC talk in which no kernel "
    "exceeded about 90 % (https://forums.developer.nvidia.com/t/trouble-to-reach-peak-bandwidth-of-a100/339083)"
)
FA3_FWD = (
    "J. Shah et al., FlashAttention-3 (arXiv:2407.08608), Fig. 5 'Attention forward speed, head dim "
    "128 (H100 80GB SXM5)', BF16, batch x seqlen = 16k, hidden 2048, FlashAttention-3 bars"
)
FA3_FWD_CAUSAL = (
    "J. Shah et al., FlashAttention-3 (arXiv:2407.08608), Fig. 5, causal panel 'Attention forward speed, "
    "head dim 128 (H100 80GB SXM5)', BF16, FlashAttention-3 bars"
)
FA3_BWD = (
    "J. Shah et al., FlashAttention-3 (arXiv:2407.08608), Fig. 6 'Attention backward speed, head dim "
    "128 (H100 80GB SXM5)', BF16, batch x seqlen = 16k, hidden 2048, FlashAttention-3 bars"
)
FA3_FWD_64 = (
    "J. Shah et al., FlashAttention-3 (arXiv:2407.08608), Fig. 5 'Attention forward speed, head dim "
    "64 (H100 80GB SXM5)', BF16, non-causal panel, FlashAttention-3 bars"
)
FA3_BWD_64 = (
    "J. Shah et al., FlashAttention-3 (arXiv:2407.08608), Fig. 6 'Attention backward speed, head dim "
    "64 (H100 80GB SXM5)', FlashAttention-3 bars"
)
OVERLAP_PAPER = (
    "S. Lee, J. Oh, J. Kim, S. Go, J. Park, D. Mahajan, Characterizing Compute-Communication Overlap "
    "in GPU-Accelerated Distributed Deep Learning: Performance and Power Implications (arXiv:2507.03114, "
    "https://arxiv.org/abs/2507.03114), abstract and introduction: compute kernels of GPT and LLaMA "
    "layers run 18.9 % slower on average (40.0 % at most) while collectives run beside them than the "
    "same compute with no communication, measured on 4-GPU A100, H100, MI250 and MI210 systems"
)
CUDNN_FWD = (
    "J. Shah et al., FlashAttention-3 (arXiv:2407.08608), Fig. 5 'Attention forward speed, head dim "
    "128 (H100 80GB SXM5)', BF16, batch x seqlen = 16k, hidden 2048, cuDNN bars"
)
CUDNN_FWD_CAUSAL = (
    "J. Shah et al., FlashAttention-3 (arXiv:2407.08608), Fig. 5, causal panel 'Attention forward speed, "
    "head dim 128 (H100 80GB SXM5)', BF16, cuDNN bars"
)
CUDNN_BWD = (
    "J. Shah et al., FlashAttention-3 (arXiv:2407.08608), Fig. 6 'Attention backward speed, head dim "
    "128 (H100 80GB SXM5)', BF16, batch x seqlen = 16k, hidden 2048, cuDNN bars"
)
FA2_PAPER = (
    "T. Dao, FlashAttention-2 (arXiv:2307.08691), abstract and Sec. 4.1: on A100 the forward pass "
    "reaches up to 73 % and the backward pass up to 63 % of the 312 TFLOP/s BF16 peak"
)

GPU_QUANTITIES = (
    "bf16_flops_per_s",
    "fp16_flops_per_s",
    "tf32_flops_per_s",
    "fp8_flops_per_s",
    "hbm_bytes_per_s",
    "hbm_capacity_bytes",
    "device_memory_bytes",
    "num_sms",
    "l2_bytes",
    "mamf_bf16_flops_per_s",
    "mamf_bf16_m",
    "mamf_bf16_n",
    "mamf_bf16_k",
    "mamf_fp8_flops_per_s",
    "mamf_fp8_m",
    "mamf_fp8_n",
    "mamf_fp8_k",
    "gemm_anchor_ns",
    "gemm_anchor_m",
    "gemm_anchor_n",
    "gemm_anchor_k",
    "gemm_short_k_flops_per_s",
    "gemm_short_k_m",
    "gemm_short_k_n",
    "gemm_short_k_k",
    "attention_fwd_flops_per_s",
    "attention_fwd_short_flops_per_s",
    "attention_fwd_causal_flops_per_s",
    "attention_bwd_flops_per_s",
    "attention_bwd_short_flops_per_s",
    "attention_fwd_d64_flops_per_s",
    "attention_bwd_d64_flops_per_s",
    "cudnn_attention_fwd_flops_per_s",
    "cudnn_attention_fwd_short_flops_per_s",
    "cudnn_attention_fwd_causal_flops_per_s",
    "cudnn_attention_bwd_flops_per_s",
    "cudnn_attention_bwd_short_flops_per_s",
    "hbm_efficiency",
    "unvectorised_fraction",
    "launch_ns",
    "comm_overlap_compute_slowdown",
    "jit_activation_fwd_fraction",
    "jit_activation_bwd_fraction",
)
"""What every GPU in the table has. Per-GPU rows below; `specs.py` turns them into a GpuSpec."""


def _hopper_attention(gpu: str) -> dict[str, Constant]:
    """FlashAttention-3's measured H100 curve. H200 has the same SMs and clocks (its datasheet gives
    the same FLOP/s), and attention at these shapes is compute-bound, so H200 reuses it."""
    carried = "" if gpu == "h100" else "H100 figure reused: same SM count, clocks and tensor-core peak."
    return {
        f"{gpu}.attention_fwd_flops_per_s": Constant(
            value=648e12, unit="FLOP/s", source=FA3_FWD, note=f"non-causal, seqlen 16k. {carried}"
        ),
        f"{gpu}.attention_fwd_short_flops_per_s": Constant(
            value=467e12, unit="FLOP/s", source=FA3_FWD, note=f"non-causal, seqlen 512. {carried}"
        ),
        f"{gpu}.attention_fwd_causal_flops_per_s": Constant(
            value=616e12,
            unit="FLOP/s",
            source=FA3_FWD_CAUSAL,
            note=f"causal, seqlen 16k (FLOPs counted halved for the mask). {carried}",
        ),
        f"{gpu}.attention_bwd_flops_per_s": Constant(
            value=561e12, unit="FLOP/s", source=FA3_BWD, note=f"seqlen 16k. {carried}"
        ),
        f"{gpu}.attention_bwd_short_flops_per_s": Constant(
            value=316e12, unit="FLOP/s", source=FA3_BWD, note=f"seqlen 512. {carried}"
        ),
        f"{gpu}.attention_fwd_d64_flops_per_s": Constant(
            value=497e12, unit="FLOP/s", source=FA3_FWD_64, note=f"non-causal, seqlen 16k. {carried}"
        ),
        f"{gpu}.attention_bwd_d64_flops_per_s": Constant(
            value=474e12, unit="FLOP/s", source=FA3_BWD_64, note=f"seqlen 16k. {carried}"
        ),
    }


CUDNN_FIGURES = {
    "cudnn_attention_fwd_flops_per_s": (595, CUDNN_FWD, "non-causal, seqlen 16k"),
    "cudnn_attention_fwd_short_flops_per_s": (497, CUDNN_FWD, "non-causal, seqlen 512"),
    "cudnn_attention_fwd_causal_flops_per_s": (539, CUDNN_FWD_CAUSAL, "causal, seqlen 16k (FLOPs halved)"),
    "cudnn_attention_bwd_flops_per_s": (516, CUDNN_BWD, "seqlen 16k"),
    "cudnn_attention_bwd_short_flops_per_s": (305, CUDNN_BWD, "seqlen 512"),
}
"""cuDNN's fused attention on H100, TFLOP/s, from the bars beside FlashAttention-3's in the same
figures (`specs.ATTENTION_KERNELS`: the kernel Transformer Engine runs on Hopper and later unless
told otherwise). Each `cudnn_<q>` quantity pairs with the GPU's own `<q>` (FlashAttention's figure,
H100's being FlashAttention-3's bar in the same panel)."""


def _cudnn_attention(table: dict[str, Constant], gpu: str) -> dict[str, Constant]:
    """The cuDNN attention rows of `gpu`: its FlashAttention figure times cuDNN's / FlashAttention-3's
    on H100 in the same figure (on H100 that is cuDNN's own bar; elsewhere H100's ratio is assumed)."""
    rows = {}
    for quantity, (cudnn_tflops, source, what) in CUDNN_FIGURES.items():
        flash_quantity = quantity.removeprefix("cudnn_")
        h100_fa3 = table[f"h100.{flash_quantity}"].value
        ratio = cudnn_tflops * 1e12 / h100_fa3
        note = what
        if gpu != "h100":
            note += (
                f"; H100's cuDNN / FlashAttention-3 ratio ({cudnn_tflops}/{h100_fa3 / 1e12:.0f}) "
                "times this GPU's flash figure"
            )
        rows[f"{gpu}.{quantity}"] = Constant(
            value=table[f"{gpu}.{flash_quantity}"].value * ratio, unit="FLOP/s", source=source, note=note
        )
    return rows


def _hopper(
    gpu: str, *, datasheet: str, hbm_bytes_per_s: float, capacity_bytes: float, device_mib: int
) -> dict[str, Constant]:
    """H100 SXM and H200 share the GH100 die with 132 SMs and the same tensor-core peaks."""
    rows = {
        f"{gpu}.bf16_flops_per_s": Constant(
            value=989.4e12, unit="FLOP/s", source=datasheet, note="1,979 TFLOPS with sparsity / 2"
        ),
        f"{gpu}.fp16_flops_per_s": Constant(
            value=989.4e12, unit="FLOP/s", source=datasheet, note="1,979 TFLOPS with sparsity / 2"
        ),
        f"{gpu}.tf32_flops_per_s": Constant(
            value=494.7e12, unit="FLOP/s", source=datasheet, note="989 TFLOPS with sparsity / 2"
        ),
        f"{gpu}.fp8_flops_per_s": Constant(
            value=1978.9e12, unit="FLOP/s", source=datasheet, note="3,958 TFLOPS with sparsity / 2"
        ),
        f"{gpu}.hbm_bytes_per_s": Constant(value=hbm_bytes_per_s, unit="bytes/s", source=datasheet),
        f"{gpu}.hbm_capacity_bytes": Constant(value=capacity_bytes, unit="bytes", source=datasheet),
        f"{gpu}.device_memory_bytes": Constant(
            value=device_mib * 2**20, unit="bytes", source=NVML_MEMORY, note=f"{device_mib:,} MiB"
        ),
        f"{gpu}.num_sms": Constant(value=132, unit="count", source=HOPPER_WHITEPAPER),
        f"{gpu}.l2_bytes": Constant(value=50 * 2**20, unit="bytes", source=HOPPER_WHITEPAPER),
        f"{gpu}.mamf_bf16_flops_per_s": Constant(
            value=794.5e12,
            unit="FLOP/s",
            source=MAMF_TABLE,
            note="BF16 row 'NVIDIA H100 SXM' (torch 2.7.0+cu126); the table notes 'H200 is the same'",
        ),
        f"{gpu}.mamf_bf16_m": Constant(value=2048, unit="count", source=MAMF_TABLE, note="best shape M"),
        f"{gpu}.mamf_bf16_n": Constant(value=2048, unit="count", source=MAMF_TABLE, note="best shape N"),
        f"{gpu}.mamf_bf16_k": Constant(value=13312, unit="count", source=MAMF_TABLE, note="best shape K"),
        f"{gpu}.mamf_fp8_flops_per_s": Constant(
            value=1402.6e12 if gpu == "h100" else 1453.4e12,
            unit="FLOP/s",
            source=MAMF_TABLE,
            note=f"FP8 (float8_e4m3fn) row 'NVIDIA {gpu.upper()} SXM'",
        ),
        f"{gpu}.mamf_fp8_m": Constant(
            value=1024 if gpu == "h100" else 1280, unit="count", source=MAMF_TABLE, note="best FP8 shape M"
        ),
        f"{gpu}.mamf_fp8_n": Constant(
            value=9216 if gpu == "h100" else 4096, unit="count", source=MAMF_TABLE, note="best FP8 shape N"
        ),
        f"{gpu}.mamf_fp8_k": Constant(
            value=14336 if gpu == "h100" else 12032, unit="count", source=MAMF_TABLE, note="best FP8 shape K"
        ),
        f"{gpu}.gemm_anchor_ns": Constant(
            value=2 * 256 * 512 * 256 / 11459846994535 * 1e9,
            unit="ns",
            source=XLA_MATMUL_TABLE,
            note="sm_90 entry b=1 m=256 n=512 k=256, bf16: 11.46 TFLOP/s, so 5.86 us; the smallest GEMM "
            "in the table, it fixes the per-tile prologue and epilogue"
            + ("" if gpu == "h100" else "; H100 figure reused (same die)"),
        ),
        f"{gpu}.gemm_anchor_m": Constant(value=256, unit="count", source=XLA_MATMUL_TABLE),
        f"{gpu}.gemm_anchor_n": Constant(value=512, unit="count", source=XLA_MATMUL_TABLE),
        f"{gpu}.gemm_anchor_k": Constant(value=256, unit="count", source=XLA_MATMUL_TABLE),
        f"{gpu}.gemm_short_k_flops_per_s": Constant(
            value=392162828341855,
            unit="FLOP/s",
            source=XLA_MATMUL_TABLE,
            note="sm_90 entry b=1 m=4096 n=4096 k=256, bf16: a short-k GEMM, it fixes the per-tile cost"
            + ("" if gpu == "h100" else "; H100 figure reused (same die)"),
        ),
        f"{gpu}.gemm_short_k_m": Constant(value=4096, unit="count", source=XLA_MATMUL_TABLE),
        f"{gpu}.gemm_short_k_n": Constant(value=4096, unit="count", source=XLA_MATMUL_TABLE),
        f"{gpu}.gemm_short_k_k": Constant(value=256, unit="count", source=XLA_MATMUL_TABLE),
        f"{gpu}.hbm_efficiency": Constant(
            value=0.88, unit="fraction", source=HBM_FORUM, note="A100 measurement, assumed to hold on HBM3/3e"
        ),
        f"{gpu}.unvectorised_fraction": Constant(
            value=6.942723749671131 / 9.108047320041805,
            unit="fraction",
            source=CAST_VECTORISE_H100,
            note="vectorised time / unrolled time of the same cast, at the largest size (launch negligible)"
            + (
                ""
                if gpu == "h100"
                else "; H100 figure reused (same SMs and clocks, faster HBM: likely optimistic)"
            ),
        ),
        f"{gpu}.launch_ns": Constant(value=1000, unit="ns", source=XLA_LAUNCH),
    }
    rows.update(_hopper_attention(gpu))
    return rows


def _a100() -> dict[str, Constant]:
    peak = 312e12
    return {
        "a100.bf16_flops_per_s": Constant(value=peak, unit="FLOP/s", source=A100_DATASHEET, note="dense"),
        "a100.fp16_flops_per_s": Constant(value=peak, unit="FLOP/s", source=A100_DATASHEET, note="dense"),
        "a100.tf32_flops_per_s": Constant(value=156e12, unit="FLOP/s", source=A100_DATASHEET, note="dense"),
        "a100.fp8_flops_per_s": Constant(
            value=0, unit="FLOP/s", source=A100_DATASHEET, note="Ampere has no FP8 tensor cores"
        ),
        "a100.hbm_bytes_per_s": Constant(value=2039e9, unit="bytes/s", source=A100_DATASHEET),
        "a100.hbm_capacity_bytes": Constant(value=80e9, unit="bytes", source=A100_DATASHEET),
        "a100.device_memory_bytes": Constant(
            value=81920 * 2**20, unit="bytes", source=NVML_MEMORY, note="81,920 MiB (A100 80GB)"
        ),
        "a100.num_sms": Constant(value=108, unit="count", source=AMPERE_WHITEPAPER),
        "a100.l2_bytes": Constant(value=40 * 2**20, unit="bytes", source=AMPERE_WHITEPAPER),
        "a100.mamf_bf16_flops_per_s": Constant(
            value=271.2e12,
            unit="FLOP/s",
            source=MAMF_TABLE,
            note="BF16 row 'NVIDIA A100 SXM' (torch 2.6.0+cu126)",
        ),
        "a100.mamf_bf16_m": Constant(value=1024, unit="count", source=MAMF_TABLE, note="best shape M"),
        "a100.mamf_bf16_n": Constant(value=10240, unit="count", source=MAMF_TABLE, note="best shape N"),
        "a100.mamf_bf16_k": Constant(value=5120, unit="count", source=MAMF_TABLE, note="best shape K"),
        "a100.mamf_fp8_flops_per_s": Constant(value=0, unit="FLOP/s", source=A100_DATASHEET, note="no FP8"),
        "a100.mamf_fp8_m": Constant(value=0, unit="count", source=A100_DATASHEET, note="no FP8"),
        "a100.mamf_fp8_n": Constant(value=0, unit="count", source=A100_DATASHEET, note="no FP8"),
        "a100.mamf_fp8_k": Constant(value=0, unit="count", source=A100_DATASHEET, note="no FP8"),
        "a100.gemm_anchor_ns": Constant(
            value=0,
            unit="ns",
            source=XLA_MATMUL_TABLE,
            note="the table has no sm_80 rows: H100's fixed GEMM cost and per-tile cost are reused (assumption)",
        ),
        "a100.gemm_anchor_m": Constant(value=0, unit="count", source=XLA_MATMUL_TABLE, note="unused"),
        "a100.gemm_anchor_n": Constant(value=0, unit="count", source=XLA_MATMUL_TABLE, note="unused"),
        "a100.gemm_anchor_k": Constant(value=0, unit="count", source=XLA_MATMUL_TABLE, note="unused"),
        "a100.gemm_short_k_flops_per_s": Constant(
            value=0,
            unit="FLOP/s",
            source=XLA_MATMUL_TABLE,
            note="no short-k measurement at hand for this GPU: H100's per-tile cost (in units of k) is reused",
        ),
        "a100.gemm_short_k_m": Constant(value=0, unit="count", source=XLA_MATMUL_TABLE, note="unused"),
        "a100.gemm_short_k_n": Constant(value=0, unit="count", source=XLA_MATMUL_TABLE, note="unused"),
        "a100.gemm_short_k_k": Constant(value=0, unit="count", source=XLA_MATMUL_TABLE, note="unused"),
        "a100.attention_fwd_flops_per_s": Constant(
            value=0.73 * peak, unit="FLOP/s", source=FA2_PAPER, note="73 % of 312 TFLOP/s, long sequences"
        ),
        "a100.attention_fwd_short_flops_per_s": Constant(
            value=0.73 * peak * 467 / 648,
            unit="FLOP/s",
            source=f"{FA2_PAPER}; {FA3_FWD}",
            note="no per-sequence figure in text form: FlashAttention-3's 512/16k ratio (467/648) is "
            "assumed for FlashAttention-2 on A100",
        ),
        "a100.attention_fwd_causal_flops_per_s": Constant(
            value=0.73 * peak * 616 / 648,
            unit="FLOP/s",
            source=f"{FA2_PAPER}; {FA3_FWD_CAUSAL}",
            note="FlashAttention-3's causal/non-causal ratio at 16k (616/648) assumed for A100",
        ),
        "a100.attention_bwd_flops_per_s": Constant(
            value=0.63 * peak,
            unit="FLOP/s",
            source=FA2_PAPER,
            note="63 % of 312 TFLOP/s, long sequences; the abstract gives the 50-73 % range, the 63 % "
            "backward figure is Sec. 4.1's as recalled and was not re-read when this row was written",
        ),
        "a100.attention_bwd_short_flops_per_s": Constant(
            value=0.63 * peak * 316 / 561,
            unit="FLOP/s",
            source=f"{FA2_PAPER}; {FA3_BWD}",
            note="FlashAttention-3's backward 512/16k ratio (316/561) assumed for A100",
        ),
        "a100.attention_fwd_d64_flops_per_s": Constant(
            value=0.73 * peak * 497 / 648,
            unit="FLOP/s",
            source=f"{FA2_PAPER}; {FA3_FWD_64}",
            note="FlashAttention-3's head-dim 64/128 forward ratio (497/648) assumed for A100",
        ),
        "a100.attention_bwd_d64_flops_per_s": Constant(
            value=0.63 * peak * 474 / 561,
            unit="FLOP/s",
            source=f"{FA2_PAPER}; {FA3_BWD_64}",
            note="FlashAttention-3's head-dim 64/128 backward ratio (474/561) assumed for A100",
        ),
        "a100.hbm_efficiency": Constant(
            value=0.88, unit="fraction", source=HBM_FORUM, note="1.80 / 2.04 TB/s"
        ),
        "a100.unvectorised_fraction": Constant(
            value=322.09 / 362.46,
            unit="fraction",
            source=CAST_VECTORISE_A100,
            note="vectorised time / unrolled time of the same cast, at the largest size in the table",
        ),
        "a100.launch_ns": Constant(value=1000, unit="ns", source=XLA_LAUNCH),
    }


def _b200() -> dict[str, Constant]:
    ratio = "H100's FlashAttention-3 efficiency (fraction of dense BF16 peak) assumed for Blackwell"
    peak = 2250e12
    return {
        "b200.bf16_flops_per_s": Constant(
            value=peak, unit="FLOP/s", source=B200_DATASHEET, note="36 PFLOPS sparse per 8 GPUs / 8 / 2"
        ),
        "b200.fp16_flops_per_s": Constant(
            value=peak, unit="FLOP/s", source=B200_DATASHEET, note="36 PFLOPS sparse per 8 GPUs / 8 / 2"
        ),
        "b200.tf32_flops_per_s": Constant(
            value=1125e12, unit="FLOP/s", source=B200_DATASHEET, note="18 PFLOPS sparse per 8 GPUs / 8 / 2"
        ),
        "b200.fp8_flops_per_s": Constant(
            value=4500e12, unit="FLOP/s", source=B200_DATASHEET, note="72 PFLOPS sparse per 8 GPUs / 8 / 2"
        ),
        "b200.hbm_bytes_per_s": Constant(
            value=8e12, unit="bytes/s", source=B200_DATASHEET, note="64 TB/s per 8 GPUs / 8"
        ),
        "b200.hbm_capacity_bytes": Constant(
            value=180e9, unit="bytes", source=B200_DATASHEET, note="1,440 GB per 8 GPUs / 8"
        ),
        "b200.device_memory_bytes": Constant(
            value=180e9,
            unit="bytes",
            source=B200_DATASHEET,
            note="the datasheet's 1,440 GB per 8 GPUs / 8: no reported figure at hand",
        ),
        "b200.num_sms": Constant(value=148, unit="count", source=SCALING_BOOK_GPUS),
        "b200.l2_bytes": Constant(value=126e6, unit="bytes", source=BLACKWELL_GUIDE),
        "b200.mamf_bf16_flops_per_s": Constant(
            value=1745.0e12,
            unit="FLOP/s",
            source=MAMF_TABLE,
            note="BF16 row 'NVIDIA B200 SXM' (torch 2.7.1+cu128)",
        ),
        "b200.mamf_bf16_m": Constant(value=1792, unit="count", source=MAMF_TABLE, note="best shape M"),
        "b200.mamf_bf16_n": Constant(value=16128, unit="count", source=MAMF_TABLE, note="best shape N"),
        "b200.mamf_bf16_k": Constant(value=3072, unit="count", source=MAMF_TABLE, note="best shape K"),
        "b200.mamf_fp8_flops_per_s": Constant(
            value=3432.5e12, unit="FLOP/s", source=MAMF_TABLE, note="FP8 row 'NVIDIA B200 SXM'"
        ),
        "b200.mamf_fp8_m": Constant(value=15360, unit="count", source=MAMF_TABLE, note="best FP8 shape M"),
        "b200.mamf_fp8_n": Constant(value=4096, unit="count", source=MAMF_TABLE, note="best FP8 shape N"),
        "b200.mamf_fp8_k": Constant(value=3072, unit="count", source=MAMF_TABLE, note="best FP8 shape K"),
        "b200.gemm_anchor_ns": Constant(
            value=2 * 256 * 256 * 256 / 6765006451612 * 1e9,
            unit="ns",
            source=XLA_MATMUL_TABLE,
            note="sm_100 entry b=1 m=256 n=256 k=256, bf16: 6.77 TFLOP/s, so 4.96 us",
        ),
        "b200.gemm_anchor_m": Constant(value=256, unit="count", source=XLA_MATMUL_TABLE),
        "b200.gemm_anchor_n": Constant(value=256, unit="count", source=XLA_MATMUL_TABLE),
        "b200.gemm_anchor_k": Constant(value=256, unit="count", source=XLA_MATMUL_TABLE),
        "b200.gemm_short_k_flops_per_s": Constant(
            value=0,
            unit="FLOP/s",
            source=XLA_MATMUL_TABLE,
            note="no short-k measurement at hand for this GPU: H100's per-tile cost (in units of k) is reused",
        ),
        "b200.gemm_short_k_m": Constant(value=0, unit="count", source=XLA_MATMUL_TABLE, note="unused"),
        "b200.gemm_short_k_n": Constant(value=0, unit="count", source=XLA_MATMUL_TABLE, note="unused"),
        "b200.gemm_short_k_k": Constant(value=0, unit="count", source=XLA_MATMUL_TABLE, note="unused"),
        "b200.attention_fwd_flops_per_s": Constant(
            value=peak * 648 / 989.4, unit="FLOP/s", source=FA3_FWD, note=ratio
        ),
        "b200.attention_fwd_short_flops_per_s": Constant(
            value=peak * 467 / 989.4, unit="FLOP/s", source=FA3_FWD, note=ratio
        ),
        "b200.attention_fwd_causal_flops_per_s": Constant(
            value=peak * 616 / 989.4, unit="FLOP/s", source=FA3_FWD_CAUSAL, note=ratio
        ),
        "b200.attention_bwd_flops_per_s": Constant(
            value=peak * 561 / 989.4, unit="FLOP/s", source=FA3_BWD, note=ratio
        ),
        "b200.attention_bwd_short_flops_per_s": Constant(
            value=peak * 316 / 989.4, unit="FLOP/s", source=FA3_BWD, note=ratio
        ),
        "b200.attention_fwd_d64_flops_per_s": Constant(
            value=peak * 497 / 989.4, unit="FLOP/s", source=FA3_FWD_64, note=ratio
        ),
        "b200.attention_bwd_d64_flops_per_s": Constant(
            value=peak * 474 / 989.4, unit="FLOP/s", source=FA3_BWD_64, note=ratio
        ),
        "b200.hbm_efficiency": Constant(
            value=0.88, unit="fraction", source=HBM_FORUM, note="A100 measurement, assumed to hold on HBM3e"
        ),
        "b200.unvectorised_fraction": Constant(
            value=6.942723749671131 / 9.108047320041805,
            unit="fraction",
            source=CAST_VECTORISE_H100,
            note="H100 figure assumed for B200 (no B200 figure at hand)",
        ),
        "b200.launch_ns": Constant(value=1000, unit="ns", source=XLA_LAUNCH),
    }


def _overlap() -> dict[str, Constant]:
    """How much slower compute runs while a communication kernel shares the GPU (sim/contention.py).
    One figure for every GPU: the paper's average over its GPUs, models and precisions is the figure
    at hand (its per-GPU panels were not), so it is not resolved by GPU."""
    measured = "average over the paper's GPUs (A100 and H100 among them), models and precisions"
    carried = "not measured on this GPU: the paper's average over A100, H100 and AMD GPUs is assumed"
    return {
        f"{gpu}.comm_overlap_compute_slowdown": Constant(
            value=0.189,
            unit="fraction",
            source=OVERLAP_PAPER,
            note=measured if gpu in ("a100", "h100") else carried,
        )
        for gpu in ("a100", "b200", "h100", "h200")
    }


SWIGLU_TOKENS = 2048 * 4
SWIGLU_FFN = 32768
"""The figure's shape: tokens of the [2048, 4, 2 x ffn_local] input, and ffn_local (the largest)."""
SWIGLU_FWD_S = 0.8584960103034973e-3
SWIGLU_FULL_S = 5.084127902984619e-3
"""The figure: forward alone, and forward + y.sum().backward() ('full'), seconds."""


def _jit_activation(table: dict[str, Constant]) -> dict[str, Constant]:
    """The bias + activation kernels of Megatron's `@jit_fuser` (bias_swiglu_impl, bias_gelu_impl) as a
    fraction of peak HBM bandwidth, in `fused.activation_time`'s own byte count (forward: read the FC1
    output and bias, write the activation; backward: read the gradient and the FC1 output, write its
    gradient). Read from SwiGLU's figure at its largest size (the only Megatron activation measured);
    the backward is 'full' less the forward and the benchmark's `y.sum()` (one read of the output at
    the achievable bandwidth, as ops.py charges it), less one launch each. That backward's gradient
    was the sum's, an expanded scalar its kernel did not read; the count includes it anyway, so that a
    run's backward is charged the figure's time per element (fused.activation_time)."""
    peak = table["h100.hbm_bytes_per_s"].value
    achievable = peak * table["h100.hbm_efficiency"].value
    launch_s = table["h100.launch_ns"].value * 1e-9
    e, t, f = 2, SWIGLU_TOKENS, SWIGLU_FFN
    fwd_bytes = t * 2 * f * e + 2 * f * e + t * f * e
    bwd_bytes = t * f * e + 2 * t * 2 * f * e
    sum_s = launch_s + (t * f * e + e) / achievable
    fwd = fwd_bytes / ((SWIGLU_FWD_S - launch_s) * peak)
    bwd = bwd_bytes / ((SWIGLU_FULL_S - SWIGLU_FWD_S - sum_s - launch_s) * peak)
    arithmetic = (
        f"tokens {t}, ffn_local {f}: forward {fwd_bytes} B in {SWIGLU_FWD_S * 1e3:.4f} ms; backward "
        f"{bwd_bytes} B in full {SWIGLU_FULL_S * 1e3:.4f} - forward - sum {sum_s * 1e3:.4f} ms; over H100's "
        f"{peak / 1e12:g} TB/s, less {launch_s * 1e6:g} us launch"
    )
    out = {}
    for gpu in ("a100", "b200", "h100", "h200"):
        note = arithmetic + (
            "" if gpu == "h100" else "; H100 fraction assumed for this GPU (no figure for it at hand)"
        )
        note += (
            "; bias + GeLU (bias_gelu_impl) is assumed to reach SwiGLU's fractions (the same @jit_fuser "
            "mechanism, not measured)"
        )
        out[f"{gpu}.jit_activation_fwd_fraction"] = Constant(
            value=fwd, unit="fraction", source=LIGER_MEGATRON_SWIGLU, note=note
        )
        out[f"{gpu}.jit_activation_bwd_fraction"] = Constant(
            value=bwd, unit="fraction", source=LIGER_MEGATRON_SWIGLU, note=note
        )
    return out


def _table() -> dict[str, Constant]:
    table = {
        **_overlap(),
        **_a100(),
        **_b200(),
        **_hopper(
            "h100", datasheet=H100_DATASHEET, hbm_bytes_per_s=3.35e12, capacity_bytes=80e9, device_mib=81559
        ),
        **_hopper(
            "h200", datasheet=H200_DATASHEET, hbm_bytes_per_s=4.8e12, capacity_bytes=141e9, device_mib=143771
        ),
    }
    for gpu in ("a100", "b200", "h100", "h200"):
        table.update(_cudnn_attention(table, gpu))
    table.update(_jit_activation(table))
    return table


CONSTANTS: dict[str, Constant] = _table()
"""The one table. Read it through `value(gpu, quantity)` or `specs.gpu_spec`."""


def value(gpu: str, quantity: str) -> float:
    """The constant `<gpu>.<quantity>`; KeyError names the missing key."""
    return CONSTANTS[f"{gpu}.{quantity}"].value
