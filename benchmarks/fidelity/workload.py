"""One process of a fidelity case: the pass the product's launch would start, forked from the suite.

Every process runs one pass of `prism-megatron emulate` with the command line the product's own
launches give it (`passes.py`), so the suite measures what users run:

* ``real``: one of W real processes on gloo, no virtual world (the ground truth: the all-real run);
* ``capture``: a slice rank among instant virtual peers; the runtime's `CapturePhase` records every
  op and writes the capture file the graph is built from;
* ``emulate``: a real rank among virtual peers; the runtime's `EmulatePhase` replays them from the
  graph's simulation over the cost file named by --prism-cluster, and folds what the rank measures
  into the next iteration's schedule (the closed loop, shared among the real ranks).

A GPT process is the built-in entry itself (`prism_megatron.launch.main`). A sleep-model process
runs `programs.py`'s program under the same command line's `PrismConfig` and the same runtime, with
the entries' iteration marks around every step; its times are the pass's own (device-timeline marks
from iteration start to end, no barrier).

Every process is forked for one run and ends with it, so the measuring hooks below (a wrapper
around megatron-core's forward_step and backward_step for the rank's compute time; with `trace`,
around the real run's pipeline communicator and all-reduce) are set on the process's own modules
and never undone.
"""

from __future__ import annotations

import contextlib
import dataclasses
import gc
import os
import time
from typing import Any

import torch.distributed as dist

from benchmarks.fidelity import programs

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
    """What one process runs: a pass's command line, as the product's launch gives it."""

    job: Job
    mode: str
    argv: tuple[str, ...]
    """`python -m prism_megatron.launch`'s arguments for this process (`passes.py` takes them from
    the product's own launches): the script, Megatron's flags and the pass's --prism-* flags."""
    iterations: int
    """Timed iterations (for the GPT: --train-iters in argv, set by `passes.py`)."""
    memory_iterations: int = 2
    """Sleep model: iterations after the timed ones, under the live-storage tracker (peak memory)."""
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


def _lower_timer_slack() -> None:
    """Timed sleeps without timer slack, in every pass alike (the sleep model's compute is sleeps)."""
    from prism_megatron.replay import clock

    clock.lower_timer_slack()


def _bring_up(request: Request):
    """The pass's runtime from its command line's --prism-* flags, the distributed world and
    megatron-core's topology, as the entries set them up."""
    from prism_megatron.config import parse_prism_flags
    from prism_megatron.megatron.run import runtime

    job = request.job
    rt = runtime.Runtime.start(parse_prism_flags(list(request.argv)))
    rt.sizes = runtime.ParallelSizes(tp=job.tp, pp=job.pp, vpp=job.vpp)
    rt.bring_up()
    programs.initialize_model_parallel(job)
    rt.before_model()
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

    def ns(self) -> list[tuple[int, int]]:
        from prism_megatron.replay import timeline

        flat = timeline.resolve([m for pair in self.marks for m in pair])
        return list(zip(flat[::2], flat[1::2], strict=True))


def _record_exchanges(p2p_class, windows: _Windows) -> None:
    """Note when each pipeline exchange of a real run starts and returns (`Request.trace`)."""
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


class ComputeClock:
    """Time inside megatron-core's forward_step and backward_step, per iteration: wall time, and this
    thread's CPU time (what the rank computed, whatever the cores' load made it wait)."""

    def __init__(self) -> None:
        self.wall_ns: list[int] = []
        self.cpu_ns: list[int] = []
        self.running = False

    def new_iteration(self) -> None:
        self.wall_ns.append(0)
        self.cpu_ns.append(0)
        self.running = True

    def stop(self) -> None:
        """Iterations from here on (the memory ones) are not timed."""
        self.running = False

    def install(self) -> ComputeClock:
        from megatron.core.pipeline_parallel import schedules

        def timed(original):
            def wrapper(*args, **kwargs):
                wall_ns, cpu_ns = time.monotonic_ns(), time.thread_time_ns()
                try:
                    return original(*args, **kwargs)
                finally:
                    if self.running:
                        self.wall_ns[-1] += time.monotonic_ns() - wall_ns
                        self.cpu_ns[-1] += time.thread_time_ns() - cpu_ns

            return wrapper

        schedules.forward_step = timed(schedules.forward_step)
        schedules.backward_step = timed(schedules.backward_step)
        return self


def _iterate(rt, step, count: int, clock: ComputeClock | None, host_returns_ns: list[int]) -> None:
    """`count` training steps, each between the runtime's iteration marks, as the entries run them
    (the pass times, records, replays and folds them there)."""

    for _ in range(count):
        rt.iteration_begins()
        if clock is not None:
            clock.new_iteration()
        step()
        host_returns_ns.append(time.monotonic_ns())
        rt.iteration_ends()


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
    """Run one process of a pass; returns its iteration times, peak memory and compute time.

    Sleep model: the timed iterations first, then `memory_iterations` more under the live-storage
    tracker (its dispatch hook costs CPU time per op, so it stays out of the timed ones). GPT: the
    built-in entry itself (`prism_megatron.launch.main` with the request's argv), which tracks
    memory over every iteration and writes its results file; they are read back from there.
    """
    if request.mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {request.mode!r}")
    _lower_timer_slack()
    with _device(request):
        return _run_gpt(request) if request.job.gpt_flags else _run_sleep(request)


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


