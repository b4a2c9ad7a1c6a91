"""The built-in GPT pretraining entry: megatron-core only, mock data, Megatron-LM's flag names.

It runs the step of Megatron-LM's `pretrain_gpt.py` (`train_step`: zero the grad buffers, the
schedule's forward/backward over all micro-batches, optimizer step, the model-parallel reductions of
`update_successful` and grad norm, the data-parallel loss reduction on the last stage) for the flags
`entry.arguments` supports. Not reproduced: the LR schedule (constant LR), evaluation, checkpoints.

Run it under torchrun (`python -m prism_megatron.launch` or `prism-megatron emulate`) or directly as
`python -m prism_megatron.megatron.entry.pretrain ...` for one process.
"""

from __future__ import annotations

import argparse
import contextlib
import functools
import inspect
import math
import sys
from typing import Any

import torch
import torch.distributed as dist
from megatron.core import parallel_state
from megatron.core.pipeline_parallel import get_forward_backward_func
from megatron.core.tensor_parallel import model_parallel_cuda_manual_seed
from megatron.core.transformer import TransformerConfig
from megatron.core.utils import get_attr_wrapped_model, get_batch_on_this_cp_rank

from prism_megatron.config import PrismConfig
from prism_megatron.megatron.entry import arguments as pretrain_args
from prism_megatron.megatron.entry import data, model, training_log
from prism_megatron.megatron.job import target
from prism_megatron.megatron.run import collectives, modelled_device, modelled_fusions, results, runtime
from prism_megatron.passes import world
from prism_megatron.patches import catalog
from prism_megatron.replay import timeline


def initialize_model_parallel(args: argparse.Namespace, sizes: target.ParallelSizes) -> None:
    """Megatron's own topology builder, then Megatron-LM's seeding rule (seed + 100 * PP rank)."""
    world.initialize_groups(
        sizes, hierarchical_context_parallel_sizes=args.hierarchical_context_parallel_sizes
    )
    model_parallel_cuda_manual_seed(args.seed + 100 * parallel_state.get_pipeline_model_parallel_rank())


def loss_func(loss_mask: torch.Tensor, output_tensor: torch.Tensor):
    """Megatron-LM's GPT loss: token-summed loss, token count, and the report pair."""
    losses = output_tensor.view(-1).float()
    mask = loss_mask.view(-1).float()
    loss = torch.sum(losses * mask)
    num_tokens = mask.sum().clone().detach().to(torch.int)
    return loss, num_tokens, {"lm loss": torch.cat([loss.clone().detach().view(1), num_tokens.view(1)])}


def _this_cp_ranks_chunks(batch: dict) -> dict:
    """megatron-core's load-balanced CP split of an unpacked batch. 0.19 added `is_hybrid_cp` (for packed
    sequences) without a default, and without a `cu_seqlens` entry both releases take the same
    per-sequence split; the CP group is passed, as 0.19 no longer falls back to parallel_state's."""
    extra = {}
    if "is_hybrid_cp" in inspect.signature(get_batch_on_this_cp_rank).parameters:
        extra["is_hybrid_cp"] = False
    return get_batch_on_this_cp_rank(batch, cp_group=parallel_state.get_context_parallel_group(), **extra)


def forward_step(data_iterator, gpt_model):
    """Read a batch only where Megatron-LM does (first/last stage chunk), keep this CP rank's two
    chunks of its sequence (Megatron's load-balanced split), then run the chunk."""
    vp_stage = get_attr_wrapped_model(gpt_model, "vp_stage")
    first = parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
    last = parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
    batch = next(data_iterator) if first or last else None
    device = torch.cuda.current_device() if torch.cuda.is_available() else "cpu"
    batch = _this_cp_ranks_chunks({k: v.to(device) for k, v in batch.items()}) if batch else {}
    output = gpt_model(
        batch.get("tokens"),
        batch.get("position_ids"),
        None,
        labels=batch.get("labels"),
        loss_mask=batch.get("loss_mask"),
    )
    return output, functools.partial(loss_func, batch.get("loss_mask"))


