"""The modelled GPUs: one frozen GpuSpec per name, read from the constants table."""

from __future__ import annotations

import dataclasses
import functools

import torch

from prism_megatron.gpu_model.constants import GPU_QUANTITIES, value

GPU_NAMES: tuple[str, ...] = ("a100", "b200", "h100", "h200")
"""The names `--prism-device model:<gpu>` accepts."""

ATTENTION_KERNELS: dict[str, str] = {
    "flash": "FlashAttention",
    "cudnn": "cuDNN fused attention",
}
"""The attention kernels the model prices, by the names `GpuSpec.with_attention_kernel` takes: the
GPU's own `attention_*` figures are FlashAttention's curve (FlashAttention-3's, FlashAttention-2's on
A100: `attention_kernel_name`); the `cudnn_attention_*` figures are cuDNN's, the kernel Transformer
Engine runs on Hopper and later when both are available (its attention backend selection gives
FusedAttention preference there)."""


def attention_kernel_name(gpu: str, kernel: str) -> str:
    """How a report names `kernel` on `gpu`: the FlashAttention version whose figures time it."""
    if kernel == "flash":
        return "FlashAttention-2" if gpu == "a100" else "FlashAttention-3"
    return ATTENTION_KERNELS.get(kernel, kernel)


DISPLAY_NAMES = {"a100": "A100 80GB SXM", "b200": "B200", "h100": "H100 SXM", "h200": "H200 SXM"}


