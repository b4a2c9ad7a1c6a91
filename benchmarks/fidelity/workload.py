"""One process of a fidelity case: megatron-core's schedules, DDP and optimizer around a model.

The same function runs every process of the three kinds of run a case needs, so the program the
emulation times is the program the real run timed (the model and step are `programs.py`'s):

* ``real``: one of W real processes on gloo (the ground truth);
* ``capture``: a real rank among virtual peers that arrive at once, recording every op (the slice);
* ``emulate``: a real rank among virtual peers the replay engine times from a schedule, which
  follows what the rank measures, iteration by iteration (`loop.py`).

An iteration starts where the previous optimizer step ended (the first after set-up), with no
barrier, and its time is measured on this process alone.

Every process is forked for one run and ends with it, so the measuring hooks below (a wrapper
around megatron-core's forward_step and backward_step, and around the pipeline communicator's
`_communicate`) are set on the process's own modules and never undone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import time
from typing import Any

import torch
import torch.distributed as dist

from benchmarks.fidelity import loop, programs

MODES = ("real", "capture", "emulate")
DEVICES = ("host", "test", "cuda")


@dataclasses.dataclass(frozen=True, kw_only=True)
class Job:
    """The target job of a case: parallel sizes, and the sleep model's shape or the GPT's flags."""

    tp: int
    pp: int
    dp: int
    vpp: int | None = None
    num_microbatches: int = 8
    num_layers: int = 4
    fwd_ms: float = 0.0
    bwd_ms: float = 0.0
    overlap_grad_reduce: bool = False
    params_per_layer: int = 4096
    stragglers: tuple[tuple[int, float], ...] = ()
    """(virtual rank, compute factor) of each slow rank (sleep model)."""
    gpt_flags: tuple[str, ...] = ()
    """Non-empty: the built-in entry's GPT with these Megatron-LM flags (parallel sizes are added
    from the fields above) instead of the sleep model."""

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
    replay_inputs: Any = None
    """emulate: the simulation's inputs (`loop.ReplayInputs`); the rank keeps its schedule from them."""
    memory_iterations: int = 2
    """Iterations after the timed ones, under the live-storage tracker (peak memory)."""
    trace: bool = False
    """real: also note when each pipeline exchange and each all-reduce starts and returns
    (`diagnose.py` lays them beside the simulated timeline)."""
    device: str = "host"
    """"host": compute sleeps on the host; "test": the asynchronous test device
    (`prism_megatron.replay.test_device`): compute is enqueued on streams, the backend's ops complete
    there, the host runs ahead, and every time is read from the device timeline; "cuda": the GPU
    (the GPT only: the sleep model's compute is then a spin kernel per sleep)."""
    record_sleeps: bool = False
    """Note every compute sleep on the host as (begin, end, requested ns) (`sleeps_ns` in the result):
    which part of a span on the host was the compute asked for, and which the program's own host
    work or a late wake-up."""
    host_clock_marks: bool = False
    """Diagnostics: marks read the host clock even on a device (what a capture that took the host's
    clock for the device's would see)."""


def _one_thread() -> None:
    """Many processes share two cores: one thread each, and timed sleeps without timer slack."""
    torch.set_num_threads(1)
    from prism_megatron.replay import clock

    clock.lower_timer_slack()


def _pin_compute_bound(request: Request) -> None:
    """A GPT rank computes for real: each gets one core of its own, the same core in every run
    (core = virtual rank mod cores), as each rank of a cluster has its own GPU. Unpinned, the one
    real rank of an emulation would have both cores to itself (its gloo threads on the other one)
    while two ranks of the real run share them. Sleeping ranks stay unpinned: 16 of them share the
    cores as the scheduler sees fit. Set before bring-up, so gloo's threads inherit it."""
    if not request.job.gpt_flags:
        return
    physical_rank = int(os.environ.get("RANK", "0"))
    virtual_rank = physical_rank if request.mode == "real" else request.real_ranks[physical_rank]
    os.sched_setaffinity(0, {virtual_rank % os.cpu_count()})