def _run_gpt(request: Request) -> dict[str, Any]:
    """The built-in entry, as `python -m prism_megatron.launch` runs it under torchrun."""
    import json

    from prism_megatron import launch
    from prism_megatron.config import parse_prism_flags
    from prism_megatron.megatron.entry import pretrain
    from prism_megatron.megatron.run import results

    clock = ComputeClock().install()
    trace = _trace_gpt(request)
    train_step = pretrain.train_step

    def counted(*args, **kwargs):
        clock.new_iteration()
        return train_step(*args, **kwargs)

    pretrain.train_step = counted  # this process's own module: it runs one pass and ends
    status = launch.main(list(request.argv))
    if status != 0:
        raise RuntimeError(f"prism_megatron.launch {' '.join(request.argv)} exited with status {status}")
    config = parse_prism_flags(list(request.argv))
    virtual_rank = _virtual_rank_of(config)
    with open(results.path_for(config, virtual_rank), encoding="utf-8") as f:
        out = json.load(f)
    phase = out["prism_phase"]
    if "exchanges" in trace:
        trace["exchanges_ns"] = trace.pop("exchanges").ns()
    return {
        "virtual_rank": virtual_rank,
        "mode": request.mode,
        "phase": phase["name"],
        "phase_summary": phase,
        "iteration_times_ms": [t * 1e3 for t in phase["iteration_times_s"]],
        "compute_ns": clock.wall_ns,
        "compute_cpu_ns": clock.cpu_ns,
        "memory": out["memory"],
        "cpu_share": out.get("cpu_share"),
        **trace,
    }


def _trace_gpt(request: Request) -> dict[str, list]:
    """With `trace` (a real run): note each iteration's start and end (the entry's marks: the host
    clock on the CPU device), and each pipeline exchange and all-reduce (filled during the run)."""
    if not (request.trace and request.mode == "real"):
        return {}
    from megatron.core.pipeline_parallel import schedules

    from prism_megatron.megatron.run import runtime

    trace: dict[str, list] = {"starts_ns": [], "ends_ns": [], "all_reduces_ns": []}
    begins, ends = runtime.Runtime.iteration_begins, runtime.Runtime.iteration_ends

    def noted_begins(rt):
        trace["starts_ns"].append(time.monotonic_ns())
        begins(rt)

    def noted_ends(rt):
        ends(rt)
        trace["ends_ns"].append(time.monotonic_ns())

    runtime.Runtime.iteration_begins, runtime.Runtime.iteration_ends = noted_begins, noted_ends
    exchanges = _Windows()
    _record_exchanges(schedules.P2PCommunicator, exchanges)
    _record_all_reduces(trace["all_reduces_ns"])
    trace["exchanges"] = exchanges  # replaced by its times once the run is over (see _run_gpt)
    return trace


def _virtual_rank_of(config) -> int:
    """This process's virtual rank: its physical rank's entry of --prism-ranks, or its rank."""
    physical_rank = int(os.environ.get("RANK", "0"))
    if not config.emulation.emulate:
        return physical_rank
    return [int(r) for r in config.emulation.ranks.split(",")][physical_rank]


def _run_sleep(request: Request) -> dict[str, Any]:
    from megatron.core import parallel_state

    from prism_megatron.passes import memory

    sleeps_ns: list[tuple[int, int, int]] = []
    if request.record_sleeps:
        _record_sleeps(sleeps_ns)
    rt = _bring_up(request)
    try:
        virtual_rank = rt.virtual_rank
        program = programs.build(request.job, virtual_rank)
        exchanges, all_reduces_ns = _Windows(), []
        if request.mode == "real" and request.trace:
            from megatron.core.pipeline_parallel import schedules

            _record_exchanges(schedules.P2PCommunicator, exchanges)
            _record_all_reduces(all_reduces_ns)
        host_returns_ns: list[int] = []
        clock = ComputeClock().install()
        _iterate(rt, program.step, request.iterations, clock, host_returns_ns)
        clock.stop()
        with _without_cycle_collection():
            tracker = memory.LiveStorageTracker()
            tracker.label_model(program.model)
            tracker.label_optimizer(program.optimizer)
            with tracker:
                _iterate(rt, program.step, request.memory_iterations, None, [])
        phase = rt.phase
        phase.read_marks(wait=True)
        out: dict[str, Any] = {}
        rt.finish_phase(out)  # the pass's files: capture file, op log
        return {
            "virtual_rank": virtual_rank,
            "mode": request.mode,
            "phase": phase.name,
            "phase_summary": out["prism_phase"],
            "starts_ns": phase.starts_ns[: request.iterations],
            "ends_ns": phase.ends_ns[: request.iterations],
            "iteration_times_ms": [
                t * 1e3 for t in out["prism_phase"]["iteration_times_s"][: request.iterations]
            ],
            "host_returns_ns": host_returns_ns,
            "sleeps_ns": sleeps_ns,
            "compute_ns": clock.wall_ns,
            "compute_cpu_ns": clock.cpu_ns,
            "memory": tracker.report().as_dict(),
            "cpu_share": rt.cpu.as_dict() if rt.cpu is not None else None,
            "exchanges_ns": exchanges.ns(),
            "all_reduces_ns": all_reduces_ns,
            "simulated_rank_ms": (
                phase.loop.result.finish_ns(virtual_rank) / 1e6 if hasattr(phase, "loop") else None
            ),
        }
    finally:
        parallel_state.destroy_model_parallel()
        rt.close()
