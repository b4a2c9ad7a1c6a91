"""Build one virtual rank's real model, DDP buffers and optimizer shard, without memory or compute.

The plan does not estimate parameter, gradient and optimizer bytes from formulas: it asks megatron-core.
Inside a one-process *virtual world* (torch's `fake` process-group backend, whose size is the target
job's world and whose rank is the virtual rank, with megatron-core's own `initialize_model_parallel`
on top) it builds the rank's GPTModel chunks as Megatron-LM's `gpt_builder` would, on the `meta`
device, wraps them in megatron-core's `DistributedDataParallel` (whose buffers then carry Megatron's
bucketing and padding for the full-size data-parallel group) and asks `DistributedOptimizer` which
slice of each buffer this data-parallel rank owns. Nothing is allocated, so a rank of a 16384-GPU job
plans in seconds.

The model is built with megatron-core's local (non-Transformer-Engine) layer spec. It has the same
parameter shapes as the Transformer Engine spec; only the 64-element alignment padding of the
distributed optimizer can differ slightly where TE splits a tensor differently (grouped experts).
The build config differs from the job's in settings that change no parameter (see `build_config`).
"""

from __future__ import annotations

import contextlib
import dataclasses
import sys
import warnings
from collections.abc import Iterator

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.distributed import DistributedDataParallel
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_decoder_block_spec,
    get_gpt_decoder_layer_specs,
    get_gpt_layer_local_spec,
    get_gpt_mtp_block_spec,
)
from megatron.core.pipeline_parallel.utils import is_vp_first_stage, is_vp_last_stage
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.module import Float16Module, MegatronModule

from prism_megatron.megatron.job.job import Job, ddp_config
from prism_megatron.passes import world
from prism_megatron.patches import model_build, registry


def initialize_groups(job: Job) -> None:
    """megatron-core's `initialize_model_parallel` for the job, over the current default process group
    (no gloo groups, which the plan never uses and a fake store cannot hold)."""
    world.initialize_groups(job.target.sizes)


@contextlib.contextmanager
def virtual_world(job: Job, virtual_rank: int) -> Iterator[None]:
    """Be `virtual_rank` of the target job in this process: a fake default group and Megatron's groups.

    The fake backend (torch.testing._internal.distributed.fake_pg, the same one Megatron-LM's
    `--fake-process-group` uses) has the target's size and rank and does no communication, so
    `initialize_model_parallel` builds exactly the groups this rank has in the real job. Gloo groups
    are not created (they cannot be built on a fake store). Everything is torn down on exit.
    """
    from torch.testing._internal.distributed.fake_pg import FakeStore

    if not 0 <= virtual_rank < job.world_size:
        raise ValueError(f"virtual rank {virtual_rank} is outside the job's world of {job.world_size} ranks")
    if dist.is_initialized():
        raise RuntimeError("a default process group already exists; the plan needs its own virtual world")
    excepthook = sys.excepthook  # init_process_group wraps it with a "[rankN]:" prefix, once per world
    dist.init_process_group("fake", store=FakeStore(), rank=virtual_rank, world_size=job.world_size)
    try:
        initialize_groups(job)
        yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()
        sys.excepthook = excepthook


def build_config(config: TransformerConfig) -> TransformerConfig:
    """The job's TransformerConfig with the settings that the local spec cannot build but that change
    no parameter: sequence parallelism and persistent/zero-centred layer norms (torch norms refuse
    them), context parallelism (only Transformer Engine's attention accepts CP; attention has no
    parameters), kernel fusions, weight initialisation (meta tensors hold no values), and the MoE token
    dispatcher (none has parameters; the all-to-all one creates a CUDA stream when built). Grouped
    experts are built as megatron-core's SequentialMLP: one fc1 and one fc2 weight per expert, the
    shapes Transformer Engine's grouped experts have (the local grouped implementation needs an
    extra package and fuses all experts into one tensor)."""
    with warnings.catch_warnings():
        # megatron-core warns that EP with TP wants sequence parallelism; it is off only for the build.
        warnings.filterwarnings("ignore", message="When using expert parallelism and tensor parallelism")
        return _replace_for_build(config)


def _replace_for_build(config: TransformerConfig) -> TransformerConfig:
    return dataclasses.replace(
        config,
        sequence_parallel=False,
        context_parallel_size=1,
        persist_layer_norm=False,
        layernorm_zero_centered_gamma=False,
        memory_efficient_layer_norm=False,
        gradient_accumulation_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        masked_softmax_fusion=False,
        apply_rope_fusion=False,
        use_cpu_initialization=True,
        perform_initialization=False,
        transformer_impl="local",
        moe_token_dispatcher_type="allgather" if config.num_moe_experts else config.moe_token_dispatcher_type,
        moe_grouped_gemm=False,
    )