def _bring_up(request: Request):
    """The distributed world and megatron-core's topology; returns the prism runtime."""
    from prism_megatron.config import EmulationConfig, PrismConfig
    from prism_megatron.megatron.run import runtime

    job = request.job
    emulate = request.mode != "real"
    emulation = EmulationConfig(
        emulate=emulate,
        world_size=job.world_size if emulate else None,
        ranks=",".join(str(r) for r in request.real_ranks) if emulate else None,
        device="cuda" if request.device == "cuda" else "cpu",
    )
    rt = runtime.start(PrismConfig(emulation=emulation))
    rt.sizes = runtime.ParallelSizes(tp=job.tp, pp=job.pp, vpp=job.vpp)
    runtime.bring_up(rt)
    programs.initialize_model_parallel(job)
    runtime.before_model(rt)
    return rt


@contextlib.contextmanager
def _without_cycle_collection():
    """Tensors held by reference cycles die when the cycle collector runs, and when it runs depends
    on every Python allocation, which the real and the emulated program make differently; with the
    collector off (after one full collection) a tensor dies at the same point of both programs."""
    gc.collect()
    gc.disable()
    try:
        yield
    finally:
        gc.enable()


class _Windows:
    """(enter, exit) marks on the device timeline, read on demand (on a device, once it got there)."""

    def __init__(self) -> None:
        self.marks: list = []
        self._ns: list[tuple[int, int]] = []

    def ns(self) -> list[tuple[int, int]]:
        from prism_megatron.replay import timeline

        pending = self.marks[len(self._ns) :]
        flat = timeline.resolve([m for pair in pending for m in pair])
        self._ns += list(zip(flat[::2], flat[1::2], strict=True))
        return list(self._ns)


def _record_exchanges(p2p_class, windows: _Windows) -> None:
    """Note when each pipeline exchange starts and returns (in a capture its ops form one batch)."""
    from prism_megatron.replay import timeline

    communicate = p2p_class._communicate

    def recorded(self, **kwargs):
        enter = timeline.mark()
        try:
            return communicate(self, **kwargs)
        finally:
            windows.marks.append((enter, timeline.mark()))

    p2p_class._communicate = recorded


def _record_all_reduces(windows: list[tuple[int, int]]) -> None:
    """Note when each `torch.distributed.all_reduce` is called and returns (async ones: issued)."""
    all_reduce = dist.all_reduce

    def recorded(*args, **kwargs):
        issue_ns = time.monotonic_ns()
        try:
            return all_reduce(*args, **kwargs)
        finally:
            windows.append((issue_ns, time.monotonic_ns()))

    dist.all_reduce = recorded


def _time_compute(spans_ns: list[int]) -> None:
    """Add the time spent in megatron-core's forward_step and backward_step to spans_ns[-1]."""
    from megatron.core.pipeline_parallel import schedules

    def timed(original):
        def wrapper(*args, **kwargs):
            begin_ns = time.monotonic_ns()
            try:
                return original(*args, **kwargs)
            finally:
                spans_ns[-1] += time.monotonic_ns() - begin_ns

        return wrapper

    schedules.forward_step = timed(schedules.forward_step)
    schedules.backward_step = timed(schedules.backward_step)


def _iterate(request: Request, step, count: int, first: int, timeline: dict, after=None) -> None:
    """`count` iterations, each timed from the end of the previous one (no barrier).

    Emulated modes record each iteration's ops and mark its start for the replay engine; `after`
    gets (number, start, end, events) of each. Every time is a mark on the device timeline
    (`prism_megatron.replay.timeline`), read when the iteration ends.
    """
    import prism_megatron.replay as replay
    from prism_megatron.replay import timeline as device_timeline

    previous = (
        device_timeline.mark_at(timeline["ends_ns"][-1]) if timeline["ends_ns"] else device_timeline.mark()
    )
    for number in range(first, first + count):
        if request.mode != "real":
            replay.start_recording()
        start = replay.mark_iteration_start() if request.mode != "real" else previous
        timeline["compute_ns"].append(0)
        step()
        timeline["host_returns_ns"].append(time.monotonic_ns())
        previous = device_timeline.mark()
        events = replay.stop_recording() if request.mode != "real" else []
        start_ns, end_ns = device_timeline.resolve([start, previous])
        timeline["starts_ns"].append(start_ns)
        timeline["ends_ns"].append(end_ns)
        timeline["events"].extend(events)
        if after is not None:
            after(number, start_ns, end_ns, events)


