"""Fused kernels a GPU run has where the program on a CPU runs unfused aten ops.

Transformer Engine and Megatron fuse the memory-bound parts of a layer into single kernels. Each
function here prices one such kernel as one launch plus the bytes it reads and writes over the
achievable HBM bandwidth: the fused kernel reads its inputs and writes its outputs once, which is
the whole point of fusing it. The exception is Megatron's jit-fused bias + activation, whose bytes
move at the lower fractions of peak bandwidth its published H100 figure reaches (`activation_time`);
the jit-fused bias + dropout + add has no figure at hand and stays at the streaming bandwidth. The
modelled capture runs the unfused ops inside `ModelledClock.uncharged()` and charges the fused kernel
with `ModelledClock.advance(t, "memory")` instead.

Byte counts per call (e = element size of `dtype`, t = tokens):

- norm (RMSNorm or LayerNorm), forward: read x (t*h*e) and the weight(s), write y (t*h*e) and the
  FP32 per-token statistics; backward: read dy, x, weight and statistics, write dx and the FP32
  weight-gradient partials (one row per SM, summed in a second tiny pass, not charged).
- bias + activation (GeLU) or SwiGLU, forward: read the FC1 output (t*f*e, 2*t*f*e when gated) and
  the bias, write the activation (t*f*e); backward: read dy and the saved input, write dx. These are
  Megatron's `@jit_fuser` functions, not one streaming kernel: their bytes move at the fractions of
  peak bandwidth SwiGLU's published H100 figure reaches (`activation_time`).
- fused RoPE, forward or backward: read and write q and k (t*heads*d*e each).
- softmax cross-entropy over the vocabulary, forward: read the logits once, write per-token loss and
  statistics; backward: read logits and statistics, write the logit gradients.
- Adam step (multi-tensor apply, distributed optimizer's shard): per parameter read the FP32 main
  weight, FP32 gradient and the two FP32 moments, write the weight and moments and the BF16 copy:
  16 + 12 + 2 = 30 bytes; 28 without the copy (`with_model_copy=False`: Megatron's optimizer
  copies the main weights to the BF16 model weights in kernels of its own after the step).
- bias + dropout + residual add, forward: read x, the bias and the residual, write the output and,
  with dropout, its one-byte mask; backward: read dy (and the mask), write dx (none at all without
  dropout and bias: the gradient passes through the additions unchanged).
- gradient accumulation fusion: the weight-gradient GEMM accumulates into the FP32 main gradient
  (`wgrad_accumulate_time`): the GEMM's memory roof reads and writes C in FP32; no other kernel.
"""

from __future__ import annotations

import torch

from prism_megatron.gpu_model.gemm import gemm_time
from prism_megatron.gpu_model.specs import GpuSpec

FP32_BYTES = 4
ADAM_BYTES_PER_PARAM = 4 * FP32_BYTES + 3 * FP32_BYTES + 2
MODEL_COPY_BYTES = 2
"""The BF16 copy of a weight that ADAM_BYTES_PER_PARAM counts as written by the step."""
DROPOUT_MASK_BYTES = 1


def memory_kernel_time(gpu: GpuSpec, num_bytes: int) -> int:
    """One memory-bound kernel moving `num_bytes` through HBM, in ns."""
    if num_bytes < 0:
        raise ValueError(f"memory_kernel_time: num_bytes must be >= 0, got {num_bytes}")
    return round(gpu.launch_ns + num_bytes / gpu.achievable_hbm_bytes_per_s * 1e9)


def norm_bytes(
    *, tokens: int, hidden: int, dtype: torch.dtype, backward: bool, layer_norm: bool = False
) -> int:
    e = dtype.itemsize
    weights = (2 if layer_norm else 1) * hidden * e
    stats = (2 if layer_norm else 1) * tokens * FP32_BYTES
    if not backward:
        return tokens * hidden * e * 2 + weights + stats
    return tokens * hidden * e * 3 + weights + stats


def norm_time(
    gpu: GpuSpec, *, tokens: int, hidden: int, dtype: torch.dtype, backward: bool, layer_norm: bool = False
) -> int:
    """Fused RMSNorm (or LayerNorm) forward or backward, in ns."""
    return memory_kernel_time(
        gpu, norm_bytes(tokens=tokens, hidden=hidden, dtype=dtype, backward=backward, layer_norm=layer_norm)
    )


