"""The attention kernel of megatron-core's local layers, with context parallelism.

megatron-core's local `DotProductAttention` asserts `context_parallel_size == 1` ("only supported by
TEDotProductAttention"). `ContextParallelAttention` is that kernel with Transformer Engine's context
parallelism: the layer's queries, keys and values hold this rank's two chunks of the sequence
(Megatron's load-balanced split, `chunks.py`), and the kernel computes exact attention over the whole
sequence with the communication `--cp-comm-type` names, as Transformer Engine does it:

* `p2p` (the default): keys and values round a ring (`ring.py`);
* `a2a`: all-to-alls over heads (`all_to_all.py`);
* `all_gather`: all-gathered keys and values (`all_gather.py`);
* `a2a+p2p`: all-to-alls within the first level of `--hierarchical-context-parallel-sizes`, a ring over
  the second (`ring.py`).

It holds no parameters. With CP = 1 it is the local `DotProductAttention` unchanged. Like Transformer
Engine's attention with a causal mask type, it ignores an attention mask tensor (the causal mask of a
split sequence is implied by the chunk layout). Packed sequences, attention bias and sliding windows
are refused, as are the combinations Transformer Engine refuses.
"""

from __future__ import annotations

import copy

import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel
from megatron.core.process_groups_config import ProcessGroupCollection
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.enums import AttnMaskType
from megatron.core.transformer.transformer_config import TransformerConfig

from prism_megatron.megatron.layers.all_gather import AllGatherAttention
from prism_megatron.megatron.layers.all_to_all import AllToAllAttention
from prism_megatron.megatron.layers.ring import Ring, RingAttention

COMM_TYPES = ("p2p", "a2a", "all_gather", "a2a+p2p")
"""The `--cp-comm-type` values Transformer Engine takes (megatron-core hands the flag's value to it as
given; Megatron-LM's help writes the all-gather one `allgather`, which Transformer Engine refuses)."""


def _without_context_parallelism(config: TransformerConfig) -> TransformerConfig:
    """A shallow copy with CP 1, for the parent's constructor only (it asserts CP 1; nothing else it
    builds depends on CP)."""
    single = copy.copy(config)
    single.context_parallel_size = 1
    return single


def _comm_type(value: str | None) -> str:
    name = "p2p" if value is None else value
    if name == "allgather":
        raise ValueError(
            "--cp-comm-type allgather: Transformer Engine, which runs megatron-core's context-parallel "
            "attention, takes all_gather and refuses allgather (the spelling of Megatron-LM's help); "
            "use --cp-comm-type all_gather"
        )
    if name not in COMM_TYPES:
        raise ValueError(
            f"--cp-comm-type {value}: the context-parallel communication types are {', '.join(COMM_TYPES)}"
        )
    return name


