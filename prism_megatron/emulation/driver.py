"""The run's phases in order: capture the slice, build and simulate the graph, emulate, report.

Each phase is a small function over the `RunPlan`; the real processes of a phase are launches
(`launches.py`), and what they leave in the run folder is the next phase's input.
"""

from __future__ import annotations

import contextlib
import dataclasses
import os
from typing import Any

from prism_megatron import files
from prism_megatron.emulation import outputs, processes
from prism_megatron.emulation.launches import Launch, RunFailed, run_launch, run_launches
from prism_megatron.emulation.plan import RunPlan
from prism_megatron.emulation.progress import Progress
from prism_megatron.graph import ExecutionGraph, LayoutWorld, save_graph
from prism_megatron.graph.capture import RankCapture, build_graph
from prism_megatron.graph.classes import save_classes
from prism_megatron.passes.closed_loop import load_or_build_graph, network_cost
from prism_megatron.report import Failure, RunReport

MODELLED_CAPTURE_ITERS = 2
"""Iterations a capture pass runs on a modelled GPU: its times are deterministic (the GPU model's), so
one warm-up iteration (`rank.NUM_WARMUP`) and one recorded iteration give every span."""


@dataclasses.dataclass(frozen=True)
class RunOutcome:
    """How a run ended and what it left."""

    plan: RunPlan
    report: RunReport
    sim_result: Any
    """The simulation of the graph as captured (None when the run failed before it)."""
    results: dict[int, dict[str, Any]]
    """The emulated real ranks' results files, by virtual rank."""
    phase_wall_s: dict[str, float]
    written: dict[str, str]

    @property
    def ok(self) -> bool:
        return self.report.status == "ok"


def run(plan: RunPlan, progress: Progress | None = None) -> RunOutcome:
    """Run every phase; a failure ends the run with status "failed" and what was measured kept.

    The run folder's lock is taken before anything is written and held to the end (a second run into
    the folder is refused: `files.RunFolderBusy`). report.json is written last, so whatever ends the
    run, the report phase included, it says so: "interrupted" or "failed", with what was written.

    Raises:
        StopRequested: the run was interrupted (Ctrl-C, SIGTERM; see `processes.stop_signals`); its
            processes are stopped and report.json says "interrupted", with what was measured.
        RunFolderBusy: another run holds the folder.
    """
    progress = progress or Progress()
    with files.run_folder_lock(plan.out_dir):
        prepare_run_dir(plan)
        outputs.write_running(plan)
        done = _Done()
        try:
            try:
                graph = obtain_graph(plan, progress, done.walls)
                done.capture = outputs.capture_summary(
                    plan, graph, done.walls, made_here=not plan.reuses_graph
                )
                done.sim_result = simulate(plan, graph, progress, done.walls)
                if not plan.modelled:  # a modelled device's iteration is the simulation's (see modelled_run)
                    emulate(plan, progress, done.walls)
            except RunFailed as exc:
                progress.end("failed")
                failure = Failure(message=str(exc), dead_rank=exc.dead_rank, last_op=exc.last_op)
            else:
                failure = None
            if plan.modelled:
                results = outputs.rank_results(plan.path(files.CAPTURE_DIR))
            else:
                results = outputs.measured_results(plan) if failure else outputs.rank_results(plan.out_dir)
            return _reported(plan, progress, done.walls, done.sim_result, results, failure, done.capture)
        except KeyboardInterrupt as exc:  # the launch stopped its processes; the run folder says so
            stop = processes.as_stop(exc)
            phase = progress.phase
            progress.end("interrupted")
            _write_ended(plan, done, "interrupted",
                         f"interrupted by {stop.signal_name} during {phase}; every process was stopped")  # fmt: skip
            raise stop from None
        except Exception as exc:
            phase = progress.phase
            progress.end("failed")
            _write_ended(plan, done, "failed", f"{type(exc).__name__} during {phase}: {exc}")
            raise


@dataclasses.dataclass
class _Done:
    """What the run has made so far (for the report of a run that ends early)."""

    walls: dict[str, float] = dataclasses.field(default_factory=dict)
    sim_result: Any = None
    capture: Any = None


def _write_ended(plan: RunPlan, done: _Done, status: str, message: str) -> None:
    """The report of a run that ended early; when the full report cannot be written (a full disk,
    a second interrupt), report.json alone, which says so (it is written last, so the one on disk
    still says "running" until then)."""
    report = None
    try:
        report = outputs.build_report(plan, status=status, sim_result=done.sim_result,
                                      results=outputs.measured_results(plan),
                                      failure=Failure(message=message), capture=done.capture)  # fmt: skip
        outputs.write_final(plan, report, done.sim_result)
    except BaseException as exc:  # the run is ending anyway: say what is true
        why = f"{message}; the report could not be written in full ({type(exc).__name__}: {exc})"
        with contextlib.suppress(Exception):
            outputs.write_plain(
                plan, status=status, message=why, sim_result=done.sim_result, capture=done.capture
            )