def activation_bytes(*, tokens: int, ffn_hidden: int, dtype: torch.dtype, gated: bool, backward: bool) -> int:
    """What `activation_time` counts as moved: forward reads the FC1 output and bias and writes the
    activation; backward reads the gradient and the FC1 output and writes the FC1 output's gradient."""
    e = dtype.itemsize
    width_in = ffn_hidden * (2 if gated else 1)
    if not backward:
        return tokens * width_in * e + width_in * e + tokens * ffn_hidden * e
    return tokens * ffn_hidden * e + tokens * width_in * e * 2


def activation_time(
    gpu: GpuSpec, *, tokens: int, ffn_hidden: int, dtype: torch.dtype, gated: bool, backward: bool
) -> int:
    """Megatron's jit-fused bias+GeLU (gated=False) or SwiGLU (gated=True), forward or backward, in ns.

    `ffn_hidden` is the activation's width (the FC2 input), per tensor-parallel rank. Unlike the other
    kernels here it is not priced at the achievable streaming bandwidth: Megatron compiles these
    functions with `@jit_fuser`, and SwiGLU's published H100 figure (constants.LIGER_MEGATRON_SWIGLU)
    reaches 56 % of peak HBM bandwidth forward and 20 % backward in this byte count, which
    `GpuSpec.jit_activation_*_fraction` carry (GeLU is assumed to reach the same). The benchmark's
    backward took the gradient of `y.sum()`, an expanded scalar its kernel did not read, so the
    backward fraction is as much a time per element as a bandwidth: a run's backward, whose gradient
    is a whole tensor, is charged the figure's time per element of the activation (at a fifth of peak
    the kernel is not bandwidth-bound, and the extra read is assumed to cost nothing beyond it).
    """
    moved = activation_bytes(
        tokens=tokens, ffn_hidden=ffn_hidden, dtype=dtype, gated=gated, backward=backward
    )
    fraction = gpu.jit_activation_bwd_fraction if backward else gpu.jit_activation_fwd_fraction
    return round(gpu.launch_ns + moved / (gpu.hbm_bytes_per_s * fraction) * 1e9)


def rope_time(
    gpu: GpuSpec, *, tokens: int, heads: int, kv_heads: int, head_dim: int, dtype: torch.dtype
) -> int:
    """Fused rotary embedding of q and k (forward and backward cost the same), in ns."""
    e = dtype.itemsize
    return memory_kernel_time(gpu, 2 * tokens * (heads + kv_heads) * head_dim * e)


def cross_entropy_time(gpu: GpuSpec, *, tokens: int, vocab: int, dtype: torch.dtype, backward: bool) -> int:
    """Fused (vocab-parallel) softmax cross-entropy forward or backward, `vocab` per rank, in ns."""
    e = dtype.itemsize
    if not backward:
        moved = tokens * vocab * e + 3 * tokens * FP32_BYTES
    else:
        moved = 2 * tokens * vocab * e + 3 * tokens * FP32_BYTES
    return memory_kernel_time(gpu, moved)


def adam_step_time(gpu: GpuSpec, *, num_params: int, with_model_copy: bool = True) -> int:
    """Fused Adam over `num_params` parameters (this rank's optimizer shard), in ns; without
    `with_model_copy` the step does not write the BF16 copy of the weights."""
    per_param = ADAM_BYTES_PER_PARAM - (0 if with_model_copy else MODEL_COPY_BYTES)
    return memory_kernel_time(gpu, num_params * per_param)


def bias_dropout_add_time(
    gpu: GpuSpec, *, tokens: int, hidden: int, dtype: torch.dtype, bias: bool, dropout: bool, backward: bool
) -> int:
    """Fused bias + dropout + residual add (Megatron's jit-fused `bias_dropout_add`), in ns."""
    e = dtype.itemsize
    activations = tokens * hidden
    mask = activations * DROPOUT_MASK_BYTES if dropout else 0
    if not backward:
        return memory_kernel_time(gpu, 3 * activations * e + (hidden * e if bias else 0) + mask)
    if not (dropout or bias):
        return 0
    return memory_kernel_time(gpu, 2 * activations * e + mask)


def wgrad_accumulate_time(gpu: GpuSpec, *, m: int, n: int, k: int, dtype: torch.dtype) -> int:
    """The weight-gradient GEMM (m x k) @ (k x n) accumulating into an FP32 main gradient, in ns
    (Megatron's gradient accumulation fusion: C = A B + C with C in FP32)."""
    return gemm_time(gpu, m, n, k, dtype, accumulate_fp32=True)
