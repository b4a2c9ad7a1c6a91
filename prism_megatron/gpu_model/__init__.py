"""The GPU performance model: device time of every aten op on a modelled A100, H100, H200 or B200.

A modelled run executes the real training program on fake tensors on a CPU; `ModelledTiming`
charges each op it dispatches to a `ModelledClock` with the time `op_time` gives it on the chosen
GPU. Kernel time per kind:

- GEMM by shape (gemm.py): output tiles, waves over the SMs, per-tile cost, split-k, memory roof;
- attention by the flash-attention algorithm (attention.py): query/key blocks over the SMs, causal
  mask by block, forward and backward;
- memory-bound ops (ops.py): bytes read and written over the achievable HBM bandwidth;
- a launch cost per kernel.

Every constant is in constants.py with its public source; none is fitted to an end-to-end training
result (those are the test set: benchmarks/published/). benchmarks/published/kernels.py holds the
GEMM and attention formulas against the kernel measurements they were built from, shape by shape.

Fused Transformer Engine kernels. On a GPU, Megatron with Transformer Engine runs fused kernels
where the program on a CPU runs several unfused aten ops. The modelled capture charges those fused
kernels through `fused.py`, which prices each as one memory-bound kernel over the bytes the fused
kernel reads and writes (one launch): fused RMSNorm/LayerNorm (forward and backward), bias+GeLU and
SwiGLU, fused RoPE, fused softmax / cross-entropy, and the multi-tensor fused Adam step. Attention
through TE's fused attention is charged by `attention_time`, the flash-attention cost, with the
figures of the kernel the run takes (`GpuSpec.with_attention_kernel`: FlashAttention-3's or cuDNN's).
"""

from prism_megatron.gpu_model.attention import attention_time
from prism_megatron.gpu_model.clock import ModelledClock, ModelledTiming
from prism_megatron.gpu_model.gemm import gemm_time
from prism_megatron.gpu_model.ops import KINDS, OpTime, op_time
from prism_megatron.gpu_model.specs import GPU_NAMES, GpuSpec, gpu_spec

__all__ = [
    "GPU_NAMES",
    "KINDS",
    "GpuSpec",
    "ModelledClock",
    "ModelledTiming",
    "OpTime",
    "attention_time",
    "gemm_time",
    "gpu_spec",
    "op_time",
]