class AttentionKernelStandIn(MegatronModule):
    """A parameter-free stand-in for an attention kernel that megatron-core's local spec cannot build.

    Multi-latent attention needs Transformer Engine's attention (the local `DotProductAttention`
    refuses its separate key and value head sizes). The kernel holds no parameters, so the plan builds
    this stand-in in its place and every parameter, buffer and shard stays exact. It cannot run.
    """

    def __init__(self, config: TransformerConfig, *args, **kwargs) -> None:
        super().__init__(config=config)

    def forward(self, *args, **kwargs):
        raise RuntimeError("AttentionKernelStandIn only stands in for parameter counting; it has no forward")


def _with_stand_in_attention(spec):
    """`spec` with every local `DotProductAttention` replaced by `AttentionKernelStandIn` (recursively)."""
    if spec is DotProductAttention:
        return AttentionKernelStandIn
    if isinstance(spec, list):
        return [_with_stand_in_attention(item) for item in spec]
    if dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        changes = {f.name: _with_stand_in_attention(getattr(spec, f.name)) for f in dataclasses.fields(spec)}
        return dataclasses.replace(spec, **changes)
    return spec


def _layer_spec(job: Job, config: TransformerConfig, vp_stage: int | None):
    """The decoder spec Megatron-LM's `gpt_builder` picks with `--transformer-impl local` (MLA's
    attention kernel replaced by a stand-in, see `AttentionKernelStandIn`)."""
    spec = _decoder_spec(job, config, vp_stage)
    return _with_stand_in_attention(spec) if job.args.multi_latent_attention else spec


def _decoder_spec(job: Job, config: TransformerConfig, vp_stage: int | None):
    a = job.args
    if a.num_experts:
        return get_gpt_decoder_block_spec(
            config,
            use_transformer_engine=False,
            normalization=a.normalization,
            qk_l2_norm=a.qk_l2_norm,
            vp_stage=vp_stage,
        )
    return get_gpt_layer_local_spec(
        a.num_experts,
        a.moe_grouped_gemm,
        a.qk_layernorm,
        a.multi_latent_attention,
        normalization=a.normalization,
        qk_l2_norm=a.qk_l2_norm,
    )


def _mtp_spec(job: Job, config: TransformerConfig, vp_stage: int | None):
    a = job.args
    if a.mtp_num_layers is None:
        return None
    last_layer = get_gpt_decoder_layer_specs(
        config,
        use_transformer_engine=False,
        normalization=a.normalization,
        qk_l2_norm=a.qk_l2_norm,
        vp_stage=vp_stage,
    )[-1]
    if a.multi_latent_attention:
        last_layer = _with_stand_in_attention(last_layer)
    return get_gpt_mtp_block_spec(config, last_layer, use_transformer_engine=False, vp_stage=vp_stage)


def build_model_chunks(job: Job, config: TransformerConfig, device: str) -> list[torch.nn.Module]:
    """This rank's GPTModel chunks (one per virtual pipeline stage), as Megatron-LM's `get_model`
    builds them: pre/post-process by stage, then the Float16Module cast for fp16/bf16 training."""
    a = job.args
    vpp = a.virtual_pipeline_model_parallel_size
    pp_group = parallel_state.get_pipeline_model_parallel_group()
    first_stage, last_stage = pp_group.rank() == 0, pp_group.rank() == pp_group.size() - 1
    untested = a.allow_untested_megatron
    chunks = []
    for vp_stage in range(vpp) if vpp else [None]:
        with (
            torch.device(device),
            model_build.building_on(device, allow_untested=untested),
            model_build.mla_constructible(allow_untested=untested),
        ):
            model = GPTModel(
                config=config,
                transformer_layer_spec=_layer_spec(job, config, vp_stage),
                vocab_size=a.padded_vocab_size,
                max_sequence_length=a.max_position_embeddings,
                pre_process=first_stage and is_vp_first_stage(vp_stage, vpp),
                post_process=last_stage and is_vp_last_stage(vp_stage, vpp),
                parallel_output=True,
                share_embeddings_and_output_weights=not a.untie_embeddings_and_output_weights,
                position_embedding_type=a.position_embedding_type,
                rotary_percent=a.rotary_percent,
                rotary_base=a.rotary_base,
                rope_scaling=a.use_rope_scaling,
                mtp_block_spec=_mtp_spec(job, config, vp_stage),
                vp_stage=vp_stage,
            )
        chunks.append(Float16Module(config, model) if (a.fp16 or a.bf16) else model)
    return chunks


