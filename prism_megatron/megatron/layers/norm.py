"""A torch LayerNorm / RMSNorm that accepts sequence parallelism, as apex's and Transformer Engine's do.

megatron-core's `WrappedTorchNorm` asserts `not config.sequence_parallel`. Nothing in a norm changes
with sequence parallelism: the input is already this rank's slice of the sequence (the embedding
scatters it, the row-parallel linears reduce-scatter into it, the column-parallel linears all-gather
from it), so the norm normalises each token as before. What sequence parallelism needs is that its
weight and bias carry `sequence_parallel = True`: each TP rank then holds gradients from a different
slice of the sequence, and `finalize_model_grads` all-reduces the marked parameters over the TP group
(`_allreduce_non_tensor_model_parallel_grads`). apex's `FusedLayerNorm` sets the attribute from the
config on every norm (the q/k norms too, which see whole sequences: Megatron sums their gradients over
TP anyway, by attribute or by name); this does the same.
"""

from __future__ import annotations

import torch
from megatron.core.transformer import TransformerConfig

_NORMS = {"LayerNorm": torch.nn.LayerNorm, "RMSNorm": torch.nn.RMSNorm}


def build_norm(config: TransformerConfig, hidden_size: int, eps: float = 1e-5) -> torch.nn.Module:
    """The torch norm `config.normalization` names, its parameters marked for sequence parallelism.

    Raises:
        ValueError: a norm option the torch norms do not have (as `WrappedTorchNorm` refuses them).
    """
    for option, flag in (
        ("layernorm_zero_centered_gamma", "--apply-layernorm-1p"),
        ("persist_layer_norm", "--persist-layer-norm"),
        ("memory_efficient_layer_norm", "--memory-efficient-layer-norm"),
    ):
        if getattr(config, option):
            raise ValueError(
                f"{flag} needs apex's or Transformer Engine's norm; torch's norms have no such option"
            )
    if config.normalization not in _NORMS:
        raise ValueError(f"--normalization {config.normalization}: the torch norms are {', '.join(_NORMS)}")
    norm = _NORMS[config.normalization](normalized_shape=hidden_size, eps=eps)
    for param in norm.parameters():
        param.sequence_parallel = config.sequence_parallel
    return norm


class SequenceParallelNorm:
    """Layer-spec class with `WrappedTorchNorm`'s constructor: `SequenceParallelNorm(config, hidden_size,
    eps)` returns the torch norm (see `build_norm`); the unused apex options are accepted and ignored,
    as `WrappedTorchNorm` ignores them."""

    def __new__(
        cls,
        config: TransformerConfig,
        hidden_size: int,
        eps: float = 1e-5,
        persist_layer_norm: bool = False,
        zero_centered_gamma: bool = False,
        normalization: str = "LayerNorm",
    ) -> torch.nn.Module:
        return build_norm(config, hidden_size, eps)