def _data_iterators(args: argparse.Namespace, num_chunks: int):
    dp_rank = parallel_state.get_data_parallel_rank()
    make = functools.partial(
        data.mock_batches,
        seed=args.seed,
        seq_length=args.seq_length,
        vocab_size=args.vocab_size,
        micro_batch_size=args.micro_batch_size,
        global_batch_size=args.global_batch_size,
        dp_rank=dp_rank,
        dp_size=args.data_parallel_size,
    )
    iterators = [make() for _ in range(num_chunks)]
    return iterators if num_chunks > 1 else iterators[0]


def _model_parallel_reduce(value: float, op: dist.ReduceOp) -> float:
    tensor = torch.tensor([value], dtype=torch.float32, device=model.device())
    dist.all_reduce(tensor, op=op, group=parallel_state.get_model_parallel_group())
    return tensor.item()


def train_step(args, ddp_model, optimizer, iterators, forward_backward) -> dict[str, Any]:
    """One iteration, as Megatron-LM's train_step runs it."""
    for chunk in ddp_model:
        chunk.zero_grad_buffer()
    optimizer.zero_grad()
    losses = forward_backward(
        forward_step_func=forward_step,
        data_iterator=iterators,
        model=ddp_model,
        num_microbatches=args.global_batch_size // (args.micro_batch_size * args.data_parallel_size),
        seq_length=args.seq_length,
        micro_batch_size=args.micro_batch_size,
        decoder_seq_length=args.seq_length,
        forward_only=False,
    )
    update_successful, grad_norm, _ = optimizer.step()
    update_successful = bool(_model_parallel_reduce(float(update_successful), dist.ReduceOp.MIN))
    # Megatron-LM's reduce_max_stat_across_model_parallel_group: -1 stands for "no rank has one"
    # (a step the loss scaler skipped).
    grad_norm = _model_parallel_reduce(-1.0 if grad_norm is None else grad_norm, dist.ReduceOp.MAX)
    grad_norm = None if grad_norm == -1.0 else grad_norm
    loss = None
    if parallel_state.is_pipeline_last_stage(ignore_virtual=True):
        total = torch.vstack([x["lm loss"].view(-1) for x in losses]).sum(dim=0)
        dist.all_reduce(total, group=parallel_state.get_data_parallel_group(with_context_parallel=True))
        loss = (total[0] / total[1]).item()
    return {"loss": loss, "grad_norm": grad_norm, "update_successful": update_successful}


def train(args: argparse.Namespace, config: TransformerConfig, rt: runtime.Runtime) -> dict[str, Any]:
    """Build model, DDP and optimizer, run --train-iters iterations, and return the results; on a
    modelled GPU (--prism-device model:<gpu>) all of it on fake tensors, timed by the GPU model."""
    gpu = rt.config.emulation.modelled_gpu
    if gpu is None:
        return _train(args, config, rt)
    device = modelled_device.ModelledDevice(gpu)
    with device.active():
        out = _train(args, config, rt, device)
    out["modelled_device"] = device.summary()
    return out


def _train(
    args: argparse.Namespace,
    config: TransformerConfig,
    rt: runtime.Runtime,
    device: modelled_device.ModelledDevice | None = None,
) -> dict[str, Any]:
    chunks = model.build_chunks(args, config)
    ddp_model = model.wrap_ddp(args, config, chunks)
    optimizer = model.build_optimizer(args, ddp_model)
    model.configure_schedule(args, config, ddp_model, optimizer)
    if device:
        modelled_fusions.charge_as_a_gpu_runs(device, ddp_model, optimizer, args)
    else:
        _tp_comm_overlap_note(args, rt)
    iterators = _data_iterators(args, len(ddp_model))
    forward_backward = get_forward_backward_func()
    record = runtime.TrainingRecord(rt)
    logger = _logger(args, rt)
    for iteration in range(args.train_iters):
        record.before_step(ddp_model, optimizer)
        if device:
            device.iteration_begins()
        start = timeline.mark()  # device time, as every time of the passes
        step = train_step(args, ddp_model, optimizer, iterators, forward_backward)
        end = timeline.mark()
        if device:
            device.iteration_ends()
        step = record.after_step(step, marks=(start, end))
        logger.step(iteration + 1, step, loss_scale=_loss_scale(optimizer))
    mem = record.finish()
    logger.close()
    return results.collect(
        rt=rt, ddp_model=ddp_model, optimizer=optimizer, iterations=record.iterations, memory_report=mem
    )