def wrap_in_ddp(job: Job, config: TransformerConfig, chunks: list[torch.nn.Module], device: str) -> list:
    """megatron-core DDP around each chunk, with Megatron-LM's DDP config and bucketing rule
    (bucketing only for the first chunk; training.py `get_model`)."""
    dp_cp_size = parallel_state.get_data_parallel_world_size(with_context_parallel=True)
    wrapped = []
    with model_build.building_on(device, allow_untested=job.args.allow_untested_megatron):
        for index, chunk in enumerate(chunks):
            wrapped.append(
                DistributedDataParallel(
                    config=config,
                    ddp_config=ddp_config(job, dp_cp_size),
                    module=chunk,
                    disable_bucketing=index > 0 or job.args.overlap_param_gather_with_optimizer_step,
                )
            )
    return wrapped


@dataclasses.dataclass(frozen=True, kw_only=True)
class BufferPlan:
    """One megatron-core `_ParamAndGradBuffer` of this rank and what its data-parallel rank owns."""

    chunk: int
    """Model chunk (virtual pipeline stage) the buffer belongs to."""
    expert: bool
    """True for the expert-parallel buffer (reduced over the expert-data-parallel group)."""
    param_dtype: torch.dtype
    grad_dtype: torch.dtype
    num_params: int
    """Parameter elements in the buffer (without padding)."""
    numel_padded: int
    """Elements of the buffer as allocated, with Megatron's bucket and alignment padding."""
    num_buckets: int
    data_parallel_size: int
    owned_numel: int
    """Parameter elements whose optimizer state this data-parallel rank owns (distributed optimizer:
    the intersection of its shard of every bucket with the parameters; otherwise all of them)."""
    has_param_buffer: bool
    """True when parameters live in the buffer (distributed optimizer), False when they stay apart."""


class _GroupPosition:
    """Answers `rank()` and `size()` like a process group, for a position the build did not take."""

    def __init__(self, rank: int, size: int) -> None:
        self._rank, self._size = rank, size

    def rank(self) -> int:
        return self._rank

    def size(self) -> int:
        return self._size


class _BufferAt:
    """A DDP buffer as a rank at another data-parallel position sees it: every attribute the buffer's,
    but its data-parallel group answers that position (the buffer itself is left untouched)."""

    def __init__(self, buffer, data_parallel_rank: int) -> None:
        self._buffer = buffer
        self.data_parallel_group = _GroupPosition(data_parallel_rank, buffer.data_parallel_group.size())

    def __getattr__(self, name: str):
        return getattr(self._buffer, name)


def owned_numel(buffer, data_parallel_rank: int, *, allow_untested: bool = False) -> int:
    """Parameter elements of `buffer` whose optimizer state data-parallel rank `data_parallel_rank` owns.

    Asks megatron-core's own `DistributedOptimizer._build_gbuf_range_map` (a private function: the
    record `plan.gbuf_range_map` gates it by version), which reads only the buffer's buckets, its
    parameter index map and its group's rank and size; it reads them through a view whose group
    answers `data_parallel_rank`, so one build serves every rank of a stage.
    """
    build_range_map = registry.private_call(model_build.GBUF_RANGE_MAP, allow_untested=allow_untested)
    ranges = build_range_map(_BufferAt(buffer, data_parallel_rank))
    return sum(
        item["param"].size
        for per_bucket in ranges.values()
        for bucket in per_bucket
        for item in bucket["param_map"].values()
    )


def buffer_plans(
    ddp_chunks: list,
    use_distributed_optimizer: bool,
    data_parallel_rank: int,
    expert_data_parallel_rank: int,
    *,
    allow_untested: bool = False,
) -> list[BufferPlan]:
    """Describe every DDP buffer of a stage as seen by a rank at the given data-parallel positions
    (its rank in the DP x CP group, which shards dense buffers, and in the expert-DP group)."""
    plans = []
    for index, ddp in enumerate(ddp_chunks):
        for expert, buffers in ((False, ddp.buffers), (True, ddp.expert_parallel_buffers)):
            for buffer in buffers:
                position = expert_data_parallel_rank if expert else data_parallel_rank
                owned = (
                    owned_numel(buffer, position, allow_untested=allow_untested)
                    if use_distributed_optimizer
                    else buffer.numel_unpadded
                )
                plans.append(
                    BufferPlan(
                        chunk=index,
                        expert=expert,
                        param_dtype=buffer.param_dtype,
                        grad_dtype=buffer.grad_dtype,
                        num_params=sum(p.numel() for p in buffer.params),
                        numel_padded=buffer.numel,
                        num_buckets=len(buffer.buckets),
                        data_parallel_size=buffer.data_parallel_world_size,
                        owned_numel=owned,
                        has_param_buffer=buffer.param_data is not None,
                    )
                )
    return plans
