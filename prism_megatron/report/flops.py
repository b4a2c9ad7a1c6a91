"""Model FLOPs of one training iteration of a GPT model, for `tflops_per_gpu`.

The count is a formula of the model's shape, not a measurement, so it lives here beside the report
and the orchestrator turns it into throughput with the measured iteration time:
`tflops_per_gpu = model_flops_per_iteration / (iteration_time_s * world_size) / 1e12`.

The formula is Megatron-LM's own (`num_floating_point_operations` in megatron/training/training.py,
tag core_v0.16.1, the standard-transformer branch), which extends Narayanan et al. 2021 ("Efficient
Large-Scale Language Model Training on GPU Clusters Using Megatron-LM", eq. 3) for grouped-query
attention, SwiGLU and mixture-of-experts. With B sequences of s tokens per iteration, hidden size h,
L layers, padded vocabulary V:

    F = 6 B s [ h f (F_dense L_dense + F_moe k L_moe + F_shared L_moe)        (MLP)
              + L (h (q + 2 kv) + q s + q h)                                 (attention)
              + h V ]                                                        (logits)

* 6 = 3 GEMMs per weight (forward, weight gradient, data gradient) x 2 FLOPs per multiply-add;
* f = 3 with SwiGLU (the h -> 2 F up-projection and the F -> h down-projection), else 2;
* q = kv_channels x heads, kv = kv_channels x query groups (GQA; groups = heads without it);
* the q s term is QK^T and (QK^T)V, each counted over half the s x s scores (causal mask);
* k experts per token (`--moe-router-topk`) in the L_moe MoE layers (`--moe-layer-freq`).

With MHA, F_dense = 4h and no MoE this is 72 B s L h^2 (1 + s/(12h) + V/(12 L h)): eq. 3 of the
paper without activation recomputation (model FLOPs, not hardware FLOPs) and with causal attention
counted half. Not covered: multi-latent attention, multi-token prediction, linear attention, hybrid
Mamba models.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelShape:
    """The GPT model's shape as Megatron's flags give it."""

    num_layers: int
    hidden_size: int
    num_attention_heads: int
    seq_length: int
    padded_vocab_size: int
    """The vocabulary after Megatron pads it (`padded_vocab_size`)."""
    ffn_hidden_size: int | None = None
    """Default 4 x hidden_size, as Megatron's."""
    num_query_groups: int | None = None
    """GQA groups; None for multi-head attention (one group per head)."""
    kv_channels: int | None = None
    """Default hidden_size / num_attention_heads."""
    swiglu: bool = False
    num_experts: int | None = None
    moe_router_topk: int = 2
    moe_ffn_hidden_size: int | None = None
    """Default ffn_hidden_size."""
    moe_shared_expert_intermediate_size: int | None = None
    moe_layer_freq: int | Sequence[int] = 1
    """Every k-th layer is MoE (layer i when i % k == 0), or a 0/1 pattern per layer."""

    def __post_init__(self) -> None:
        sizes = (self.num_layers, self.hidden_size, self.num_attention_heads, self.seq_length)
        if min(*sizes, self.padded_vocab_size) < 1:
            raise ValueError(
                f"model sizes must be positive: num_layers={self.num_layers}, hidden_size={self.hidden_size}, "
                f"num_attention_heads={self.num_attention_heads}, seq_length={self.seq_length}, "
                f"padded_vocab_size={self.padded_vocab_size}"
            )
        pattern = self.moe_layer_freq
        if not isinstance(pattern, int) and len(pattern) != self.num_layers:
            raise ValueError(
                f"--moe-layer-freq pattern has {len(pattern)} entries but --num-layers is {self.num_layers}"
            )

    @classmethod
    def from_args(cls, args: Any) -> ModelShape:
        """From a parsed Megatron argument namespace (attributes named as Megatron's flags' dests)."""
        vocab = getattr(args, "padded_vocab_size", None) or args.vocab_size
        return cls(
            num_layers=args.num_layers,
            hidden_size=args.hidden_size,
            num_attention_heads=args.num_attention_heads,
            seq_length=args.seq_length,
            padded_vocab_size=vocab,
            ffn_hidden_size=getattr(args, "ffn_hidden_size", None),
            num_query_groups=args.num_query_groups if getattr(args, "group_query_attention", False) else None,
            kv_channels=getattr(args, "kv_channels", None),
            swiglu=bool(getattr(args, "swiglu", False)),
            num_experts=getattr(args, "num_experts", None),
            moe_router_topk=getattr(args, "moe_router_topk", 2),
            moe_ffn_hidden_size=getattr(args, "moe_ffn_hidden_size", None),
            moe_shared_expert_intermediate_size=getattr(args, "moe_shared_expert_intermediate_size", None),
            moe_layer_freq=getattr(args, "moe_layer_freq", 1),
        )

    def num_moe_layers(self) -> int:
        if self.num_experts is None:
            return 0
        if isinstance(self.moe_layer_freq, int):
            return math.ceil(self.num_layers / self.moe_layer_freq)
        return sum(1 for flag in self.moe_layer_freq if flag)


def model_flops_per_iteration(shape: ModelShape, global_batch_size: int) -> float:
    """FLOPs of one iteration over `global_batch_size` sequences (see the module docstring)."""
    if global_batch_size < 1:
        raise ValueError(f"--global-batch-size must be >= 1, got {global_batch_size}")
    h, s, layers = shape.hidden_size, shape.seq_length, shape.num_layers
    ffn = shape.ffn_hidden_size or 4 * h
    kv_channels = shape.kv_channels or h // shape.num_attention_heads
    q = kv_channels * shape.num_attention_heads
    kv = kv_channels * (shape.num_query_groups or shape.num_attention_heads)
    f = 3 if shape.swiglu else 2
    moe_layers = shape.num_moe_layers()
    dense_layers = layers - moe_layers
    routed = (shape.moe_ffn_hidden_size or ffn) * shape.moe_router_topk
    shared = shape.moe_shared_expert_intermediate_size or 0
    mlp = h * f * (ffn * dense_layers + (routed + shared) * moe_layers)
    attention = layers * (h * (q + 2 * kv) + q * s + q * h)
    logits = h * shape.padded_vocab_size
    return 6.0 * global_batch_size * s * (mlp + attention + logits)


def tflops_per_gpu(flops_per_iteration: float, iteration_time_s: float, world_size: int) -> float:
    """Model TFLOP/s each GPU of the target job achieves at this iteration time."""
    if iteration_time_s <= 0 or world_size < 1:
        raise ValueError(
            f"need a positive iteration time and world size, got {iteration_time_s} s and W={world_size}"
        )
    return flops_per_iteration / (iteration_time_s * world_size) / 1e12


def tokens_per_s_per_gpu(
    global_batch_size: int, seq_length: int, iteration_time_s: float, world_size: int
) -> float:
    """Tokens each GPU of the target job processes per second: B s / (t W)."""
    if iteration_time_s <= 0 or world_size < 1:
        raise ValueError(
            f"need a positive iteration time and world size, got {iteration_time_s} s and W={world_size}"
        )
    return global_batch_size * seq_length / (iteration_time_s * world_size)


def padded_vocab_size(vocab_size: int, *, tp: int, divisible_by: int = 128) -> int:
    """Megatron's padding: the vocabulary rounded up to a multiple of divisible_by x tp."""
    multiple = divisible_by * tp
    return -(-vocab_size // multiple) * multiple
