"""The training programs a case runs in every process: the sleep-compute model, or the built-in GPT.

Both are megatron-core's schedules, DDP and optimizer around a model; they differ in the model and
in the step. The sleep model's step is megatron-core's part of Megatron-LM's train_step; the GPT is
the built-in entry's own model, mock data and `train_step` (`prism_megatron.megatron.entry.pretrain`).
"""

from __future__ import annotations

import argparse
import dataclasses
from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist


@dataclasses.dataclass
class Program:
    """One process's built model and optimizer, and its training step."""

    model: list
    optimizer: Any
    step: Callable[[], None]


def _parallel_flags(job) -> list[str]:
    flags = ["--tensor-model-parallel-size", str(job.tp), "--pipeline-model-parallel-size", str(job.pp)]
    if job.vpp:
        flags += ["--virtual-pipeline-model-parallel-size", str(job.vpp)]
    return flags


def gpt_args(job, device: str = "cpu") -> argparse.Namespace:
    """The built-in entry's arguments: the job's model flags plus its parallel sizes."""
    from prism_megatron.megatron.entry import arguments as pretrain_args

    args = pretrain_args.parse([*job.gpt_flags, *_parallel_flags(job), "--prism-device", device])
    pretrain_args.derive_world(args, job.world_size)
    return args


def initialize_model_parallel(job) -> None:
    """megatron-core's topology of the job (and, for the GPT, Megatron-LM's seeding rule)."""
    from megatron.core import parallel_state

    if job.gpt_flags:
        from prism_megatron.megatron.entry import pretrain
        from prism_megatron.megatron.run import runtime

        sizes = runtime.ParallelSizes(tp=job.tp, pp=job.pp, vpp=job.vpp)
        pretrain.initialize_model_parallel(gpt_args(job), sizes)
        return
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=job.tp,
        pipeline_model_parallel_size=job.pp,
        virtual_pipeline_model_parallel_size=job.vpp,
        create_gloo_process_groups=False,
    )


def build(job, virtual_rank: int, device: str = "cpu") -> Program:
    return _build_gpt(job, device) if job.gpt_flags else _build_sleep(job, virtual_rank)


def _build_gpt(job, device: str = "cpu") -> Program:
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from prism_megatron.megatron.entry import model, pretrain

    args = gpt_args(job, device)
    config = model.transformer_config(args)
    ddp_model = model.wrap_ddp(args, config, model.build_chunks(args, config))
    optimizer = model.build_optimizer(args, ddp_model)
    model.configure_schedule(args, config, ddp_model, optimizer)
    iterators = pretrain._data_iterators(args, len(ddp_model))
    forward_backward = get_forward_backward_func()
    return Program(
        model=ddp_model,
        optimizer=optimizer,
        step=lambda: pretrain.train_step(args, ddp_model, optimizer, iterators, forward_backward),
    )


def _build_sleep(job, virtual_rank: int) -> Program:
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer
    from megatron.core.pipeline_parallel import get_forward_backward_func

    from benchmarks.fidelity import sleep_model

    spec = sleep_model.SleepSpec(
        num_layers=job.num_layers,
        fwd_ms=job.fwd_ms,
        bwd_ms=job.bwd_ms,
        params_per_layer=job.params_per_layer,
        slowdown=job.slowdown(virtual_rank),
    )
    config = sleep_model.transformer_config(spec, tp=job.tp, pp=job.pp, vpp=job.vpp)
    chunks = sleep_model.build_chunks(spec, config)
    ddp_config = DistributedDataParallelConfig(
        overlap_grad_reduce=job.overlap_grad_reduce,
        bucket_size=job.params_per_layer if job.overlap_grad_reduce else None,  # a bucket per layer
    )
    model = [
        DistributedDataParallel(config=config, ddp_config=ddp_config, module=chunk, disable_bucketing=i > 0)
        for i, chunk in enumerate(chunks)
    ]
    optimizer = get_megatron_optimizer(
        OptimizerConfig(optimizer="adam", lr=1e-4, clip_grad=1.0), model, use_gloo_process_groups=False
    )
    if job.overlap_grad_reduce:  # as Megatron-LM's train() wires the schedule to DDP
        no_sync = [chunk.no_sync for chunk in model]
        grad_sync = [chunk.start_grad_sync for chunk in model]
        config.no_sync_func = no_sync[0] if len(model) == 1 else no_sync
        config.grad_sync_func = grad_sync[0] if len(model) == 1 else grad_sync
    config.finalize_model_grads_func = finalize_model_grads
    forward_backward = get_forward_backward_func()
    return Program(
        model=model,
        optimizer=optimizer,
        step=lambda: _sleep_step(job, spec, model, optimizer, forward_backward),
    )


def _sleep_step(job, spec, model, optimizer, forward_backward) -> None:
    """megatron-core's part of Megatron-LM's train_step: zero grads, forward/backward over the
    micro-batches, optimizer step (with its grad-norm reduction), and the data-parallel loss
    reduction on the last stage."""
    from megatron.core import parallel_state

    from benchmarks.fidelity import sleep_model

    for chunk in model:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    losses = forward_backward(
        forward_step_func=sleep_model.forward_step,
        data_iterator=[None] * len(model) if len(model) > 1 else None,
        model=model if len(model) > 1 else model[0],
        num_microbatches=job.num_microbatches,
        seq_length=spec.seq_length,
        micro_batch_size=spec.micro_batch_size,
        forward_only=False,
    )
    optimizer.step()
    if parallel_state.is_pipeline_last_stage(ignore_virtual=True):
        total = torch.cat([x["loss"] for x in losses]).sum().view(1)
        dist.all_reduce(total, group=parallel_state.get_data_parallel_group(with_context_parallel=True))