def report_existing(plan: RunPlan, progress: Progress | None = None) -> RunOutcome:
    """The report of a run whose passes were launched by hand (several machines): the graph from
    --prism-graph (or the folder's graph/), simulated here; the real ranks' results and op logs
    from the run folder. Status "ok" when every real rank left its results, else "failed"."""
    progress = progress or Progress()
    with files.run_folder_lock(plan.out_dir):
        source = plan.config.capture.graph or plan.path(files.GRAPH_DIR)
        graph = _load(source, plan)
        if not os.path.isfile(os.path.join(plan.path(files.GRAPH_DIR), files.GRAPH_FILE)):
            save_graph(graph, plan.path(files.GRAPH_DIR))
        walls: dict[str, float] = {}
        sim_result = simulate(plan, graph, progress, walls)
        results = outputs.rank_results(plan.out_dir)
        missing = [r for r in plan.real_ranks if r not in results]
        failure = (
            Failure(message=f"real ranks {missing} left no results in {plan.out_dir}") if missing else None
        )
        summary = outputs.capture_summary(plan, graph, walls, made_here=False)  # its passes ran elsewhere
        return _reported(plan, progress, walls, sim_result, results, failure, summary)


def _reported(
    plan: RunPlan, progress: Progress, walls: dict, sim_result, results, failure, capture=None
) -> RunOutcome:
    """Write the run's final report ("failed" with a failure, else "ok") and return the outcome."""
    report = outputs.build_report(
        plan,
        status="failed" if failure else "ok",
        sim_result=sim_result,
        results=results,
        failure=failure,
        capture=capture,
    )
    progress.begin("report")
    written = outputs.write_final(plan, report, sim_result)
    walls["report"] = progress.end()
    return RunOutcome(plan, report, sim_result, results, walls, dict(written.paths))


def prepare_run_dir(plan: RunPlan) -> None:
    """Create the run folder; under --prism-overwrite, first remove what an earlier run wrote there.

    Checked again here, under the run folder's lock: the folder may have changed since the plan."""
    files.check_run_folder(plan.out_dir, overwrite=plan.config.output.overwrite)
    if plan.config.output.overwrite and os.path.isdir(plan.out_dir):
        files.clear_run(plan.out_dir)
    os.makedirs(plan.out_dir, exist_ok=True)


def obtain_graph(plan: RunPlan, progress: Progress, walls: dict[str, float]) -> ExecutionGraph:
    """The execution graph: --prism-graph's, or captured from the slice in passes; saved in graph/."""
    if plan.reuses_graph:
        progress.begin(f"graph: reusing {plan.config.capture.graph}")
        graph = _load(plan.config.capture.graph, plan)
        walls["graph"] = progress.end(f"{len(graph.roles)} roles")
    else:
        capture(plan, progress, walls)
        progress.begin("graph: building from the capture")
        paths = [files.capture_path(plan.path(files.CAPTURE_DIR), r) for r in plan.slice_ranks]
        try:
            captures = [RankCapture.load(path) for path in paths]
            graph = build_graph(captures, LayoutWorld(plan.layout), plan.layout.kwargs(),
                                extra=plan.graph_facts(), classes=plan.role_classes)  # fmt: skip
        except (OSError, ValueError) as exc:
            raise RunFailed(f"the captured ops do not make a graph: {exc}") from exc
        captured = len(graph.metadata.extra["captured_ranks"])
        walls["graph"] = progress.end(
            f"{len(graph.roles)} roles from {captured} captured, {graph.num_ops} ops"
        )
    save_graph(graph, plan.path(files.GRAPH_DIR))
    return graph


def _load(path: str, plan: RunPlan) -> ExecutionGraph:
    if path == plan.config.capture.graph and plan.reused_graph is not None:
        return plan.reused_graph  # checked (and built) before the run started
    try:
        return load_or_build_graph(path, plan.layout, extra=plan.graph_facts())
    except (OSError, ValueError) as exc:
        raise RunFailed(str(exc)) from exc


def capture_launches(plan: RunPlan) -> list[Launch]:
    """The capture passes: the slice in batches of `plan.nproc` processes, each rank recording its ops."""
    iterations = MODELLED_CAPTURE_ITERS if plan.modelled else plan.config.capture.capture_iters
    return [
        Launch(
            name=f"capture-{number}",
            ranks=batch,
            out_dir=plan.path(files.CAPTURE_DIR),
            flags=("--prism-phase", "capture", "--train-iters", str(iterations)),
            num_iterations=iterations,
        )
        for number, batch in enumerate(plan.capture_batches, start=1)
    ]


