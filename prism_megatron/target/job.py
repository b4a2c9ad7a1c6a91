"""`TargetJob`: the production job being emulated, as Megatron-LM would configure it.

Frozen plain data, made from Megatron's flags by `megatron.job.target.derive` (the one reader of
them) and read everywhere else: its parallel sizes and rank order, how the pipeline schedule cuts
the model, the batch, and the model's shape. Fields are None where the flags do not say (the
`topology` command lays out a job without a model). What follows from the shape alone is here too:
the padded vocabulary (Megatron-LM's rule), the parameter count and the MoE layer pattern.
"""

from __future__ import annotations

import dataclasses
import math

from prism_megatron.topology import Layout

ORDER_TP_PP_DP = "tp-cp-ep-pp-dp"
ORDER_DEFAULT = "tp-cp-ep-dp-pp"


@dataclasses.dataclass(frozen=True, kw_only=True)
class ParallelSizes:
    """The target job's parallel sizes as Megatron's flags give them (the world size apart)."""

    tp: int = 1
    pp: int = 1
    vpp: int | None = None
    """Model chunks per pipeline rank; None when not interleaved."""
    cp: int = 1
    ep: int = 1
    etp: int | None = None
    """None: the same as tp."""
    order: str = ORDER_DEFAULT
    untie_embeddings: bool = False
    mtp: bool = False
    """`--mtp-num-layers` given: the last stage holds MTP layers (and so the embedding)."""


def layout_of(sizes: ParallelSizes, world_size: int) -> Layout:
    """The target job's topology (raises ValueError naming the flag for a job Megatron would refuse)."""
    return Layout(
        world_size=world_size,
        tp=sizes.tp,
        pp=sizes.pp,
        cp=sizes.cp,
        ep=sizes.ep,
        etp=sizes.etp or sizes.tp,
        vpp=sizes.vpp,
        order=sizes.order,
        untie_embeddings=sizes.untie_embeddings,
        mtp=sizes.mtp,
    )