def _tp_comm_overlap_note(args: argparse.Namespace, rt: runtime.Runtime) -> None:
    """--tp-comm-overlap off a modelled GPU: a note on the first real rank, since the local layers run
    the collectives as they are (a modelled GPU charges TE's userbuffers overlap: `tp_overlap`).

    Accepted rather than refused on cpu and cuda: a production command line (Megatron-LM's published
    benchmark runs pass the flag) must run unchanged on every device, as the entry's other Transformer
    Engine switches do, and on a CPU the emulation's purpose is functional (groups, shapes, memory),
    which the overlap does not change; the note keeps a user from reading its timing as overlapped."""
    if args.tp_comm_overlap and rt.virtual_rank == (
        min(rt.real_ranks()) if rt.config.emulation.emulate else 0
    ):
        print(pretrain_args.TP_COMM_OVERLAP_NOTE, file=sys.stderr, flush=True)


def _logger(args: argparse.Namespace, rt: runtime.Runtime) -> training_log.TrainingLogger:
    """Megatron's iteration line on every real rank; the writers on the last real rank (Megatron's
    rank W-1, usually virtual under emulation), and not in the capture pass: its iterations are the
    slice's recording, not the run a user reads in TensorBoard."""
    from prism_megatron.report.flops import model_flops_per_iteration

    world_size = dist.get_world_size()
    last_real = max(rt.world.real_ranks) if rt.world else world_size - 1
    job = target.target_job(args, world_size=world_size)  # the job the report counts FLOPs of
    return training_log.TrainingLogger(
        args,
        world_size=world_size,
        writes_scalars=rt.virtual_rank == last_real and getattr(rt.phase, "name", "") != "capture",
        flops=model_flops_per_iteration(job.model, job.global_batch_size),
    )


def _loss_scale(optimizer) -> float:
    """Megatron's `optimizer.get_loss_scale().item()`: 1.0 without fp16's dynamic scaler."""
    scale = optimizer.get_loss_scale()
    return float(scale.item() if isinstance(scale, torch.Tensor) else scale)


def run(argv: list[str]) -> dict[str, Any]:
    """Parse, bring up, train, tear down; returns this rank's results (also written to --prism-out)."""
    args = pretrain_args.parse(argv)
    pretrain_args.check_local_spec(args)
    transformer_config = model.transformer_config(args)  # megatron-core's checks, before any process group
    config = PrismConfig.from_args(args)
    if config.patches.list_patches:
        print(catalog.table())
        return {}
    rt = runtime.Runtime.start(config)
    rt.sizes = target.parallel_sizes(args)
    try:
        rt.bring_up()
        pretrain_args.derive_world(args, dist.get_world_size())
        initialize_model_parallel(args, rt.sizes)
        rt.before_model()
        results.check_writable(rt.config, rt.virtual_rank)
        recorder = collectives.CollectiveRecorder()
        # On a modelled GPU the recorder would list nothing: the device's dispatch layer, above it,
        # serves every c10d op below all modes (`modelled_device`), so it is not entered there,
        # which spares each of the rank's ops one Python dispatch layer.
        with recorder if config.emulation.modelled_gpu is None else contextlib.nullcontext():
            out = train(args, transformer_config, rt)
        out["collectives"] = recorder.as_dict()
        rt.finish_phase(out)
        results.write(rt.config, rt.virtual_rank, out)
        return out
    finally:
        parallel_state.destroy_model_parallel()
        rt.close()


def main(argv: list[str] | None = None) -> int:
    out = run(list(sys.argv[1:] if argv is None else argv))
    finite = all(
        it["grad_norm"] is None or math.isfinite(it["grad_norm"]) for it in out.get("iterations", [])
    )
    return 0 if finite else 1


if __name__ == "__main__":
    sys.exit(main())
