"""What a real process does around each training iteration, in the pass it runs.

The training entries (the built-in one and the Megatron-LM `train_step` hook) call
`iteration_begins()` and `iteration_ends()` around every step, and the pipeline communicator
reports each call (`p2p_call`); nothing here knows Megatron. Three passes (`--prism-phase`):

* `InstantPhase` (no graph): virtual peers answer at once; iteration starts are marked so a loaded
  schedule would count from them. What a plain functional emulation does.
* `CapturePhase`: the same timing, and every op of every iteration is recorded; at the end the
  rank writes `capture-<rank>.json` (`graph.capture.RankCapture`) into its --prism-out folder.
* `EmulatePhase`: the replay engine plays the virtual peers from the graph's simulation, and after
  each iteration past warm-up the closed loop folds what this rank measured (and what the other
  real ranks published in the rendezvous store) and loads the next schedule (`closed_loop.ClosedLoop`). At the end it writes its measured op log
  (`ops/rank-<rank>.json`) for the report's timeline.

Every pass measures each iteration's time between the two calls; capture and emulate keep a
small progress file (`progress/rank-<rank>.json`: pid, pass, iterations and their times) that the
orchestrator shows, and reads when a run fails before the ranks wrote their results.

Every time here is device time, from the device timeline (`prism_megatron.replay.timeline`): the
iteration's start and end and each pipeline call's span are marks on the stream where the program
issues its work, the backend marks its ops the same way, and all are read when the iteration ends.
On CPU a mark is the host clock (when the work happens); on CUDA and on the asynchronous test
device it is the device's clock when the stream gets there, so compute spans are device time
between consecutive ops on the compute stream, not the host's launch gaps. Reading an iteration's
marks waits for the device to finish that iteration (Megatron's optimizer step already waits for
the device each iteration, for the gradient norm); the next iteration's time starts at its own
start mark, so the wait is in no iteration's time.
"""

from __future__ import annotations

import dataclasses
import json
import os
import time
from collections.abc import Mapping
from typing import Any

import torch

import prism_megatron.replay as replay
from prism_megatron import files
from prism_megatron.backend import consistency
from prism_megatron.config import PrismConfig
from prism_megatron.graph import LayoutWorld
from prism_megatron.graph.capture import (
    CapturedIteration,
    GroupNames,
    RankCapture,
    compute_durations,
    compute_intervals,
    iteration_streams,
)
from prism_megatron.passes import watchdog
from prism_megatron.passes.agreed_start import StartAgreement, StartRecord
from prism_megatron.passes.closed_loop import ClosedLoop, blocked_waits, load_or_build_graph, network_cost
from prism_megatron.passes.real_costs import RealCosts
from prism_megatron.replay import timeline
from prism_megatron.replay.timeline import Mark
from prism_megatron.sim import WhatIf
from prism_megatron.topology import Layout

NUM_WARMUP = 1
"""Leading iterations of a pass that are warm-up (allocator, first touch): not used for the graph
and not folded into the schedule; the report marks them."""


