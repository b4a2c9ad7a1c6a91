"""Model, DDP and optimizer of the built-in training entry, built from Megatron-LM-named arguments.

It mirrors what Megatron-LM's `pretrain_gpt.py` (`gpt_builder`) builds for the flags it supports with
`--transformer-impl local`: GPTModel with megatron-core's local layer specs (the decoder block spec
for MoE, so `--moe-layer-freq` mixes dense and MoE layers), uneven first and last pipeline stages,
RoPE with `--rotary-base`, multi-latent attention (see `local_mla`), shared experts, multi-token
prediction, one chunk per virtual pipeline stage; DDP with Megatron-LM's bucket rule; the Megatron
optimizer. It uses megatron-core only, so a user of megatron-core without Megatron-LM can run the
plugin and CI has a path that needs no Megatron-LM checkout. Where Transformer Engine has a kernel
the local layers lack, the substitute has the same parameters and math (`_moe_fields`, `local_mla`).
"""

from __future__ import annotations

import argparse
import dataclasses

import torch
from megatron.core import parallel_state
from megatron.core.distributed import (
    DistributedDataParallel,
    DistributedDataParallelConfig,
    finalize_model_grads,
)
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_decoder_block_spec,
    get_gpt_decoder_layer_specs,
    get_gpt_layer_local_spec,
    get_gpt_mtp_block_spec,
)
from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
from megatron.core.tensor_parallel import set_defaults_if_not_set_tensor_model_parallel_attributes
from megatron.core.transformer import MLATransformerConfig, TransformerConfig
from torch._subclasses.fake_tensor import FakeTensor

from prism_megatron.config import MODELLED_PREFIX
from prism_megatron.megatron.entry import local_mla, parallel_spec
from prism_megatron.megatron.job import target
from prism_megatron.patches import model_build

# Megatron-LM's default bucket size floor (training.py get_model: max(4e7, 1e6 * dp_cp)).
_MIN_BUCKET_SIZE_PARAMS = 40_000_000
_BUCKET_SIZE_PER_DP_RANK_PARAMS = 1_000_000


def params_dtype(args: argparse.Namespace) -> torch.dtype:
    if args.bf16:
        return torch.bfloat16
    if args.fp16:
        return torch.float16
    return torch.float32


def transformer_config(args: argparse.Namespace) -> TransformerConfig:
    """The TransformerConfig Megatron-LM would derive from these flags (fusions off: no TE/apex on CPU);
    an MLATransformerConfig with --multi-latent-attention.

    Raises:
        ValueError: megatron-core's own checks (`__post_init__`) refuse the combination of flags.
    """
    dtype = params_dtype(args)
    fields = dict(
        num_layers=args.num_layers,
        hidden_size=args.hidden_size,
        num_attention_heads=args.num_attention_heads,
        num_query_groups=args.num_query_groups if args.group_query_attention else None,
        kv_channels=args.kv_channels,
        ffn_hidden_size=args.ffn_hidden_size,
        qk_layernorm=args.qk_layernorm,
        tensor_model_parallel_size=args.tensor_model_parallel_size,
        pipeline_model_parallel_size=args.pipeline_model_parallel_size,
        virtual_pipeline_model_parallel_size=args.virtual_pipeline_model_parallel_size,
        num_layers_in_first_pipeline_stage=args.decoder_first_pipeline_num_layers,
        num_layers_in_last_pipeline_stage=args.decoder_last_pipeline_num_layers,
        account_for_embedding_in_pipeline_split=args.account_for_embedding_in_pipeline_split,
        account_for_loss_in_pipeline_split=args.account_for_loss_in_pipeline_split,
        context_parallel_size=args.context_parallel_size,
        cp_comm_type=args.cp_comm_type[0] if len(args.cp_comm_type) == 1 else args.cp_comm_type,
        expert_model_parallel_size=args.expert_model_parallel_size,
        expert_tensor_parallel_size=args.expert_tensor_parallel_size,
        sequence_parallel=args.sequence_parallel,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        bf16=args.bf16,
        fp16=args.fp16,
        hidden_dropout=args.hidden_dropout,
        attention_dropout=args.attention_dropout,
        init_method_std=args.init_method_std,
        use_cpu_initialization=args.use_cpu_initialization,
        add_bias_linear=not args.disable_bias_linear,
        gated_linear_unit=args.swiglu,
        activation_func=torch.nn.functional.silu if args.swiglu else torch.nn.functional.gelu,
        normalization=args.normalization,
        mtp_num_layers=args.mtp_num_layers,
        mtp_loss_scaling_factor=args.mtp_loss_scaling_factor,
        recompute_granularity=args.recompute_granularity,
        recompute_method=args.recompute_method,
        recompute_num_layers=args.recompute_num_layers,
        **_moe_fields(args),
        **_schedule_fields(args),
    )
    config_class = TransformerConfig
    if args.multi_latent_attention:
        config_class = MLATransformerConfig
        fields.update(_mla_fields(args))
    try:
        return config_class(**fields)
    except (AssertionError, ValueError) as exc:
        raise ValueError(f"megatron-core refuses these flags: {exc}") from exc


