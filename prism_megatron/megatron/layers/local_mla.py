"""Multi-latent attention on megatron-core's local (non-Transformer-Engine) layers.

megatron-core 0.16.1 specs MLA for the local layers (`get_gpt_layer_local_spec(...,
multi_latent_attention=True)`) but cannot build or run it there, for two reasons this module removes:

* `MLASelfAttention` passes `k_channels` and `v_channels` to its core attention (the query/key head
  is `qk_head_dim + qk_pos_emb_head_dim` wide, the value head `v_head_dim`), which only Transformer
  Engine's `DotProductAttention` accepts. `MLACoreAttention` is the local `DotProductAttention` that
  accepts them: the same unfused softmax(QK^T * scale) V, with its output sized by the value heads.
  The kernel has no parameters, so the model's parameters are exactly those of the TE spec.
* `multi_latent_attention.py` sets `HAVE_TE = True` whenever megatron's own TE extension module
  imports, which it does without TE (its classes are then placeholders that are not types), and the
  constructor's `isinstance(..., TELinear)` fails. The patch record `build.mla_have_te`
  (`prism_megatron.patches.model_build.mla_constructible`) sets the flag to the truth for the
  duration of a build.
"""

from __future__ import annotations

import dataclasses

from megatron.core.transformer.dot_product_attention import DotProductAttention


class MLACoreAttention(DotProductAttention):
    """The local `DotProductAttention` with separate query/key and value head sizes (for MLA).

    Scores use the query/key heads (`k_channels` wide) and MLA's softmax scale; the context has one
    `v_channels`-wide head per attention head, which is what MLA's output projection takes.
    """

    def __init__(self, *args, k_channels: int | None = None, v_channels: int | None = None, **kwargs) -> None:
        super().__init__(*args, **kwargs)
        if v_channels is not None:
            self.hidden_size_per_attention_head = v_channels
            self.hidden_size_per_partition = v_channels * self.num_attention_heads_per_partition


def with_mla_core_attention(spec):
    """`spec` (a module spec, block spec or list of them) with every local `DotProductAttention`
    replaced by `MLACoreAttention`, recursively."""
    if spec is DotProductAttention:
        return MLACoreAttention
    if isinstance(spec, list):
        return [with_mla_core_attention(item) for item in spec]
    if dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        changes = {f.name: with_mla_core_attention(getattr(spec, f.name)) for f in dataclasses.fields(spec)}
        return dataclasses.replace(spec, **changes)
    return spec