@dataclasses.dataclass(frozen=True, kw_only=True)
class Schedule:
    """How the pipeline schedule cuts the model: chunks per rank, layers per stage, microbatches."""

    vpp: int | None = None
    """Model chunks per pipeline rank (interleaved schedule); None when not interleaved."""
    layers_per_stage: tuple[int, ...] | None = None
    """Transformer layers of each pipeline stage, first to last (None without --num-layers)."""
    overlap_p2p_comm: bool = False
    """Whether the interleaved schedule overlaps its p2p communication (always False without it)."""
    microbatch_group_size: int | None = None
    """--microbatch-group-size-per-virtual-pipeline-stage (None: megatron-core's default, PP)."""
    num_microbatches: int | None = None
    """Microbatches per iteration and data-parallel rank (None without --micro-batch-size or a world)."""
    first_stage_layers: int | None = None
    """--decoder-first-pipeline-num-layers (None: an even split)."""
    last_stage_layers: int | None = None
    """--decoder-last-pipeline-num-layers (None: an even split)."""
    embedding_in_split: bool = False
    """--account-for-embedding-in-pipeline-split: the embedding counts as a layer of the first stage."""
    loss_in_split: bool = False
    """--account-for-loss-in-pipeline-split: the loss counts as a layer of the last stage."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelShape:
    """What the model's size is made of, after Megatron-LM's defaults (None where not given)."""

    num_layers: int | None = None
    hidden_size: int | None = None
    ffn_hidden_size: int | None = None
    num_attention_heads: int | None = None
    num_query_groups: int | None = None
    """Key/value heads: --num-query-groups with --group-query-attention, else the attention heads."""
    kv_channels: int | None = None
    seq_length: int | None = None
    max_position_embeddings: int | None = None
    padded_vocab_size: int | None = None
    """The embedding rows Megatron-LM builds (`padded_vocab_size`)."""
    swiglu: bool = False
    num_experts: int | None = None
    moe_ffn_hidden_size: int | None = None
    moe_router_topk: int = 2
    moe_layer_freq: int | tuple[int, ...] = 1
    """Every N-th layer is MoE (layer i when i % N == 0), or a 0/1 pattern per layer."""
    moe_shared_expert_intermediate_size: int | None = None
    mtp_num_layers: int | None = None
    """Multi-token prediction layers on the last stage (None: no MTP)."""

    def __post_init__(self) -> None:
        sizes = ("num_layers", "hidden_size", "num_attention_heads", "seq_length", "padded_vocab_size")
        given = {name: getattr(self, name) for name in sizes if getattr(self, name) is not None}
        bad = [f"--{name.replace('_', '-')} {value}" for name, value in given.items() if value < 1]
        if bad:
            raise ValueError(f"model sizes must be positive: {', '.join(bad)}")
        pattern = self.moe_layer_freq
        if not isinstance(pattern, int):
            object.__setattr__(self, "moe_layer_freq", tuple(pattern))  # a list from the flag: frozen here
            if self.num_layers is not None and len(pattern) != self.num_layers:
                raise ValueError(
                    f"--moe-layer-freq pattern has {len(pattern)} entries but --num-layers is {self.num_layers}"
                )

    def moe_pattern(self) -> tuple[int, ...]:
        """1 for each MoE layer, 0 for each dense one, first to last (all 0 without experts)."""
        layers = self.num_layers or 0
        if self.num_experts is None:
            return (0,) * layers
        if isinstance(self.moe_layer_freq, int):
            return tuple(1 if i % self.moe_layer_freq == 0 else 0 for i in range(layers))
        return tuple(self.moe_layer_freq)

    def num_moe_layers(self) -> int:
        return sum(self.moe_pattern())

    def missing(self, *names: str) -> list[str]:
        """The flags (as `--flag-name`) of the fields among `names` that are None."""
        return [f"--{name.replace('_', '-')}" for name in names if getattr(self, name) is None]

    def num_parameters(self, *, untie_embeddings: bool = False, norms_per_layer: int = 2) -> int:
        """Parameters of the whole model (every TP, PP and expert shard together) as Megatron-LM's
        theoretical memory estimate counts them (`theoretical_memory_usage.py`, core_v0.16.1): the
        attention projections, the MLP or the experts (+ the shared expert; the router's E x h is left
        out, as it leaves it out), `norms_per_layer` vectors of h per layer (2 with RMSNorm, 4 with
        LayerNorm's bias) and half as many for the final norm, the MTP layers, the word embedding
        (twice when untied); biases and learned position embeddings are not counted.

        Raises:
            ValueError: a size the count needs is not given (names the flags).
        """
        missing = self.missing("num_layers", "hidden_size", "num_attention_heads", "padded_vocab_size")
        if missing:
            raise ValueError(f"the parameter count needs {', '.join(missing)}")
        block, mtp, embedding, _ = self.parameter_counts(norms_per_layer=norms_per_layer)
        return int(block + mtp + embedding * (2 if untie_embeddings else 1))

    def parameter_counts(
        self, *, norms_per_layer: int = 2, attention: float | None = None
    ) -> tuple[float, float, float, float]:
        """(transformer block, MTP layers, one word embedding, the experts in the block), whole model
        (see `num_parameters`). `attention`: one layer's attention parameters where they are not the
        grouped-query projections counted here (multi-latent attention's low-rank ones)."""
        h, heads = self.hidden_size, self.num_attention_heads
        if attention is None:
            kv_channels = self.kv_channels or h // heads
            groups = self.num_query_groups or heads
            attention = (
                2 * h * kv_channels * (heads + groups)
            )  # q and output h x (kv heads); k, v h x (kv groups)
        gated = 3 if self.swiglu else 2  # a gated MLP's up-projection is two matrices
        norms = norms_per_layer * h
        dense = attention + gated * h * (self.ffn_hidden_size or 4 * h) + norms
        moe_ffn = self.moe_ffn_hidden_size or self.ffn_hidden_size or 4 * h
        experts = (self.num_experts or 0) * gated * h * moe_ffn
        shared = gated * h * (self.moe_shared_expert_intermediate_size or 0)
        moe = attention + experts + shared + norms
        pattern = self.moe_pattern()
        num_moe = sum(pattern)
        block = dense * (len(pattern) - num_moe) + moe * num_moe + norms_per_layer // 2 * h
        mtp = (self.mtp_num_layers or 0) * (moe if pattern and pattern[-1] else dense)
        return block, mtp, h * self.padded_vocab_size, experts * num_moe


@dataclasses.dataclass(frozen=True, kw_only=True)
class TargetJob:
    """The job a flag list describes, as Megatron-LM would configure it."""

    world_size: int | None
    sizes: ParallelSizes
    schedule: Schedule = Schedule()
    micro_batch_size: int | None = None
    global_batch_size: int | None = None
    data_parallel_size: int | None = None
    model: ModelShape = ModelShape()

    def layout(self) -> Layout:
        if self.world_size is None:
            raise ValueError("the target job's world size is not known (--prism-world-size)")
        return layout_of(self.sizes, self.world_size)

    @classmethod
    def from_layout(
        cls,
        layout: Layout,
        *,
        micro_batch_size: int | None,
        global_batch_size: int | None,
        seq_length: int | None,
    ) -> TargetJob:
        """The job of a layout and a batch, where nothing more is known (a report read back)."""
        sizes = ParallelSizes(
            tp=layout.tp, pp=layout.pp, vpp=layout.vpp, cp=layout.cp, ep=layout.ep, etp=layout.etp,
            order=layout.order,
        )  # fmt: skip
        return cls(
            world_size=layout.world_size,
            sizes=sizes,
            schedule=Schedule(vpp=layout.vpp),
            micro_batch_size=micro_batch_size,
            global_batch_size=global_batch_size,
            data_parallel_size=layout.dp,
            model=ModelShape(seq_length=seq_length),
        )


def padded_vocab_size(
    vocab_size: int | None,
    *,
    tp: int,
    divisible_by: int = 128,
    null_tokenizer: bool = False,
    padded: int | None = None,
) -> int | None:
    """The embedding rows Megatron-LM builds (tokenizer.py `_vocab_size_with_padding`): `padded`
    (--padded-vocab-size) when given, else the tokenizer's size (the NullTokenizer counts one EOD token
    beyond --vocab-size) padded up to a multiple of --make-vocab-size-divisible-by x TP; None without
    either."""
    if padded is not None:
        return padded
    if vocab_size is None:
        return None
    tokenizer_size = vocab_size + 1 if null_tokenizer else vocab_size
    multiple = divisible_by * tp
    return math.ceil(tokenizer_size / multiple) * multiple