def _moe_fields(args: argparse.Namespace) -> dict:
    """MoE settings. `--moe-grouped-gemm` is built as megatron-core's SequentialMLP: one fc1 and one fc2
    weight per expert, the shapes of Transformer Engine's grouped experts, and the same per-expert
    GEMMs (TE's grouped kernel and the legacy GroupedMLP need packages a CPU machine has not)."""
    return dict(
        num_moe_experts=args.num_experts,
        moe_layer_freq=args.moe_layer_freq,
        moe_ffn_hidden_size=args.moe_ffn_hidden_size,
        moe_shared_expert_intermediate_size=args.moe_shared_expert_intermediate_size,
        moe_grouped_gemm=False,
        moe_token_dispatcher_type=args.moe_token_dispatcher_type,
        moe_router_topk=args.moe_router_topk,
        moe_router_score_function=args.moe_router_score_function,
        moe_router_dtype=args.moe_router_dtype,
        moe_router_enable_expert_bias=args.moe_router_enable_expert_bias,
        moe_router_topk_scaling_factor=args.moe_router_topk_scaling_factor,
        moe_router_num_groups=args.moe_router_num_groups,
        moe_router_group_topk=args.moe_router_group_topk,
        moe_router_load_balancing_type=args.moe_router_load_balancing_type,
        moe_aux_loss_coeff=args.moe_aux_loss_coeff,
    )


def _mla_fields(args: argparse.Namespace) -> dict:
    """MLATransformerConfig's own fields (its RoPE lives in the attention, with --rotary-base)."""
    return dict(
        multi_latent_attention=True,
        q_lora_rank=args.q_lora_rank,
        kv_lora_rank=args.kv_lora_rank,
        qk_head_dim=args.qk_head_dim,
        qk_pos_emb_head_dim=args.qk_pos_emb_head_dim,
        v_head_dim=args.v_head_dim,
        rotary_base=args.rotary_base,
        rotary_scaling_factor=args.rotary_scaling_factor,
        mscale=args.mscale,
        mscale_all_dim=args.mscale_all_dim,
    )


def _schedule_fields(args: argparse.Namespace) -> dict:
    """Kernel fusions off (no TE or apex) and the pipeline schedule's settings."""
    return dict(
        gradient_accumulation_fusion=False,
        masked_softmax_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        deallocate_pipeline_outputs=True,
        batch_p2p_comm=not args.overlap_p2p_comm,
        overlap_p2p_comm=args.overlap_p2p_comm,
        microbatch_group_size_per_vp_stage=args.microbatch_group_size_per_vp_stage,
        variable_seq_lengths=args.variable_seq_lengths,
    )


def _layer_spec(args: argparse.Namespace, config: TransformerConfig, vp_stage: int | None):
    """The decoder spec Megatron-LM's `gpt_builder` picks with `--transformer-impl local`."""
    if args.num_experts:
        spec = get_gpt_decoder_block_spec(
            config, use_transformer_engine=False, normalization=args.normalization, vp_stage=vp_stage
        )
    else:
        spec = _local_layer_spec(args)
    return local_mla.with_mla_core_attention(spec) if args.multi_latent_attention else spec


