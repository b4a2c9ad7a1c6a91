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
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.enums import AttnBackend
from torch._subclasses.fake_tensor import FakeTensor

from prism_megatron.config import MODELLED_PREFIX
from prism_megatron.megatron.job import core_config, target
from prism_megatron.megatron.layers import local_mla, parallel_spec
from prism_megatron.patches import model_build


def transformer_config(args: argparse.Namespace) -> TransformerConfig:
    """The TransformerConfig Megatron-LM would derive from these flags (`job.core_config`, the plan's
    builder), with what this entry changes: kernel fusions off (no TE or apex on CPU), the MoE
    experts as per-expert GEMMs (`_moe_fields`), the bias switch under Megatron-LM's flag name.

    Raises:
        ValueError: megatron-core's own checks (`__post_init__`) refuse the combination of flags.
    """
    return core_config.transformer_config(
        args,
        add_bias_linear=not args.disable_bias_linear,
        attention_backend=AttnBackend[args.attention_backend],
        **_moe_fields(args),
        **_schedule_fields(args),
    )


def _moe_fields(args: argparse.Namespace) -> dict:
    """`--moe-grouped-gemm` is built as megatron-core's SequentialMLP: one fc1 and one fc2 weight per
    expert, the shapes of Transformer Engine's grouped experts, and the same per-expert GEMMs (TE's
    grouped kernel and the legacy GroupedMLP need packages a CPU machine has not)."""
    return dict(moe_grouped_gemm=False)


def _schedule_fields(args: argparse.Namespace) -> dict:
    """Kernel fusions off: no TE or apex."""
    return dict(
        gradient_accumulation_fusion=False,
        masked_softmax_fusion=False,
        bias_activation_fusion=False,
        bias_dropout_fusion=False,
        persist_layer_norm=False,
        apply_rope_fusion=False,
        cross_entropy_loss_fusion=False,
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
            chunk = _to_dtype(chunk, core_config.params_dtype(args))
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
    """Megatron-LM's DDP config (`job.core_config`) for this rank's data-parallel group."""
    dp_cp = parallel_state.get_data_parallel_world_size(with_context_parallel=True)
    return core_config.ddp_config(args, dp_cp)


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
        params_dtype=core_config.params_dtype(args),
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
