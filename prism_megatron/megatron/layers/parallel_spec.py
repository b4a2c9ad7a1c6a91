"""The built-in entry's layer spec with the local layers that run sequence and context parallelism.

megatron-core's local spec builds `WrappedTorchNorm` (refuses sequence parallelism without apex) and
`DotProductAttention` (refuses context parallelism). The entry builds its spec as Megatron-LM's
`gpt_builder` does, then substitutes the layers of `prism_megatron.megatron.layers` for those two,
only where the job needs them: the norms (the block's final norm and the multi-token-prediction
norms included) under `--sequence-parallel`, the attention kernels under `--context-parallel-size` > 1.
The substitutes have the same parameters (the attention kernel has none), so a model's parameters
are those of megatron-core's spec. `SUBSTITUTIONS` lists them for `--prism-list-patches`.
"""

from __future__ import annotations

import dataclasses

from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.torch_norm import WrappedTorchNorm
from megatron.core.transformer.transformer_block import (
    LayerNormImpl,
    TransformerBlockSubmodules,
    get_num_layers_to_build,
)

from prism_megatron.megatron.layers.context_parallel import ContextParallelAttention
from prism_megatron.megatron.layers.flash_attention import FlashAttention, materialises_scores
from prism_megatron.megatron.layers.local_mla import MLACoreAttention
from prism_megatron.megatron.layers.norm import SequenceParallelNorm

VERIFIED_ON = ("0.16.1",)


@dataclasses.dataclass(frozen=True, kw_only=True)
class SpecSubstitution:
    """A class of megatron-core's local spec that the entry's spec replaces, and when."""

    name: str
    target: str
    """What is replaced, as `module:Class` (the table's column)."""
    replaces: tuple[type, ...]
    replacement: type
    needed: str
    """The TransformerConfig switch that calls for it."""
    verified_on: tuple[str, ...]
    reason: str

    def applies(self, config: TransformerConfig, *, modelled: bool = False) -> bool:
        if self.needed == "sequence_parallel":
            return bool(config.sequence_parallel)
        if self.needed == "modelled_device":
            return modelled and config.context_parallel_size == 1 and not materialises_scores(config)
        return config.context_parallel_size > 1


SUBSTITUTIONS = (
    SpecSubstitution(
        name="entry.sequence_parallel_norm",
        target="megatron.core.transformer.torch_norm:WrappedTorchNorm",
        replaces=(WrappedTorchNorm,),
        replacement=SequenceParallelNorm,
        needed="sequence_parallel",
        verified_on=VERIFIED_ON,
        reason="--sequence-parallel: the torch norm asserts without apex; the layers' norm marks its "
        "parameters sequence-parallel so their gradients are all-reduced over TP",
    ),
    SpecSubstitution(
        name="entry.context_parallel_attention",
        target="megatron.core.transformer.dot_product_attention:DotProductAttention",
        replaces=(DotProductAttention, MLACoreAttention),
        replacement=ContextParallelAttention,
        needed="context_parallel",
        verified_on=VERIFIED_ON,
        reason="--context-parallel-size > 1: the local attention asserts CP 1; the layers' attention "
        "exchanges keys and values over the CP group as Transformer Engine does (--cp-comm-type)",
    ),
    SpecSubstitution(
        name="entry.flash_attention",
        target="megatron.core.transformer.dot_product_attention:DotProductAttention",
        replaces=(DotProductAttention,),
        replacement=FlashAttention,
        needed="modelled_device",
        verified_on=VERIFIED_ON,
        reason="--prism-device model:<gpu> (CP 1, --attention-backend neither unfused nor local): the GPU "
        "runs attention as one fused kernel (Transformer Engine's flash or cuDNN attention); the local "
        "kernel's unfused score matrix would be timed as GEMMs and a memory-bound softmax",
    ),
)


def _substitute(spec, table: dict[type, type]):
    if isinstance(spec, type):
        return table.get(spec, spec)
    if isinstance(spec, list):
        return [_substitute(item, table) for item in spec]
    if dataclasses.is_dataclass(spec):
        changes = {f.name: _substitute(getattr(spec, f.name), table) for f in dataclasses.fields(spec)}
        return dataclasses.replace(spec, **changes)
    return spec


def _as_block_spec(spec, config: TransformerConfig, vp_stage: int | None):
    """A layer spec as the block spec megatron-core makes of it (`_get_block_submodules`: the layer
    for every layer of the stage, megatron-core's block norm), so the block's final norm is in the
    spec too; a block spec unchanged."""
    if isinstance(spec, TransformerBlockSubmodules):
        return spec
    num_layers = get_num_layers_to_build(config, vp_stage=vp_stage)
    return TransformerBlockSubmodules(layer_specs=[spec] * num_layers, layer_norm=LayerNormImpl)


def _table(config: TransformerConfig, modelled: bool) -> dict[type, type]:
    return {
        original: s.replacement
        for s in SUBSTITUTIONS
        if s.applies(config, modelled=modelled)
        for original in s.replaces
    }


def decoder_spec(spec, config: TransformerConfig, vp_stage: int | None, *, modelled: bool = False):
    """The decoder's spec (a layer or block spec) with the substitutions the job needs, if any
    (`modelled`: the run's device is a modelled GPU)."""
    table = _table(config, modelled)
    return _substitute(_as_block_spec(spec, config, vp_stage), table) if table else spec


def mtp_spec(spec, config: TransformerConfig, *, modelled: bool = False):
    """The multi-token-prediction block's spec (or None) with the substitutions the job needs."""
    table = _table(config, modelled)
    return _substitute(spec, table) if table and spec is not None else spec