def _local_layer_spec(args: argparse.Namespace):
    return get_gpt_layer_local_spec(
        args.num_experts,
        False,  # grouped GEMM: see _moe_fields
        args.qk_layernorm,
        args.multi_latent_attention,
        normalization=args.normalization,
    )


def _mtp_spec(args: argparse.Namespace, config: TransformerConfig, layer_spec, vp_stage: int | None):
    """Megatron-LM's multi-token-prediction block spec: its layers are built like the last decoder
    layer (a stage without decoder layers uses the plain layer spec); None on stages without MTP."""
    if args.mtp_num_layers is None:
        return None
    if getattr(layer_spec, "layer_specs", None) == []:
        last_layer = _local_layer_spec(args)
    else:
        last_layer = get_gpt_decoder_layer_specs(
            config, use_transformer_engine=False, normalization=args.normalization, vp_stage=vp_stage
        )[-1]
    spec = get_gpt_mtp_block_spec(config, last_layer, use_transformer_engine=False, vp_stage=vp_stage)
    return local_mla.with_mla_core_attention(spec) if args.multi_latent_attention and spec else spec


def build_chunks(args: argparse.Namespace, config: TransformerConfig) -> list[GPTModel]:
    """One GPTModel per virtual pipeline stage this rank holds (one without VPP)."""
    pp_rank = parallel_state.get_pipeline_model_parallel_rank()
    pp_size = parallel_state.get_pipeline_model_parallel_world_size()
    vp_size = args.virtual_pipeline_model_parallel_size if pp_size > 1 else None
    stages = range(vp_size) if vp_size else [None]
    chunks = []
    for vp_stage in stages:
        first_chunk = vp_stage is None or vp_stage == 0
        last_chunk = vp_stage is None or vp_stage == vp_size - 1
        chunk = _gpt_model(
            args,
            config,
            vp_stage,
            pre_process=pp_rank == 0 and first_chunk,
            post_process=pp_rank == pp_size - 1 and last_chunk,
        )
        chunk.vp_stage = vp_stage
        for param in chunk.parameters():
            set_defaults_if_not_set_tensor_model_parallel_attributes(param)
        if torch.cuda.is_available():  # as Megatron-LM's get_model: modules built on the host move over
            chunk.cuda(torch.cuda.current_device())
        if args.bf16 or args.fp16:
            chunk = _to_dtype(chunk, params_dtype(args))
        chunks.append(chunk)
    return chunks


def _to_dtype(chunk: torch.nn.Module, dtype: torch.dtype) -> torch.nn.Module:
    """`chunk.to(dtype)`; on fake tensors (a modelled GPU) tensor by tensor, as torch's `Module.to`
    would swap each parameter with its converted copy, which fake tensors refuse."""
    tensors = [*chunk.parameters(), *chunk.buffers()]
    if not any(isinstance(t, FakeTensor) for t in tensors):
        return chunk.to(dtype)
    for tensor in tensors:
        if tensor.is_floating_point() and tensor.dtype != dtype:
            tensor.data = tensor.data.to(dtype)
    return chunk


def _gpt_model(
    args: argparse.Namespace,
    config: TransformerConfig,
    vp_stage: int | None,
    *,
    pre_process: bool,
    post_process: bool,
) -> GPTModel:
    """One model chunk, as Megatron-LM's `gpt_builder` makes it."""
    layer_spec = _layer_spec(args, config, vp_stage)
    modelled = str(getattr(args, "prism_device", "")).startswith(MODELLED_PREFIX)
    mtp_spec = parallel_spec.mtp_spec(
        _mtp_spec(args, config, layer_spec, vp_stage), config, modelled=modelled
    )
    layer_spec = parallel_spec.decoder_spec(layer_spec, config, vp_stage, modelled=modelled)
    with model_build.mla_constructible(allow_untested=args.prism_allow_untested_megatron):
        return GPTModel(
            config=config,
            transformer_layer_spec=layer_spec,
            vocab_size=target.padded_vocab_size(args),
            max_sequence_length=args.max_position_embeddings,
            pre_process=pre_process,
            post_process=post_process,
            parallel_output=True,
            share_embeddings_and_output_weights=not args.untie_embeddings_and_output_weights,
            position_embedding_type=args.position_embedding_type,
            rotary_base=args.rotary_base,
            mtp_block_spec=mtp_spec,
            vp_stage=vp_stage,
        )


