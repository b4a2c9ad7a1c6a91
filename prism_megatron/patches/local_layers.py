"""Megatron-LM's `--transformer-impl local` on CPU with sequence and context parallelism.

Megatron-LM's `gpt_builder` builds megatron-core's local spec (`get_gpt_layer_local_spec`,
`get_gpt_decoder_block_spec(use_transformer_engine=False)`), whose torch norm refuses sequence
parallelism and whose attention refuses context parallelism. The built-in entry substitutes
`prism_megatron.megatron.layers` in its own spec (`megatron/layers/parallel_spec.py`); a script we do not edit gets
them from these two records, applied with the CPU device shim (a CPU has no Transformer Engine; where
Transformer Engine builds the layers they are not applied).

* `WrappedTorchNorm.__new__`: every local norm (layers, the block's final norm, MTP norms) is built
  through this class under several module-level names (`LNImpl` in the spec modules,
  `LayerNormImpl` in transformer_block.py); replacing its constructor reaches them all. It builds the
  same torch norm, accepts sequence parallelism and marks the parameters for it.
* `LocalSpecProvider.core_attention`: the one place the local specs take their attention kernel from
  (dense, MoE, MLA and MTP layers); it gives `ContextParallelAttention`, which is the local kernel
  unchanged at CP 1. On a modelled GPU (`--prism-device model:<gpu>`) it gives `LocalSpecAttention`
  instead: the same kernel above CP 1, one fused attention (timed as flash attention) at CP 1.
"""

from __future__ import annotations

from typing import Any

from prism_megatron.megatron.layers.context_parallel import ContextParallelAttention
from prism_megatron.megatron.layers.local_spec_attention import LocalSpecAttention
from prism_megatron.megatron.layers.norm import build_norm
from prism_megatron.patches.registry import Patch, variants
from prism_megatron.patches.versions import EVERY_VERIFIED, MEGATRON_CORE_0_16, MEGATRON_CORE_0_19

_NORM_PARAMETERS = (
    "(cls, config: megatron.core.transformer.transformer_config.TransformerConfig, "
    "hidden_size: int, eps: float = 1e-05, persist_layer_norm: bool = False, "
    "zero_centered_gamma: bool = False, normalization: str = 'LayerNorm')"
)


def _norm(original: Any):
    def __new__(
        cls,
        config,
        hidden_size: int,
        eps: float = 1e-5,
        persist_layer_norm: bool = False,
        zero_centered_gamma: bool = False,
        normalization: str = "LayerNorm",
    ):
        return build_norm(config, hidden_size, eps)

    return __new__


def _core_attention(original: Any):
    def core_attention(self) -> type:
        return ContextParallelAttention

    return core_attention


def _modelled_core_attention(original: Any):
    def core_attention(self) -> type:
        return LocalSpecAttention

    return core_attention


MODELLED_ATTENTION = Patch(
    name="modelled.local_spec_attention",
    target="megatron.core.models.backends:LocalSpecProvider.core_attention",
    make=_modelled_core_attention,
    verified_on=EVERY_VERIFIED,
    reason="--prism-device model:<gpu>: a GPU runs attention as one fused kernel (Transformer Engine's "
    "flash or cuDNN attention); the local kernel's unfused score matrix would be timed as GEMMs and a "
    "memory-bound softmax. One fused attention at CP 1, the context-parallel kernel above",
    signature="(self) -> type",
)


def records(*, modelled: bool = False) -> tuple[Patch, ...]:
    """The local layers' records; `modelled`: the run's device is a modelled GPU (its attention kernel
    is `MODELLED_ATTENTION`'s)."""
    return (
        *variants(
            name="cpu.sequence_parallel_norm",
            target="megatron.core.transformer.torch_norm:WrappedTorchNorm.__new__",
            make=_norm,
            reason="the local torch norm asserts without --sequence-parallel support (apex); the same "
            "norm, its parameters marked sequence-parallel so their gradients are all-reduced over TP",
            by_release={
                MEGATRON_CORE_0_16: {"signature": _NORM_PARAMETERS},
                # 0.19 annotated the return type and added an L2Norm choice (the replacement refuses it in
                # one line, naming the torch norms); the asserts are 0.16.1's.
                MEGATRON_CORE_0_19: {
                    "signature": f"{_NORM_PARAMETERS} -> megatron.core.transformer.torch_norm.LayerNormInterface"
                },
            },
        ),
        MODELLED_ATTENTION
        if modelled
        else Patch(
            name="cpu.context_parallel_attention",
            target="megatron.core.models.backends:LocalSpecProvider.core_attention",
            make=_core_attention,
            verified_on=EVERY_VERIFIED,
            reason="the local attention asserts context parallelism 1; the local kernel with Transformer "
            "Engine's CP communication (--cp-comm-type), itself at CP 1",
            signature="(self) -> type",
        ),
    )