@dataclasses.dataclass(frozen=True, kw_only=True)
class GpuSpec:
    """One GPU as the model sees it. Every field but the names is a row of the constants table."""

    name: str
    """Short name, one of GPU_NAMES."""
    display_name: str
    """Name for reports ("H100 SXM")."""
    bf16_flops_per_s: float
    """Dense BF16 tensor-core peak."""
    fp16_flops_per_s: float
    """Dense FP16 tensor-core peak (FP32 accumulate)."""
    tf32_flops_per_s: float
    """Dense TF32 tensor-core peak; FP32 matmuls are charged at it (see gemm.py)."""
    fp8_flops_per_s: float
    """Dense FP8 tensor-core peak; 0 where the GPU has none (A100)."""
    hbm_bytes_per_s: float
    """Peak HBM bandwidth."""
    hbm_capacity_bytes: float
    """HBM capacity (the datasheet's rounded figure)."""
    device_memory_bytes: float
    """The memory the GPU reports (NVML): what a run can use, less the CUDA context's and the
    allocator's share."""
    num_sms: int
    """Streaming multiprocessors: the unit of tile and wave quantisation."""
    l2_bytes: float
    """L2 cache size (reported; not yet used by a formula)."""
    mamf_bf16_flops_per_s: float
    """Best measured BF16 matmul throughput (MAMF) and, below, the shape it was measured at."""
    mamf_bf16_m: int
    mamf_bf16_n: int
    mamf_bf16_k: int
    mamf_fp8_flops_per_s: float
    """Best measured FP8 matmul throughput and its shape; 0 where the GPU has no FP8."""
    mamf_fp8_m: int
    mamf_fp8_n: int
    mamf_fp8_k: int
    gemm_anchor_ns: float
    """Measured time of a small GEMM (shape below): fixes the per-tile prologue and epilogue."""
    gemm_anchor_m: int
    gemm_anchor_n: int
    gemm_anchor_k: int
    gemm_short_k_flops_per_s: float
    """Measured throughput of a large short-k GEMM (shape below), or 0 where none is at hand."""
    gemm_short_k_m: int
    gemm_short_k_n: int
    gemm_short_k_k: int
    attention_fwd_flops_per_s: float
    """Flash-attention forward throughput, head dim 128, non-causal, long sequence (16k)."""
    attention_fwd_short_flops_per_s: float
    """The same at sequence 512 (batch 32): fixes the per-block overhead."""
    attention_fwd_causal_flops_per_s: float
    """The forward at sequence 16k with the causal mask (FLOPs halved): the mask's own cost."""
    attention_bwd_flops_per_s: float
    """Flash-attention backward throughput, head dim 128, sequence 16k."""
    attention_bwd_short_flops_per_s: float
    """The same at sequence 512."""
    attention_fwd_d64_flops_per_s: float
    """Forward throughput at head dim 64, sequence 16k, non-causal: the head-dimension dependence."""
    attention_bwd_d64_flops_per_s: float
    """Backward throughput at head dim 64, sequence 16k: the head-dimension dependence."""
    cudnn_attention_fwd_flops_per_s: float
    """cuDNN's fused attention, the same five figures as `attention_*` above (head dim 128):
    forward at 16k, at 512 and causal at 16k, backward at 16k and at 512."""
    cudnn_attention_fwd_short_flops_per_s: float
    cudnn_attention_fwd_causal_flops_per_s: float
    cudnn_attention_bwd_flops_per_s: float
    cudnn_attention_bwd_short_flops_per_s: float
    hbm_efficiency: float
    """Fraction of peak HBM bandwidth a streaming kernel achieves."""
    unvectorised_fraction: float
    """Fraction of that bandwidth an elementwise kernel reaches where ATen cannot vectorise it (mixed
    dtypes that need a cast per element, broadcast or strided operands: ops.py)."""
    launch_ns: float
    """Fixed cost every kernel pays on the device timeline."""
    comm_overlap_compute_slowdown: float
    """Fraction by which compute slows while a communication kernel runs beside it (the simulation's
    contention term, `sim/contention.py`)."""
    jit_activation_fwd_fraction: float
    """Fraction of peak HBM bandwidth Megatron's jit-fused bias + activation reaches, forward
    (`fused.activation_time`'s byte count)."""
    jit_activation_bwd_fraction: float
    """The same, backward."""
    attention_kernel: str = "flash"
    """Which kernel the `attention_*` figures describe (a key of ATTENTION_KERNELS): attention.py
    times attention from them, so `with_attention_kernel` swaps the figures, not the formula."""

    def __post_init__(self) -> None:
        if self.name not in GPU_NAMES:
            raise ValueError(f"GpuSpec.name {self.name!r} is not one of {', '.join(GPU_NAMES)}")
        if self.num_sms <= 0 or self.hbm_bytes_per_s <= 0 or self.bf16_flops_per_s <= 0:
            raise ValueError(
                f"GpuSpec {self.name}: num_sms, hbm_bytes_per_s and bf16_flops_per_s must be > 0"
            )

    def with_attention_kernel(self, kernel: str) -> GpuSpec:
        """This GPU with attention timed as `kernel` (a key of ATTENTION_KERNELS) runs it.

        For cuDNN the five calibrating figures are cuDNN's own (on other GPUs than H100, H100's
        cuDNN / FlashAttention-3 ratio times the GPU's flash figure); its head-dim-64 figures are not
        at hand, so the flash head-dim 64/128 ratios are assumed for it.

        Raises:
            ValueError: `kernel` is not a key of ATTENTION_KERNELS.
        """
        if kernel not in ATTENTION_KERNELS:
            raise ValueError(
                f"attention kernel {kernel!r}: the GPU model prices {', '.join(ATTENTION_KERNELS)}"
            )
        base = gpu_spec(self.name)
        if kernel == "flash":
            return base
        return dataclasses.replace(
            base,
            attention_kernel=kernel,
            attention_fwd_flops_per_s=base.cudnn_attention_fwd_flops_per_s,
            attention_fwd_short_flops_per_s=base.cudnn_attention_fwd_short_flops_per_s,
            attention_fwd_causal_flops_per_s=base.cudnn_attention_fwd_causal_flops_per_s,
            attention_bwd_flops_per_s=base.cudnn_attention_bwd_flops_per_s,
            attention_bwd_short_flops_per_s=base.cudnn_attention_bwd_short_flops_per_s,
            attention_fwd_d64_flops_per_s=base.attention_fwd_d64_flops_per_s
            * base.cudnn_attention_fwd_flops_per_s
            / base.attention_fwd_flops_per_s,
            attention_bwd_d64_flops_per_s=base.attention_bwd_d64_flops_per_s
            * base.cudnn_attention_bwd_flops_per_s
            / base.attention_bwd_flops_per_s,
        )

    @property
    def achievable_hbm_bytes_per_s(self) -> float:
        return self.hbm_bytes_per_s * self.hbm_efficiency

    def peak_flops_per_s(self, dtype: torch.dtype = torch.bfloat16) -> float:
        """Dense tensor-core peak for `dtype` (the MFU denominator): FP32 counts at TF32, FP8 at FP8."""
        if dtype in (torch.float32, torch.float64):
            return self.tf32_flops_per_s
        if dtype == torch.float16:
            return self.fp16_flops_per_s
        if "float8" in str(dtype):
            return self.fp8_flops_per_s
        return self.bf16_flops_per_s


_INTEGER_FIELDS = (
    {"num_sms"}
    | {f"mamf_{t}_{d}" for t in ("bf16", "fp8") for d in "mnk"}
    | {f"gemm_{a}_{d}" for a in ("anchor", "short_k") for d in "mnk"}
)


@functools.cache
def gpu_spec(name: str) -> GpuSpec:
    """The GpuSpec of `name` (case-insensitive).

    Raises:
        ValueError: `name` is not a modelled GPU; the message lists the valid names.
    """
    key = str(name).strip().lower()
    if key not in GPU_NAMES:
        raise ValueError(f"unknown GPU {name!r} for the GPU model: valid names are {', '.join(GPU_NAMES)}")
    fields = {q: value(key, q) for q in GPU_QUANTITIES}
    fields = {q: int(v) if q in _INTEGER_FIELDS else float(v) for q, v in fields.items()}
    return GpuSpec(name=key, display_name=DISPLAY_NAMES[key], **fields)