def ddp_config(args: argparse.Namespace) -> DistributedDataParallelConfig:
    """Megatron-LM's DDP config rule: default bucket size grows with DP; no buckets without overlap."""
    bucket_size = args.ddp_bucket_size
    if bucket_size is None:
        dp_cp = parallel_state.get_data_parallel_world_size(with_context_parallel=True)
        bucket_size = max(_MIN_BUCKET_SIZE_PARAMS, _BUCKET_SIZE_PER_DP_RANK_PARAMS * dp_cp)
    if not args.overlap_grad_reduce:
        bucket_size = None
    return DistributedDataParallelConfig(
        grad_reduce_in_fp32=args.accumulate_allreduce_grads_in_fp32,
        overlap_grad_reduce=args.overlap_grad_reduce,
        overlap_param_gather=args.overlap_param_gather,
        use_distributed_optimizer=args.use_distributed_optimizer,
        bucket_size=bucket_size,
    )


def wrap_ddp(
    args: argparse.Namespace, config: TransformerConfig, chunks: list[GPTModel]
) -> list[DistributedDataParallel]:
    """Wrap chunks like Megatron-LM: bucketing only for the first chunk."""
    cfg = ddp_config(args)
    return [
        DistributedDataParallel(config=config, ddp_config=cfg, module=chunk, disable_bucketing=index > 0)
        for index, chunk in enumerate(chunks)
    ]


def optimizer_config(args: argparse.Namespace) -> OptimizerConfig:
    return OptimizerConfig(
        optimizer="adam",
        lr=args.lr,
        min_lr=args.min_lr,
        weight_decay=args.weight_decay,
        adam_beta1=args.adam_beta1,
        adam_beta2=args.adam_beta2,
        clip_grad=args.clip_grad,
        bf16=args.bf16,
        fp16=args.fp16,
        params_dtype=params_dtype(args),
        use_distributed_optimizer=args.use_distributed_optimizer,
        overlap_param_gather=args.overlap_param_gather,
    )


def build_optimizer(args: argparse.Namespace, model: list[DistributedDataParallel]):
    # No gloo groups: the virtual world has none (its gloo groups would be prism groups anyway), and
    # the distributed optimizer only needs them for checkpointing, which this entry does not do.
    return get_megatron_optimizer(optimizer_config(args), model, use_gloo_process_groups=False)


def configure_schedule(args: argparse.Namespace, config: TransformerConfig, model: list, optimizer) -> None:
    """Set the schedule hooks on the config exactly as Megatron-LM's train() does."""
    config.grad_scale_func = optimizer.scale_loss
    if args.overlap_grad_reduce:
        no_sync = [chunk.no_sync for chunk in model]
        config.no_sync_func = no_sync[0] if len(model) == 1 else no_sync
        if args.align_grad_reduce:
            grad_sync = [chunk.start_grad_sync for chunk in model]
            config.grad_sync_func = grad_sync[0] if len(model) == 1 else grad_sync
    if args.overlap_param_gather and args.align_param_gather:
        param_sync = [chunk.start_param_sync for chunk in model]
        config.param_sync_func = param_sync[0] if len(model) == 1 else param_sync
    config.finalize_model_grads_func = finalize_model_grads


def num_parameters(chunks: list[torch.nn.Module]) -> int:
    return sum(p.numel() for chunk in chunks for p in chunk.parameters())


def describe(config: TransformerConfig) -> dict:
    """A JSON-friendly summary of the model shape (for results files)."""
    keys = ("num_layers", "hidden_size", "num_attention_heads", "ffn_hidden_size", "num_moe_experts")
    return {k: getattr(config, k) for k in keys if k in {f.name for f in dataclasses.fields(config)}}


def device() -> torch.device:
    """The real rank's device: its CUDA device, or the CPU under the CPU device shim."""
    return (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )
