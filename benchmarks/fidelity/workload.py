"""One process of a sleep-compute case: megatron-core schedules, DDP and optimizer around the sleep model.

The same function runs every process of the three kinds of run a case needs, so the program the
emulation times is the program the real run timed:

* ``real``: one of W real processes on gloo (the ground truth);
* ``capture``: a real rank among virtual peers that arrive at once, recording every op (the slice);
* ``emulate``: a real rank among virtual peers the replay engine times from a schedule.

An iteration starts where the previous optimizer step ended (the first after set-up), with no
barrier, and its time is measured on this process alone.
"""

from __future__ import annotations

import dataclasses
import os
import time
from typing import Any

import torch
import torch.distributed as dist

MODES = ("real", "capture", "emulate")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Job:
    """The target job of a case: parallel sizes, schedule, and the sleep model's shape."""

    tp: int
    pp: int
    dp: int
    vpp: int | None = None
    num_microbatches: int
    num_layers: int
    fwd_ms: float
    bwd_ms: float
    overlap_grad_reduce: bool = False
    params_per_layer: int = 4096
    stragglers: tuple[tuple[int, float], ...] = ()
    """(virtual rank, compute factor) of each slow rank."""

    @property
    def world_size(self) -> int:
        return self.tp * self.pp * self.dp

    def slowdown(self, virtual_rank: int) -> float:
        return dict(self.stragglers).get(virtual_rank, 1.0)

    def layout_kwargs(self) -> dict[str, Any]:
        return {"world_size": self.world_size, "tp": self.tp, "pp": self.pp, "vpp": self.vpp}


@dataclasses.dataclass(frozen=True, kw_only=True)
class Request:
    """What one process runs."""

    job: Job
    mode: str
    iterations: int
    real_ranks: tuple[int, ...] = ()
    """Emulated modes: the virtual ranks run by real processes (physical rank = index)."""
    schedule: Any = None
    """emulate: this rank's `ReplaySchedule`."""
    record_from: int = 0
    """capture: the first iteration whose ops are recorded (earlier ones warm up)."""
    memory_iterations: int = 2
    """Iterations after the timed ones, under the live-storage tracker (peak memory)."""
    trace_exchanges: bool = False
    """real: also note when each pipeline exchange starts and returns (for diagnosing a case)."""


def _one_thread() -> None:
    """Many processes share two cores: one thread each, and timed sleeps without timer slack."""
    torch.set_num_threads(1)
    from prism_megatron.replay import clock

    clock.lower_timer_slack()


def _bring_up(request: Request):
    """The distributed world and megatron-core's topology; returns the prism runtime."""
    from megatron.core import parallel_state

    from prism_megatron.config import EmulationConfig, PrismConfig
    from prism_megatron.megatron import runtime

    job = request.job
    emulate = request.mode != "real"
    emulation = EmulationConfig(
        emulate=emulate,
        world_size=job.world_size if emulate else None,
        ranks=",".join(str(r) for r in request.real_ranks) if emulate else None,
        device="cpu",
    )
    rt = runtime.start(PrismConfig(emulation=emulation))
    rt.sizes = runtime.ParallelSizes(tp=job.tp, pp=job.pp, vpp=job.vpp)
    runtime.bring_up(rt)
    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=job.tp,
        pipeline_model_parallel_size=job.pp,
        virtual_pipeline_model_parallel_size=job.vpp,
        create_gloo_process_groups=False,
    )
    runtime.before_model(rt)
    return rt


def _build(job: Job, virtual_rank: int):
    from megatron.core.distributed import (
        DistributedDataParallel,
        DistributedDataParallelConfig,
        finalize_model_grads,
    )
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from prism_megatron.megatron import sleep_model

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
    return spec, model, optimizer