class InstantPhase:
    """Virtual peers answer at once (or no virtual world at all); iteration times only."""

    name = "instant"
    records_p2p_calls = False
    reports_progress = False
    """Only the passes an orchestrator starts keep a progress file."""

    def __init__(self, *, config: PrismConfig, virtual_rank: int, virtual_world: bool) -> None:
        self.config = config
        self.virtual_rank = virtual_rank
        self.virtual_world = virtual_world
        self.out_dir = config.output.out
        self.starts_ns: list[int] = []
        """Device times of the iterations read so far (see `read_marks`)."""
        self.ends_ns: list[int] = []
        self._marks: list[tuple[Mark, Mark | None]] = []
        """(start, end) marks of the iterations not read yet; end None while one runs."""
        self._progress_written_s = 0.0
        self._progress_done_written = -1
        timeline.set_timeout_s(config.emulation.timeout_s)
        watchdog.identify(virtual_rank)
        self.write_progress("started")

    def iteration_begins(self) -> None:
        watchdog.iteration_begins()
        start = replay.mark_iteration_start() if self.virtual_world else timeline.mark()
        self._marks.append((start, None))

    def iteration_ends(self) -> None:
        watchdog.iteration_ends()
        start, _ = self._marks.pop()
        self._marks.append((start, timeline.mark()))
        self.write_progress("running")

    def read_marks(self, *, wait: bool) -> None:
        """Move the finished iterations' marks to starts_ns / ends_ns: all (wait, blocking until the
        device has passed them) or those the device has already passed."""
        while self._marks and self._marks[0][1] is not None:
            start, end = self._marks[0]
            if not wait and not timeline.is_reached(end):
                return
            start_ns, end_ns = timeline.resolve([start, end])
            self._marks.pop(0)
            self.starts_ns.append(start_ns)
            self.ends_ns.append(end_ns)

    def p2p_call(self, enter: Mark, exit: Mark) -> None:
        """A pipeline-communicator call ran from `enter` to `exit` (its p2p ops form a batch)."""

    def iteration_times_s(self) -> list[float]:
        """The device time of every finished iteration (waits for the device)."""
        self.read_marks(wait=True)
        return self._times_read_s()

    def _times_read_s(self) -> list[float]:
        return [(end - start) / 1e9 for start, end in zip(self.starts_ns, self.ends_ns, strict=False)]

    def summary(self) -> dict[str, Any]:
        """What the rank's results file keeps of this pass."""
        return {"name": self.name, "num_warmup": NUM_WARMUP, "iteration_times_s": self.iteration_times_s()}

    def finish(self) -> None:
        self.write_progress("done")

    def write_progress(self, state: str) -> None:
        """Whenever the device has finished another iteration, else at most a few writes a second: a
        progress file must not cost an iteration's time, and must not fall behind either (a rank that
        hangs after a skipped write would leave it an iteration short for good).

        It shows the iterations the device has finished (it never waits for the device); the host
        clocks here pace the writes and date the file, they time nothing."""
        if self.out_dir is None or not self.reports_progress:
            return
        now_s = time.monotonic()
        self.read_marks(wait=state == "done")
        done = len(self.ends_ns)
        if (
            state == "running"
            and done == self._progress_done_written
            and now_s - self._progress_written_s < 0.25
        ):
            return
        self._progress_written_s, self._progress_done_written = now_s, done
        path = files.progress_path(self.out_dir, self.virtual_rank)
        os.makedirs(os.path.dirname(path), exist_ok=True)
        data = {"pid": os.getpid(), "virtual_rank": self.virtual_rank, "phase": self.name, "state": state,
                "iterations_done": len(self.ends_ns), "wall_time_s": time.time(),
                "iteration_times_s": self._times_read_s()}  # fmt: skip
        files.write_json(data, path)


