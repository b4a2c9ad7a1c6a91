"""The attention kernel of a modelled GPU: one fused scaled-dot-product attention, as on a GPU.

On a GPU, Megatron's Transformer Engine layers run attention as one fused kernel (flash attention or
cuDNN's fused attention): the [s, s] score matrix never reaches memory. megatron-core's local
`DotProductAttention` computes it unfused (a batched GEMM, a masked softmax over [b, h, s, s], a
second GEMM), which a GPU model would time as two GEMMs and a memory-bound softmax over the whole
score matrix: at sequence 8192 that is several times the fused kernel's time. On a modelled device
(`--prism-device model:<gpu>`) the built-in entry's spec puts `FlashAttention` in its place, unless
`--attention-backend` is unfused or local (`materialises_scores`: Transformer Engine's unfused
attention holds the scores on a GPU too, and the local kernel's own ops are what it runs):
`torch.nn.functional.scaled_dot_product_attention`, the same maths (causal mask, grouped query
attention, softmax scale, attention dropout) as one op the GPU model times as flash attention.
It holds no parameters. Packed sequences, attention bias and sliding windows are refused.

Attention dropout (`--attention-dropout`, Megatron's default 0.1) is one more reason for the op: the
CPU's fused SDPA kernels take no dropout, so with dropout torch decomposes SDPA into its math form
(two batched GEMMs, a softmax and a dropout over [b, h, s, s]), which the GPU model would time as
such. A GPU's flash kernel draws the dropout mask in registers inside the same kernel. On fake tensors
the values do not exist, so the op runs with dropout 0 (same shapes, the fused kernel) and the model
times it as flash attention; the in-kernel mask generation is not charged (an assumption, written in
gpu_model/README.md).
"""

from __future__ import annotations

import torch
import torch.nn.functional as F
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType


def materialises_scores(config) -> bool:
    """--attention-backend unfused or local (a TransformerConfig's `attention_backend`): the attention a
    GPU runs holds its score matrix, as the local kernel does; the other backends run a fused kernel."""
    return getattr(config.attention_backend, "name", None) in ("unfused", "local")


class FlashAttention(DotProductAttention):
    """megatron-core's local attention kernel as one fused scaled-dot-product attention."""

    def forward(
        self,
        query: torch.Tensor,
        key: torch.Tensor,
        value: torch.Tensor,
        attention_mask: torch.Tensor | None,
        attn_mask_type: AttnMaskType | None = None,
        attention_bias: torch.Tensor | None = None,
        packed_seq_params=None,
    ) -> torch.Tensor:
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError("a modelled device's attention takes no packed sequences or attention bias")
        if self.config.window_size is not None:
            raise ValueError("--window-size: sliding-window attention is not modelled on a modelled device")
        mask_type = self.attn_mask_type if attn_mask_type is None else attn_mask_type
        causal = mask_type == AttnMaskType.causal
        sq, b, num_heads, head_dim = query.shape
        # [s, b, h, d] -> [b, h, s, d], the layout SDPA takes.
        q, k, v = (x.permute(1, 2, 0, 3) for x in (query, key, value))
        mask = None if causal or attention_mask is None else ~attention_mask  # Megatron: True = masked
        out = F.scaled_dot_product_attention(
            q,
            k,
            v,
            attn_mask=mask,
            dropout_p=0.0,  # see the module docstring: the fused kernel, as a GPU runs with dropout
            is_causal=causal,
            scale=self.softmax_scale,
            enable_gqa=k.shape[1] != num_heads,
        )
        return out.permute(2, 0, 1, 3).reshape(sq, b, num_heads * head_dim)