def _new_timeline() -> dict[str, list]:
    return {"starts_ns": [], "ends_ns": [], "compute_ns": [], "events": [], "host_returns_ns": []}


@contextlib.contextmanager
def _device(request: Request):
    """The device the request runs on (see `Request.device`), for the whole process's run."""
    from prism_megatron.replay import test_device, timeline

    if request.device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {request.device!r}")
    with contextlib.ExitStack() as stack:
        if request.device == "test":
            stack.enter_context(test_device.active_device())
        if request.host_clock_marks:
            stack.enter_context(timeline.host_clock_marks())
        yield


def run(request: Request) -> dict[str, Any]:
    """Run one process of a case; returns its iteration times, peak memory and (capture) op log.

    The timed iterations run first; then `memory_iterations` more under the live-storage tracker
    (its dispatch hook costs CPU time per op, so it stays out of the timed ones).
    """
    if request.mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {request.mode!r}")
    _one_thread()
    _pin_compute_bound(request)
    with _device(request):
        return _run_on_device(request)


def _record_sleeps(sleeps_ns: list[tuple[int, int, int]]) -> None:
    """Note (begin, end, requested) of every compute sleep on the host (this process's own module,
    never undone)."""
    from prism_megatron.replay import timeline

    compute = timeline.compute

    def recorded(duration_s: float) -> None:
        begin_ns = time.monotonic_ns()
        compute(duration_s)
        sleeps_ns.append((begin_ns, time.monotonic_ns(), round(duration_s * 1e9)))

    timeline.compute = recorded


def _run_on_device(request: Request) -> dict[str, Any]:
    from megatron.core import parallel_state

    from prism_megatron.megatron.run import memory

    sleeps_ns: list[tuple[int, int, int]] = []
    if request.record_sleeps:
        _record_sleeps(sleeps_ns)

    rt = _bring_up(request)
    try:
        virtual_rank = dist.get_rank()
        program = programs.build(request.job, virtual_rank)
        exchanges = _Windows()
        if request.mode != "real" and rt.p2p_class is not None:
            _record_exchanges(rt.p2p_class, exchanges)
        all_reduces_ns: list[tuple[int, int]] = []
        if request.mode == "real" and request.trace:
            from megatron.core.pipeline_parallel import schedules

            _record_exchanges(schedules.P2PCommunicator, exchanges)
            _record_all_reduces(all_reduces_ns)
        after, replay_state = None, None
        if request.mode == "emulate":
            replay_state = loop.Replay(request.replay_inputs, virtual_rank)

            def after(number, start_ns, end_ns, events):
                calls = [c for c in exchanges.ns() if start_ns <= c[0] < end_ns]
                replay_state.after_iteration(number, start_ns, end_ns, events, calls)

        timeline = _new_timeline()
        _time_compute(timeline["compute_ns"])
        _iterate(request, program.step, request.iterations, 0, timeline, after)
        with _without_cycle_collection():
            tracker = memory.LiveStorageTracker()
            tracker.label_model(program.model)
            tracker.label_optimizer(program.optimizer)
            with tracker:
                _iterate(
                    request, program.step, request.memory_iterations, request.iterations, _new_timeline()
                )
        return {
            "virtual_rank": virtual_rank,
            "mode": request.mode,
            "starts_ns": timeline["starts_ns"],
            "ends_ns": timeline["ends_ns"],
            "host_returns_ns": timeline["host_returns_ns"],
            "sleeps_ns": sleeps_ns,
            "compute_ns": timeline["compute_ns"],
            "memory": tracker.report().as_dict(),
            "events": timeline["events"],
            "exchanges_ns": exchanges.ns(),
            "all_reduces_ns": all_reduces_ns,
            "replay": replay_state.summary() if replay_state else None,
        }
    finally:
        parallel_state.destroy_model_parallel()
        rt.close()