class _RecordingPhase(InstantPhase):
    """Records every op of every iteration, and the pipeline-communicator calls."""

    records_p2p_calls = True
    reports_progress = True

    def __init__(self, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.iterations: list[CapturedIteration] = []
        self._calls: list[tuple[Mark, Mark]] = []

    def iteration_begins(self) -> None:
        super().iteration_begins()
        self._calls = []
        timeline.record_work(True)
        replay.start_recording()

    def iteration_ends(self) -> None:
        watchdog.iteration_ends()
        start, _ = self._marks.pop()
        self._marks.append((start, timeline.mark()))  # before the op log is read out
        events = tuple(replay.stop_recording())  # waits for the device to pass the iteration's ops
        self.read_marks(wait=True)
        flat = timeline.resolve([m for call in self._calls for m in call])
        calls = tuple(zip(flat[::2], flat[1::2], strict=True))
        # Device work the program marked (the sleep-compute workload's sleeps); a program that marks
        # none (real compute on the host) leaves every span counted as work.
        flat = timeline.resolve([m for span in timeline.record_work(False) for m in span])
        work = tuple(zip(flat[::2], flat[1::2], strict=True)) or None
        self.write_progress("running")
        iteration = CapturedIteration(self.starts_ns[-1], self.ends_ns[-1], events, calls, work)
        self.iterations.append(iteration)
        self.after_iteration(iteration)

    def after_iteration(self, iteration: CapturedIteration) -> None:
        """Hook for the emulate pass."""

    def p2p_call(self, enter: Mark, exit: Mark) -> None:
        self._calls.append((enter, exit))


class CapturePhase(_RecordingPhase):
    name = "capture"

    def __init__(self, *, role: str, **kwargs: Any) -> None:
        super().__init__(**kwargs)
        self.role = role

    def finish(self) -> None:
        capture = RankCapture(self.virtual_rank, self.role, tuple(self.iterations), num_warmup=NUM_WARMUP)
        capture.save(files.capture_path(self.out_dir, self.virtual_rank))
        super().finish()


class EmulatePhase(_RecordingPhase):
    name = "emulate"

    def __init__(
        self, *, layout: Layout, real_ranks: tuple[int, ...], store: Any = None, **kwargs: Any
    ) -> None:
        super().__init__(**kwargs)
        config = self.config
        self.real_ranks = real_ranks
        self.store = store
        self.world = LayoutWorld(layout)
        self.names = GroupNames(self.world, self.virtual_rank)
        graph = load_or_build_graph(config.capture.graph, layout)
        self.loop = ClosedLoop.start(
            graph,
            self.world,
            network_cost(config.cluster.cluster),
            virtual_rank=self.virtual_rank,
            real_ranks=real_ranks,
            what_if=WhatIf(stragglers=config.emulation.stragglers()),
        )
        self.simulated_ns: list[int] = []
        """This rank's simulated time in the schedule each iteration ran (`ClosedLoop.finish_ns`)."""
        self.replayed_ns: dict[int, int] = {}
        """Iteration number -> the schedule it ran replayed with every real rank's compute spans of
        that iteration (`ClosedLoop.replayed_ns`); iterations after warm-up that every real rank
        ran as the graph holds."""
        self.expected_ns: dict[int, int] = {}
        """Iteration number -> the schedule it ran, replayed with each iteration it was simulated
        from (`ClosedLoop.expected_ns`), for the same iterations as `replayed_ns`."""
        self.captured_compute_ns = sum(self.loop.current)
        """This rank's compute in the graph as captured (the first schedule's)."""
        self.compute_ns: dict[int, tuple[int, int]] = {}
        """Iteration number -> (this rank's compute the schedule it ran assumed, the compute it
        measured in it), for iterations after warm-up that ran as the graph holds: how far the
        measured input drifted from the one the schedule was simulated with."""
        self.resimulation_ns: list[int] = []
        """Host time of each fold (measurement, exchange with the other real ranks, re-simulation and
        schedule load): between iterations, in none."""
        self.agreement = (
            StartAgreement(store=store, real_ranks=real_ranks, virtual_rank=self.virtual_rank)
            if store is not None and len(real_ranks) > 1
            else None
        )
        self.starts: list[StartRecord] = []
        # Real members talking over the host (the CPU device: gloo) take what the host takes, not
        # what the target's network would: the loop gives their ops what they measure (real_costs.py).
        on_host = config.emulation.resolved_device(torch.cuda.is_available()) == "cpu"
        self.real_costs = (
            RealCosts(virtual_rank=self.virtual_rank, real_ranks=real_ranks)
            if on_host and len(real_ranks) > 1
            else None
        )
        self.not_folded: dict[int, str] = {}
        self.num_kept = 0
        """Spans that ended in a wait the schedule decided, kept at their previous value."""
        replay.set_mode("replay")
        self.loaded = self.loop.schedule()
        replay.load_schedule(self.loaded)

    def iteration_begins(self) -> None:
        if self.agreement is not None:  # every real rank begins at one time (agreed_start.py)
            consistency.settle(self.config.emulation.timeout_s)  # the last iteration's deferred checks
            matched = self.loop.num_folded > 0 and not self.not_folded
            start = self.agreement.agree(matched=matched)
            # Once every real rank's program has matched the graph, the backend's consistency check
            # leaves the real ops' path (backend/consistency.py); all switch at this same start.
            consistency.defer(start.all_matched)
            self.starts.append(start)
        self.simulated_ns.append(self.loop.finish_ns)
        super().iteration_begins()

    def after_iteration(self, iteration: CapturedIteration) -> None:
        number = len(self.iterations) - 1
        if number < NUM_WARMUP:
            return
        began_ns = time.monotonic_ns()
        try:
            self._fold(iteration, number)
        finally:
            self.resimulation_ns.append(time.monotonic_ns() - began_ns)

    def _fold(self, iteration: CapturedIteration, number: int) -> None:
        posted: dict = {}
        streams = iteration_streams(iteration, self.names, posted=posted)
        keep = blocked_waits(iteration, streams, posted, self.loaded)
        self.num_kept += len(keep)
        assumed_ns = sum(self.loop.current)  # what the schedule this iteration ran was simulated with
        reason = self.loop.measure(streams, keep)
        if self.real_costs is not None:
            self.real_costs.add(iteration.events)
        spans = compute_durations(streams) if reason is None else None
        folded = list(self.loop.measured[-1]) if reason is None else None
        if folded is not None:  # the loop's measurement: a kept span at its assumed value
            self.compute_ns[number] = (assumed_ns, sum(folded))
        shared = self.exchange(number, spans, folded)
        # Before re-simulating: the loop's result is still the schedule this iteration ran.
        complete = None not in shared.spans.values()  # every real rank's iteration matched the graph
        expected, replayed = self.loop.judge(
            shared.spans if complete else None,
            shared.folded if complete else None,
            shared.latest if self.real_costs is not None else None,
        )
        if expected is not None:
            self.expected_ns[number] = expected[self.virtual_rank]
        if replayed is not None:
            self.replayed_ns[number] = replayed[self.virtual_rank]
        if reason is None:
            self.loop.resimulate(shared.durations, shared.costs if self.real_costs is not None else None)
            self.loaded = self.loop.schedule()
            replay.load_schedule(self.loaded)
        else:
            self.not_folded[number] = reason

    def exchange(self, number: int, spans: list[int] | None, folded: list[int] | None) -> Shared:
        """Publish this rank's measurements after iteration `number` and wait for every other real
        rank's (see closed_loop.py); `spans` and `folded` are this rank's compute spans in the
        iteration as measured and as its loop took them (None where the iteration did not match the
        graph)."""
        own_costs = self.real_costs.current() if self.real_costs is not None else {}
        own_latest = self.real_costs.latest() if self.real_costs is not None else {}
        shared = Shared(
            costs={self.virtual_rank: own_costs},
            latest={self.virtual_rank: own_latest},
            spans={self.virtual_rank: spans},
            folded={self.virtual_rank: folded},
        )
        if self.store is None or len(self.real_ranks) < 2:
            return shared
        data = {"role": self.loop.role, "durations": self.loop.current, "real_costs": own_costs,
                "latest_costs": own_latest, "spans": spans, "folded": folded}  # fmt: skip
        self.store.set(_shared_key(self.virtual_rank, number), json.dumps(data))
        others = [rank for rank in self.real_ranks if rank != self.virtual_rank]
        keys = [_shared_key(rank, number) for rank in others]
        self.store.wait(keys)
        for rank, raw in zip(others, self.store.multi_get(keys), strict=True):
            data = json.loads(raw)
            shared.durations[data["role"]] = data["durations"]
            shared.costs[rank] = data["real_costs"]
            shared.latest[rank] = data["latest_costs"]
            shared.spans[rank] = data["spans"]
            shared.folded[rank] = data["folded"]
        if number - 2 >= NUM_WARMUP:  # every rank read it before the iteration that just ended began
            self.store.delete_key(_shared_key(self.virtual_rank, number - 2))
        return shared

    def summary(self) -> dict[str, Any]:
        return {
            **super().summary(),
            "simulated_iteration_times_s": [t / 1e9 for t in self.simulated_ns],
            "replayed_iteration_times_s": self._by_iteration(self.replayed_ns),
            "expected_iteration_times_s": self._by_iteration(self.expected_ns),
            "captured_compute_s": self.captured_compute_ns / 1e9,
            "schedule_compute_s": self._by_iteration({i: c[0] for i, c in self.compute_ns.items()}),
            "measured_compute_s": self._by_iteration({i: c[1] for i, c in self.compute_ns.items()}),
            "closed_loop_final_s": self.loop.iteration_time_ns / 1e9,
            "num_folded": self.loop.num_folded,
            "num_spans_kept": self.num_kept,
            "not_folded": {str(k): v for k, v in self.not_folded.items()},
            "resimulation_s": [t / 1e9 for t in self.resimulation_ns],
            "agreed_starts": [_start_summary(s) for s in self.starts],
        }

    def _by_iteration(self, values_ns: Mapping[int, int]) -> list[float | None]:
        """Seconds per iteration run (numbered as `simulated_ns`), None where `values_ns` has none."""
        return [values_ns[i] / 1e9 if i in values_ns else None for i in range(len(self.simulated_ns))]

    def finish(self) -> None:
        from prism_megatron.passes.memory import CATEGORIES, last_samples
        from prism_megatron.report.oplog import ComputeSpan, MemorySample, OpLog, save_op_log

        self.read_marks(wait=True)
        memory = tuple(MemorySample(t, dict(zip(CATEGORIES, b, strict=True))) for t, *b in last_samples())
        events = tuple(e for it in self.iterations for e in it.events)
        compute = tuple(
            ComputeSpan("compute", start_ns, end_ns)
            for it in self.iterations
            for start_ns, end_ns in compute_intervals(it)
        )
        log = OpLog(virtual_rank=self.virtual_rank, events=events, compute=compute,
                    iteration_starts_ns=tuple(self.starts_ns), memory=memory)  # fmt: skip
        save_op_log(self.out_dir, log)
        if self.agreement is not None:
            consistency.settle(self.config.emulation.timeout_s)
        super().finish()


@dataclasses.dataclass
class Shared:
    """What the real ranks publish to each other after an iteration (`EmulatePhase.exchange`)."""

    durations: dict[str, list[int]] = dataclasses.field(default_factory=dict)
    """The other real ranks' roles -> the compute durations their simulations use (`ClosedLoop.current`)."""
    costs: dict[int, dict[str, int]] = dataclasses.field(default_factory=dict)
    """Virtual rank -> what it measured of the ops among real ranks, the median of the last
    iterations (`RealCosts.current`); this rank's included."""
    latest: dict[int, dict[str, int]] = dataclasses.field(default_factory=dict)
    """The same, in the iteration itself (`RealCosts.latest`)."""
    spans: dict[int, list[int] | None] = dataclasses.field(default_factory=dict)
    """Virtual rank -> its compute spans in the iteration as measured; None where the iteration did
    not match the graph."""
    folded: dict[int, list[int] | None] = dataclasses.field(default_factory=dict)
    """The same as the rank's loop took them (`ClosedLoop.measure`: a span that ended in a wait the
    schedule decided at its assumed value)."""


def _start_summary(start: StartRecord) -> dict[str, float | int]:
    return {"start_ns": start.start_ns, "waited_s": start.waited_ns / 1e9, "late_s": start.late_ns / 1e9,
            "margin_s": start.margin_ns / 1e9}  # fmt: skip


def _shared_key(virtual_rank: int, number: int) -> str:
    return f"prism-megatron/closed-loop/{virtual_rank}/{number}"


def make_phase(
    config: PrismConfig,
    *,
    virtual_rank: int,
    layout: Layout | None,
    real_ranks: tuple[int, ...],
    store: Any = None,
) -> InstantPhase:
    """The pass this process runs, from --prism-phase (auto: emulate when --prism-graph is given)."""
    if not config.emulation.emulate or layout is None:
        return InstantPhase(config=config, virtual_rank=virtual_rank, virtual_world=False)
    phase = phase_name(config)
    watchdog.beat()  # the emulate pass builds its schedule next, without ops: that is progress
    common = dict(config=config, virtual_rank=virtual_rank, virtual_world=True)
    if phase == "capture":
        return CapturePhase(role=layout.role_of(virtual_rank).name, **common)
    if phase == "emulate":
        return EmulatePhase(layout=layout, real_ranks=real_ranks, store=store, **common)
    return InstantPhase(**common)


def phase_name(config: PrismConfig) -> str:
    """capture, emulate or instant: --prism-phase, where auto means emulate with --prism-graph."""
    phase = config.emulation.phase
    if phase == "auto":
        return "emulate" if config.capture.graph is not None else "instant"
    return phase


def read_progress(path: str) -> dict[str, Any] | None:
    """A progress file, or None when it is absent or being replaced."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except (OSError, json.JSONDecodeError):
        return None