def emulate_launch(plan: RunPlan) -> Launch:
    """The emulation pass: the real ranks replaying every virtual peer from the run's graph/."""
    return Launch(
        name="emulate",
        ranks=plan.real_ranks,
        out_dir=plan.out_dir,
        flags=("--prism-phase", "emulate", "--prism-graph", plan.path(files.GRAPH_DIR)),
        num_iterations=plan.train_iters,
    )


def prepare_capture(plan: RunPlan) -> list[Launch]:
    """The capture passes (`capture_launches`), with the role classes saved beside the captures first:
    a graph is built from that folder (now or by a later run) with each class's members sharing the
    captured spans, so every runner of the passes calls this, not `capture_launches` alone."""
    save_classes(plan.role_classes, plan.path(files.CAPTURE_DIR))
    return capture_launches(plan)


def capture(plan: RunPlan, progress: Progress, walls: dict[str, float]) -> None:
    """Run the slice in passes of `plan.nproc` processes, each rank recording its ops; on a modelled
    GPU, `capture_at_once(plan)` passes at the same time."""
    launches = prepare_capture(plan)
    at_once = min(capture_at_once(plan), len(launches))
    common = {"script": plan.script, "user_args": plan.megatron_args, "run_dir": plan.out_dir}
    if at_once == 1:
        for number, launch in enumerate(launches, start=1):
            progress.begin(f"capture pass {number}/{len(launches)}")
            run_launch(launch, progress=progress, **common)
            walls[launch.name] = progress.end()
        return
    progress.begin(f"capture: {len(launches)} passes, {at_once} at a time")
    run_launches(
        launches,
        at_once=at_once,
        progress=progress,
        on_end=lambda launch, seconds: walls.__setitem__(launch.name, seconds),
        **common,
    )
    walls["capture"] = progress.end()


def capture_at_once(plan: RunPlan) -> int:
    """How many capture passes run at the same time: on a modelled GPU, as many as memory allows
    (`MODELLED_PASS_BYTES` each), at least one per core this process may use; else one, as a measured
    pass must have the machine's share to itself.

    A modelled pass computes nothing in real time (what it records is the GPU model's time, not the
    CPU's), so passes sharing the machine record the same graph, and more passes than cores finish
    sooner: three passes on two cores in one round of 1.5 pass-times instead of two rounds."""
    if not plan.modelled:
        return 1
    cores = len(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else (os.cpu_count() or 1)
    available = _available_memory_bytes()
    by_memory = available // MODELLED_PASS_BYTES if available is not None else 0
    return max(1, cores, by_memory)


MODELLED_PASS_BYTES = 2 << 30
"""Memory set aside per modelled capture pass run at once: over four times the largest measured
(a 462B pipeline stage at full size, 2026-12-03: 0.44 GiB resident; fake tensors hold no data)."""


def _available_memory_bytes() -> int | None:
    """MemAvailable of /proc/meminfo; None where there is no such file."""
    try:
        with open("/proc/meminfo", encoding="ascii") as f:
            for line in f:
                if line.startswith("MemAvailable:"):
                    return int(line.split()[1]) * 1024
    except (OSError, ValueError, IndexError):
        return None
    return None


def simulate(plan: RunPlan, graph: ExecutionGraph, progress: Progress, walls: dict[str, float]):
    """Simulate one iteration of the whole job; write the real ranks' replay schedules (not on a
    modelled GPU: no pass replays them there, and a 16,384-GPU job's took seconds to write)."""
    from prism_megatron.sim import DeadlockError, SimulationFault, WhatIf, replay_schedules
    from prism_megatron.sim import simulate as simulate_graph

    progress.begin("simulate")
    what_if = WhatIf(stragglers=plan.config.emulation.stragglers())
    try:
        result = simulate_graph(
            graph, LayoutWorld(plan.layout), network_cost(plan.config.cluster.cluster), what_if
        )
    except (DeadlockError, SimulationFault, ValueError) as exc:
        raise RunFailed(f"the graph does not simulate: {exc}") from exc
    if not plan.modelled:
        directory = plan.path(files.SIMULATION_DIR)
        os.makedirs(directory, exist_ok=True)
        for rank, schedule in replay_schedules(result, plan.real_ranks).items():
            schedule.save(files.schedule_path(directory, rank))
    walls["simulate"] = progress.end(f"predicted {result.iteration_time_ns / 1e6:.2f} ms per iteration")
    return result


def emulate(plan: RunPlan, progress: Progress, walls: dict[str, float]) -> None:
    """The real ranks run the program; the replay engine serves every virtual peer."""
    launch = emulate_launch(plan)
    progress.begin(f"emulate ({len(plan.real_ranks)} real of {plan.layout.world_size} ranks)")
    run_launch(
        launch, script=plan.script, user_args=plan.megatron_args, run_dir=plan.out_dir, progress=progress
    )
    walls["emulate"] = progress.end()
