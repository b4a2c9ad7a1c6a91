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

`causal=False` counts the q s term over the whole s x s matrix (2 q s): Megatron-LM's formula did so
until early 2025 (`12 B s L h^2 (1 + g/a + s/h + ...)` at commit f2e5db402c of 2024-07-15, which
published the README's H100 performance table; the halving is in by mid-2025), and so does PaLM's
MFU (Chowdhery et al. 2022, appendix B: 6N + 12 L H Q T per token). A throughput published under
that count is compared with the same count, never with this module's default.
"""

from __future__ import annotations

from prism_megatron.target import ModelShape


def model_flops_per_iteration(shape: ModelShape, global_batch_size: int, *, causal: bool = True) -> float:
    """FLOPs of one iteration over `global_batch_size` sequences (see the module docstring); `shape`
    is the target job's (`prism_megatron.target.ModelShape`). `causal=False` counts the attention
    scores whole, as Megatron-LM did until 2025 and PaLM's MFU does.

    Raises:
        ValueError: a size the formula needs is not given (names the flags), or a batch below 1.
    """
    if global_batch_size < 1:
        raise ValueError(f"--global-batch-size must be >= 1, got {global_batch_size}")
    missing = shape.missing(
        "num_layers", "hidden_size", "num_attention_heads", "seq_length", "padded_vocab_size"
    )
    if missing:
        raise ValueError(f"the model FLOPs need {', '.join(missing)}")
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
    attention = layers * (h * (q + 2 * kv) + q * s * (1 if causal else 2) + q * h)
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
