"""The attention kernel of megatron-core's local spec on a modelled GPU, for a script we do not edit.

Megatron-LM's `gpt_builder` without Transformer Engine (`--transformer-impl local`) takes every
attention kernel of its local specs from `LocalSpecProvider.core_attention`; on the CPU prism makes
that `ContextParallelAttention` (`patches/local_layers.py`). On a modelled GPU
(`--prism-device model:<gpu>`) the kernel is `LocalSpecAttention`: at context parallelism 1 it runs
`FlashAttention`'s one fused scaled-dot-product attention, timed as flash attention as the built-in
entry's spec does (unless `--attention-backend` is unfused or local: then the GPU too holds the
scores, and the local kernel's own ops run), above 1 the context-parallel kernel block by block (each block charged as one flash-attention
kernel, as in the built-in entry). It holds no parameters, like both.
"""

from __future__ import annotations

import torch
from megatron.core.transformer.enums import AttnMaskType

from prism_megatron.megatron.layers.context_parallel import ContextParallelAttention
from prism_megatron.megatron.layers.flash_attention import FlashAttention, materialises_scores


class LocalSpecAttention(ContextParallelAttention):
    """`FlashAttention` at CP 1, `ContextParallelAttention` above (see the module docstring)."""

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
        if self.cp_size > 1 or materialises_scores(self.config):
            # Above CP 1: the context-parallel kernel, each block charged as one flash kernel. An
            # attention that holds its scores on a GPU too (--attention-backend unfused or local) at
            # CP 1: the local kernel's own ops, each timed as the GPU runs it.
            return super().forward(
                query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params
            )
        if self.mla:
            raise ValueError(
                "multi-latent attention on --prism-device model:<gpu> needs its own fused kernel model "
                "(different query and value head sizes); it is not modelled yet"
            )
        # FlashAttention's forward reads only what every DotProductAttention holds.
        return FlashAttention.forward(
            self, query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params
        )
