"""From Megatron-LM flags to the job a plan builds: Megatron-LM's derivations, then megatron-core configs.

`job_from_flags` does for the memory-relevant flags what Megatron-LM's `validate_args` and tokenizer
setup do (`megatron/training/arguments.py`, `megatron/training/tokenizer/tokenizer.py` at tag
core_v0.16.1): the target job's derivations every command shares (`megatron.job.target`: data-parallel
size, virtual-pipeline size, global batch, FFN size, KV channels, expert TP, padded vocabulary), then
the plan's own (recompute, the gradient dtype of bf16 training, MoE settings). `transformer_config`
and `ddp_config` then build megatron-core's own config objects (in `core_config`, where the built-in
entry builds its own too) the way Megatron-LM's `core_transformer_config_from_args` and `get_model` do, so megatron-core's checks
(`TransformerConfig.__post_init__`) run on the production configuration; `job_from_flags` runs them
before anything is planned.

What the plan cannot model is refused here with a ValueError naming the flag: FP8 parameters, the
precision-aware optimizer, more than one distributed-optimizer instance.
"""

from __future__ import annotations

import argparse
import dataclasses

from megatron.core.distributed import DistributedDataParallelConfig
from megatron.core.transformer import TransformerConfig

from prism_megatron.megatron.job import core_config, target
from prism_megatron.megatron.job.flags import ParsedFlags, parse_flags


@dataclasses.dataclass(frozen=True)
class Job:
    """A target job as Megatron-LM would configure it: its flags after Megatron-LM's derivations."""

    args: argparse.Namespace
    """Megatron-LM's `args`, for the modelled flags, after `validate_args`' derivations."""
    flags: ParsedFlags
    argv: tuple[str, ...]
    target: target.TargetJob
    """The target job (layout, schedule, batch, model shape), as every command derives it."""

    @property
    def world_size(self) -> int:
        return self.args.world_size

    @property
    def order(self) -> str:
        """Megatron-LM's rank order (`--use-tp-pp-dp-mapping` selects the second)."""
        return "tp-cp-ep-pp-dp" if self.args.use_tp_pp_dp_mapping else "tp-cp-ep-dp-pp"


def _require(condition: bool, message: str) -> None:
    if not condition:
        raise ValueError(message)


def _require_world_and_model(a: argparse.Namespace) -> None:
    _require(
        a.world_size is not None and a.world_size > 0,
        "--prism-world-size is required: the number of GPUs of the target job (e.g. --prism-world-size 8192)",
    )
    for flag in ("num_layers", "hidden_size", "num_attention_heads", "seq_length"):
        _require(getattr(a, flag), f"--{flag.replace('_', '-')} is required")
    _require(a.micro_batch_size is not None and a.micro_batch_size > 0, "--micro-batch-size is required")
    _require(
        a.vocab_size is not None or a.padded_vocab_size is not None,
        "--vocab-size (or --padded-vocab-size) is required",
    )


def _derive_precision(a: argparse.Namespace) -> None:
    _require(not (a.fp16 and a.bf16), "--fp16 and --bf16 exclude each other")
    _require(not a.fp8_param_gather, "--fp8-param-gather (FP8 parameters) is not modelled by the plan")
    _require(
        not a.use_precision_aware_optimizer, "--use-precision-aware-optimizer is not modelled by the plan"
    )
    _require(
        a.num_distributed_optimizer_instances == 1,
        "--num-distributed-optimizer-instances > 1 is not modelled by the plan",
    )
    _require(a.optimizer in ("adam", "sgd"), f"--optimizer {a.optimizer} is not modelled; use adam or sgd")
    a.params_dtype = core_config.params_dtype(a)
    if a.bf16 and not a.grad_reduce_in_bf16:
        a.accumulate_allreduce_grads_in_fp32 = True  # arguments.py: "bfloat16 requires fp32 accumulation"
    if a.grad_reduce_in_bf16:
        a.accumulate_allreduce_grads_in_fp32 = False
    if a.overlap_param_gather:
        _require(a.use_distributed_optimizer, "--overlap-param-gather needs --use-distributed-optimizer")
        _require(a.overlap_grad_reduce, "--overlap-param-gather needs --overlap-grad-reduce")


def _derive_model(a: argparse.Namespace) -> None:
    """The plan's own model settings (the shape is the target job's)."""
    if a.recompute_activations:
        a.recompute_granularity = "selective"
    if a.add_bias_linear:
        a.add_qkv_bias = True  # arguments.py keeps the two bias switches in sync


def job_from_flags(argv: list[str], world_size: int | None = None) -> Job:
    """Parse and derive a job from Megatron-LM flags (`world_size` overrides `--prism-world-size`),
    then run megatron-core's own checks of the model (`transformer_config`), before anything is built.

    Raises:
        ValueError: an unknown flag, a required flag missing, a size that does not divide, a model
            megatron-core refuses, or a feature that is not modelled.
    """
    flags = parse_flags(list(argv))
    a = argparse.Namespace(**vars(flags.namespace))
    if world_size is not None:
        a.world_size = world_size
    _require_world_and_model(a)
    job = target.derive(a, world_size=a.world_size)
    _derive_precision(a)
    _derive_model(a)
    planned = Job(args=a, flags=flags, argv=tuple(argv), target=job)
    transformer_config(planned)  # megatron-core's checks of the model, before anything is planned
    return planned


def transformer_config(job: Job) -> TransformerConfig:
    """megatron-core's TransformerConfig for the job, built as Megatron-LM builds it (`core_config`);
    ValueError when megatron-core's own checks refuse it."""
    return core_config.transformer_config(job.args)


def ddp_config(job: Job, data_parallel_size_with_cp: int) -> DistributedDataParallelConfig:
    """The DistributedDataParallelConfig Megatron-LM's `get_model` builds (`core_config`).

    Args:
        data_parallel_size_with_cp: DP x CP, which sets the default bucket size.
    """
    if job.args.ddp_num_buckets is not None:
        raise ValueError("--ddp-num-buckets is not modelled by the plan; use --ddp-bucket-size")
    return core_config.ddp_config(job.args, data_parallel_size_with_cp)