class ContextParallelAttention(DotProductAttention):
    """Local attention kernel with context parallelism (see the module docstring).

    `k_channels` / `v_channels` are the separate query/key and value head sizes of multi-latent
    attention (p2p and a2a+p2p only, as in Transformer Engine)."""

    def __init__(
        self,
        config: TransformerConfig,
        layer_number: int,
        attn_mask_type: AttnMaskType,
        attention_type: str,
        attention_dropout: float | None = None,
        softmax_scale: float | None = None,
        cp_comm_type: str | None = None,
        pg_collection: ProcessGroupCollection | None = None,
        k_channels: int | None = None,
        v_channels: int | None = None,
    ) -> None:
        super().__init__(
            _without_context_parallelism(config),
            layer_number,
            attn_mask_type,
            attention_type,
            attention_dropout=attention_dropout,
            softmax_scale=softmax_scale,
            pg_collection=pg_collection,
        )
        self.config = config
        if v_channels is not None:
            self.hidden_size_per_attention_head = v_channels
            self.hidden_size_per_partition = v_channels * self.num_attention_heads_per_partition
        self.cp_comm_type = _comm_type(cp_comm_type)
        self.mla = k_channels is not None and v_channels is not None and k_channels != v_channels
        self.cp_group = getattr(pg_collection, "cp", None) or parallel_state.get_context_parallel_group(
            check_initialized=False
        )
        self.cp_size = 1 if self.cp_group is None else dist.get_world_size(group=self.cp_group)
        if self.cp_size > 1:
            self._check_supported()

    def _check_supported(self) -> None:
        if self.config.window_size is not None:
            raise ValueError(
                "--window-size: sliding-window attention with context parallelism is not supported here"
            )
        if self.mla and self.cp_comm_type in ("a2a", "all_gather"):
            raise ValueError(
                f"--cp-comm-type {self.cp_comm_type} cannot run multi-latent attention (as in Transformer "
                "Engine); use p2p or a2a+p2p"
            )
        if self.cp_comm_type == "a2a":
            for what, count in (
                ("attention heads", self.num_attention_heads_per_partition),
                ("query groups", self.num_query_groups_per_partition),
            ):
                if count % self.cp_size:
                    raise ValueError(
                        f"--cp-comm-type a2a needs the {what} of a TP rank ({count}) divisible by "
                        f"--context-parallel-size {self.cp_size}"
                    )
        if self.cp_comm_type == "a2a+p2p" and not parallel_state.get_hierarchical_context_parallel_groups(
            check_initialized=False
        ):
            raise ValueError("--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes")

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
        if self.cp_size == 1:
            return super().forward(
                query, key, value, attention_mask, attn_mask_type, attention_bias, packed_seq_params
            )
        if packed_seq_params is not None or attention_bias is not None:
            raise ValueError(
                "context-parallel local attention takes no packed sequences and no attention bias"
            )
        mask_type = attn_mask_type or self.attn_mask_type
        if mask_type not in (AttnMaskType.causal, AttnMaskType.no_mask):
            raise ValueError(f"context-parallel local attention supports causal and no_mask, not {mask_type}")
        if query.shape[0] % 2:
            raise ValueError(f"a CP rank's sequence ({query.shape[0]} tokens) must split into two chunks")
        causal = mask_type == AttnMaskType.causal
        out = self._attend(query, key, value, causal)
        return out.reshape(out.shape[0], out.shape[1], -1)

    def _dropout_seeds(self, count: int) -> tuple[int, ...]:
        """Per-block dropout seeds, drawn where the local kernel draws its dropout (the model-parallel
        RNG without sequence parallelism, the default one with it)."""
        dropout_p = self.attention_dropout.p if self.training else 0.0
        if dropout_p <= 0.0:
            return (0,) * count
        if self.config.sequence_parallel:
            return tuple(torch.randint(2**62, (count,)).tolist())
        with tensor_parallel.get_cuda_rng_tracker().fork():
            return tuple(torch.randint(2**62, (count,)).tolist())

    def _attend(self, q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, causal: bool) -> torch.Tensor:
        dropout_p = self.attention_dropout.p if self.training else 0.0
        scale = self.softmax_scale
        if self.cp_comm_type == "all_gather":
            return AllGatherAttention.apply(
                q, k, v, self.cp_group, scale, causal, dropout_p, self._dropout_seeds(2)
            )
        if self.cp_comm_type == "a2a":
            return AllToAllAttention.apply(
                q, k, v, self.cp_group, scale, causal, dropout_p, self._dropout_seeds(1)[0]
            )
        global_ranks = dist.get_process_group_ranks(self.cp_group)
        if self.cp_comm_type == "p2p":
            ring = Ring.of(self.cp_group, global_ranks)
            return RingAttention.apply(
                q, k, v, ring, scale, causal, dropout_p, self._dropout_seeds(ring.size), None
            )
        a2a_group, p2p_group = parallel_state.get_hierarchical_context_parallel_groups()
        a2a_size = dist.get_world_size(group=a2a_group)
        if dist.get_world_size(group=p2p_group) == 1:  # Transformer Engine's fallbacks for a trivial level
            return AllToAllAttention.apply(
                q, k, v, a2a_group, scale, causal, dropout_p, self._dropout_seeds(1)[0]
            )
        ring = Ring.of(p2p_group, global_ranks, stride=a2a_size, offset=dist.get_rank(group=a2a_group))
        a2a = a2a_group if a2a_size > 1 else None
        return RingAttention.apply(
            q, k, v, ring, scale, causal, dropout_p, self._dropout_seeds(ring.size), a2a
        )