def _train_step(job: Job, spec, model, optimizer, forward_backward) -> None:
    """megatron-core's part of Megatron-LM's train_step: zero grads, forward/backward over the
    micro-batches, optimizer step (with its grad-norm reduction), and the data-parallel loss
    reduction on the last stage."""
    from megatron.core import parallel_state

    from prism_megatron.megatron import sleep_model

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


def _record_exchanges(p2p_class, windows: list[tuple[int, int]]) -> None:
    """Capture: note when each pipeline exchange starts and returns (its ops form one batch)."""
    communicate = p2p_class._communicate

    def recorded(self, **kwargs):
        enter_ns = time.monotonic_ns()
        try:
            return communicate(self, **kwargs)
        finally:
            windows.append((enter_ns, time.monotonic_ns()))

    p2p_class._communicate = recorded


def _iterate(request: Request, step, count: int, iteration_base: int, starts_ns: list, ends_ns: list) -> None:
    """`count` iterations, each timed from the end of the previous one (no barrier)."""
    import prism_megatron.replay as replay

    previous_ns = ends_ns[-1] if ends_ns else time.monotonic_ns()
    for iteration in range(iteration_base, iteration_base + count):
        if request.mode != "real" and iteration == request.record_from:
            replay.start_recording()
        starts_ns.append(replay.mark_iteration_start() if request.mode != "real" else previous_ns)
        step()
        previous_ns = time.monotonic_ns()
        ends_ns.append(previous_ns)


def run(request: Request) -> dict[str, Any]:
    """Run one process of a case; returns its iteration times, peak memory and (capture) op log.

    The timed iterations run first; then `memory_iterations` more under the live-storage tracker
    (its dispatch hook costs CPU time per op, so it stays out of the timed ones).
    """
    from megatron.core import parallel_state
    from megatron.core.pipeline_parallel import get_forward_backward_func

    import prism_megatron.replay as replay
    from prism_megatron.megatron import memory

    if request.mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {request.mode!r}")
    _one_thread()
    rt = _bring_up(request)
    try:
        virtual_rank = dist.get_rank()
        spec, model, optimizer = _build(request.job, virtual_rank)
        if request.mode == "emulate":
            replay.set_mode("replay")
            replay.load_schedule(request.schedule)
        exchanges_ns: list[tuple[int, int]] = []
        if request.mode == "capture" and rt.p2p_class is not None:
            _record_exchanges(rt.p2p_class, exchanges_ns)
        if request.mode == "real" and request.trace_exchanges:
            from megatron.core.pipeline_parallel import schedules

            _record_exchanges(schedules.P2PCommunicator, exchanges_ns)
        forward_backward = get_forward_backward_func()

        def step() -> None:
            _train_step(request.job, spec, model, optimizer, forward_backward)

        starts_ns: list[int] = []
        ends_ns: list[int] = []
        _iterate(request, step, request.iterations, 0, starts_ns, ends_ns)
        events = replay.stop_recording() if request.mode != "real" else []
        tracker = memory.LiveStorageTracker()
        tracker.label_model(model)
        tracker.label_optimizer(optimizer)
        with tracker:
            _iterate(request, step, request.memory_iterations, request.iterations, [], [])
        return {
            "virtual_rank": virtual_rank,
            "mode": request.mode,
            "starts_ns": starts_ns,
            "ends_ns": ends_ns,
            "memory": tracker.report().as_dict(),
            "events": events,
            "exchanges_ns": exchanges_ns,
        }
    finally:
        parallel_state.destroy_model_parallel()
        rt.close()


def environment_for(physical_rank: int, num_processes: int, port: int) -> dict[str, str]:
    """torchrun's variables for one of `num_processes` processes on this machine."""
    return {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(physical_rank),
        "LOCAL_RANK": str(physical_rank),
        "WORLD_SIZE": str(num_processes),
        "LOCAL_WORLD_SIZE": str(num_processes),
        "OMP_NUM_THREADS": "1",
    }


def apply_environment(variables: dict[str, str]) -> None:
    os.environ.update(variables)
