"""megatron-core's configs of a job, built in one place: `TransformerConfig` (or `MLATransformerConfig`)
and `DistributedDataParallelConfig`, from Megatron-LM's args the way its
`core_transformer_config_from_args` and `get_model` build them (megatron/training/arguments.py and
training.py, tag core_v0.16.1): every field named as an argument is copied, then the fields Megatron-LM
derives or renames are set. The memory plan (`job.py`) and the built-in entry (`entry/model.py`) both
build theirs here; the entry passes what differs for a CPU run without Transformer Engine or apex
(its fusions off) as `overrides`.
"""

from __future__ import annotations

import argparse
import dataclasses
from typing import Any

import torch
import torch.nn.functional as F
from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.transformer import MLATransformerConfig, TransformerConfig

MIN_BUCKET_SIZE_PARAMS = 40_000_000
BUCKET_SIZE_PER_DP_RANK_PARAMS = 1_000_000
"""Megatron-LM's default gradient bucket (training.py `get_model`): max(4e7, 1e6 x DP x CP) parameters."""


def params_dtype(a: argparse.Namespace) -> torch.dtype:
    """The parameters' dtype: bf16, fp16, else fp32 (Megatron-LM's `validate_args`)."""
    return torch.bfloat16 if a.bf16 else torch.float16 if a.fp16 else torch.float32


def _copied(config_class: type, a: argparse.Namespace) -> dict[str, Any]:
    return {
        f.name: getattr(a, f.name) for f in dataclasses.fields(config_class) if f.init and hasattr(a, f.name)
    }


def _one_or_list(value: Any) -> Any:
    """A one-element list (`nargs="+"`) as its element, as Megatron-LM's `validate_args` leaves it."""
    return value[0] if isinstance(value, list) and len(value) == 1 else value


def transformer_config(a: argparse.Namespace, **overrides: Any) -> TransformerConfig:
    """megatron-core's TransformerConfig of these args (an MLATransformerConfig with
    --multi-latent-attention), `overrides` set last.

    Runs megatron-core's own validation (`__post_init__`); its AssertionError or ValueError is
    re-raised as ValueError so the command line reports it as a configuration mistake.
    """
    config_class = MLATransformerConfig if a.multi_latent_attention else TransformerConfig
    kwargs = _copied(config_class, a)
    dtype = params_dtype(a)
    kwargs.update(
        persist_layer_norm=not getattr(a, "no_persist_layer_norm", False),
        deallocate_pipeline_outputs=True,
        params_dtype=dtype,
        pipeline_dtype=dtype,
        batch_p2p_comm=not a.overlap_p2p_comm,
        num_moe_experts=a.num_experts,
        num_layers_in_first_pipeline_stage=a.decoder_first_pipeline_num_layers,
        num_layers_in_last_pipeline_stage=a.decoder_last_pipeline_num_layers,
        num_query_groups=a.num_query_groups if a.group_query_attention else None,
        moe_layer_freq=a.moe_layer_freq,
        moe_router_load_balancing_type=_one_or_list(a.moe_router_load_balancing_type),
        moe_aux_loss_coeff=_one_or_list(a.moe_aux_loss_coeff),
    )
    if len(a.cp_comm_type) == 1:
        kwargs["cp_comm_type"] = a.cp_comm_type[0]
    if a.swiglu:
        kwargs.update(activation_func=F.silu, gated_linear_unit=True)
    elif getattr(a, "squared_relu", False):
        kwargs["activation_func"] = lambda x: torch.pow(F.relu(x), 2)
    if config_class is TransformerConfig:
        kwargs.pop("rope_type", None)
    kwargs.update(overrides)
    try:
        return config_class(**kwargs)
    except (AssertionError, ValueError) as exc:
        raise ValueError(f"megatron-core refuses these flags: {exc}") from exc


def ddp_config(
    a: argparse.Namespace, data_parallel_size_with_cp: int, **overrides: Any
) -> DistributedDataParallelConfig:
    """megatron-core's DistributedDataParallelConfig of these args, `overrides` set last; the bucket
    size: --ddp-bucket-size, else Megatron-LM's default for DP x CP, and none without
    --overlap-grad-reduce."""
    kwargs = _copied(DistributedDataParallelConfig, a)
    kwargs.update(
        grad_reduce_in_fp32=a.accumulate_allreduce_grads_in_fp32,
        check_for_nan_in_grad=False,
        pad_buckets_for_high_nccl_busbw=getattr(a, "ddp_pad_buckets_for_high_nccl_busbw", False),
        average_in_collective=getattr(a, "ddp_average_in_collective", False),
        bucket_size=a.ddp_bucket_size,
        **overrides,
    )
    config = DistributedDataParallelConfig(**kwargs)
    if config.bucket_size is None:
        config.bucket_size = max(
            MIN_BUCKET_SIZE_PARAMS, BUCKET_SIZE_PER_DP_RANK_PARAMS * data_parallel_size_with_cp
        )
    if not config.overlap_grad_reduce:
        config.bucket_size = None
    return config
