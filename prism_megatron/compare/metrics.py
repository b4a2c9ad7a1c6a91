"""What `compare` compares: every metric of a run folder, with its per-iteration samples where there are some.

A run folder (`--prism-out`) holds report.json (the measured iterations, the simulated breakdown,
peak memory) and each real rank's op log (ops/). From them, per run:

* iteration time: the samples are the iterations after warm-up (the slowest real rank's, as in
  report.json); the value is their median.
* each real rank's measured compute / exposed communication / bubble: per iteration, from its op
  log (see `measured_breakdown`); the value is the median over the iterations after warm-up.
* the simulated iteration time and each role's simulated compute / exposed communication / bubble:
  one value per run (the simulation of the captured graph is deterministic; no samples).
* peak memory per real rank, allocated and by category: one value (exact bytes; memory does not
  vary between iterations of a run).

Headline metrics (`Metric.headline`) are what the gate's verdict rests on: the iteration time, the
throughput (tokens/s per GPU, higher is better; per iteration: the run's tokens per GPU over that
iteration's time), each real rank's peak memory (allocated and reserved) and, on a modelled GPU, the
modelled iteration time (the run has no measured one). The rest is the
breakdown, which explains a change and is gated only when asked (`Thresholds.gate_breakdown`): the
measured and simulated compute / exposed communication / bubble, the simulated iteration time and
memory by category. A breakdown part moves for reasons that leave the job as fast as before (the
virtual peers' capture, the machine's load while it was made), and a gate that fails on them gets
switched off.

Each metric has a `scale_key`: the metric whose value of run A a change is measured against. A time
part (bubble, compute) is judged by what it adds to its iteration, not by its own size: a bubble
growing from 0.1 ms to 0.2 ms is +100 % of itself but +0.03 % of a 300 ms iteration.
"""

from __future__ import annotations

import dataclasses
import json
import os
import statistics
from collections.abc import Iterable, Sequence

from prism_megatron import files
from prism_megatron.replay.schedule import OpKind
from prism_megatron.report.model import RunReport
from prism_megatron.report.oplog import OpLog, load_op_logs
from prism_megatron.report.writer import load_report

TIME = "time"
MEMORY = "memory"
THROUGHPUT = "throughput"
_P2P = (OpKind.SEND, OpKind.RECV)
_PARTS = (("compute_s", "compute"), ("exposed_comm_s", "exposed comm"), ("bubble_s", "bubble"))


@dataclasses.dataclass(frozen=True)
class Metric:
    """One number of a run, and the samples it summarises (empty when the run has one value)."""

    key: str
    """Stable identifier, e.g. "rank.1.bubble" ("iteration", "role.pp0.compute", "memory.1.peak")."""
    label: str
    """What a person reads: "rank 1 bubble (measured)"."""
    kind: str
    """TIME (seconds), MEMORY (bytes) or THROUGHPUT (tokens/s per GPU)."""
    value: float
    samples: tuple[float, ...] = ()
    scale_key: str = ""
    """The metric whose run-A value a change is expressed against ("" = this metric itself)."""
    megatron_name: str | None = None
    """Megatron-LM's name of the same number, where it has one."""
    headline: bool = False
    """The verdict rests on it (see the module docstring); else a breakdown metric."""
    higher_is_better: bool = False
    """Throughput: a fall is the regression."""


@dataclasses.dataclass(frozen=True)
class RunMetrics:
    """A run folder's report and its metrics, by key, in display order."""

    run_dir: str
    report: RunReport
    metrics: dict[str, Metric]
    graph_sha256: str | None = None
    """The digest of the execution graph the run emulated (graph/graph.json), when it kept one."""


def load_run(run_dir: str) -> RunMetrics:
    """Read a run folder's metrics.

    Raises:
        ValueError: no run folder, no valid report.json, or a run that did not finish ("failed",
            "running"): its numbers would judge the failure, not the change.
    """
    if not os.path.isdir(run_dir):
        raise ValueError(f"{run_dir!r} is not a directory; pass a run folder (--prism-out of an emulation)")
    report = load_report(run_dir)
    if report.status != "ok":
        why = f": {report.failure.message}" if report.failure else ""
        raise ValueError(
            f"{run_dir}: the run's status is {report.status!r}{why}; compare needs finished runs"
        )
    metrics = list(_iteration(report))
    metrics += _ranks_measured(report, load_op_logs(run_dir))
    metrics += _simulated(report)
    metrics += _memory(report)
    return RunMetrics(run_dir, report, {m.key: m for m in metrics}, _graph_digest(run_dir))


def _graph_digest(run_dir: str) -> str | None:
    """graph.json's own content digest (see `prism_megatron.graph.io`); None without a readable one."""
    path = os.path.join(run_dir, files.GRAPH_DIR, files.GRAPH_FILE)
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f).get("sha256")
    except (OSError, ValueError, AttributeError):
        return None


def _iteration(report: RunReport) -> Iterable[Metric]:
    samples = tuple(it.time_s for it in report.iterations if not it.warmup)
    if report.iteration_time_s is not None:
        yield Metric(
            "iteration",
            "iteration time",
            TIME,
            report.iteration_time_s,
            samples,
            megatron_name="elapsed time per iteration (ms)",
            headline=True,
        )
    throughput = report.tokens_per_s_per_gpu
    if throughput is not None and report.iteration_time_s:
        tokens_per_gpu = throughput * report.iteration_time_s  # per iteration
        yield Metric(
            "throughput",
            "throughput (tokens/s per GPU)",
            THROUGHPUT,
            throughput,
            tuple(tokens_per_gpu / s for s in samples if s > 0),
            megatron_name="(global batch size x seq length / elapsed time / GPUs)",
            headline=True,
            higher_is_better=True,
        )
    if report.simulated_iteration_time_s is not None:
        label = "simulated iteration time"
        if report.modelled is not None:  # a modelled run's iteration is its simulation: a headline
            label = f"modelled iteration time ({report.modelled.method})"
        yield Metric(
            "simulated", label, TIME, report.simulated_iteration_time_s, headline=report.modelled is not None
        )


def _ranks_measured(report: RunReport, logs: dict[int, OpLog]) -> list[Metric]:
    warmup = {it.index for it in report.iterations if it.warmup}
    out = []
    for virtual_rank in report.real_ranks:
        log = logs.get(virtual_rank)
        if log is None or len(log.iteration_starts_ns) < 1:
            continue
        last_s = (
            report.iterations[-1].time_s if len(report.iterations) == len(log.iteration_starts_ns) else None
        )
        rows = [row for i, row in enumerate(measured_breakdown(log, last_s)) if i not in warmup]
        if not rows:
            continue
        for index, (_, name) in enumerate(_PARTS):
            samples = tuple(row[index] for row in rows)
            out.append(
                Metric(
                    f"rank.{virtual_rank}.{name.replace(' ', '_')}",
                    f"rank {virtual_rank} {name} (measured)",
                    TIME,
                    statistics.median(samples),
                    samples,
                    scale_key="iteration",
                )
            )
    return out


def _simulated(report: RunReport) -> list[Metric]:
    out = []
    for role in report.roles:
        for attribute, name in _PARTS:
            out.append(
                Metric(
                    f"role.{role.role}.{name.replace(' ', '_')}",
                    f"role {role.role} {name} (simulated)",
                    TIME,
                    getattr(role, attribute),
                    scale_key="simulated",
                )
            )
    return out


def _memory(report: RunReport) -> list[Metric]:
    out = []
    for virtual_rank, rank in sorted(report.ranks.items()):
        peak_key = f"memory.{virtual_rank}.peak"
        if rank.peak_memory_allocated_bytes is not None:
            out.append(
                Metric(
                    peak_key,
                    f"rank {virtual_rank} peak memory allocated",
                    MEMORY,
                    rank.peak_memory_allocated_bytes,
                    megatron_name="max allocated (MB) [memory stats]",
                    headline=True,
                )
            )
        if rank.peak_memory_reserved_bytes is not None:
            out.append(
                Metric(
                    f"memory.{virtual_rank}.reserved",
                    f"rank {virtual_rank} peak memory reserved",
                    MEMORY,
                    rank.peak_memory_reserved_bytes,
                    megatron_name="max reserved (MB) [memory stats]",
                    headline=True,
                )
            )
        for category, size in rank.memory_by_category.items():
            out.append(
                Metric(
                    f"memory.{virtual_rank}.{category}",
                    f"rank {virtual_rank} {category.replace('_', ' ')} at the peak",
                    MEMORY,
                    size,
                    scale_key=peak_key,
                )
            )
    return out


def measured_breakdown(log: OpLog, last_iteration_s: float | None = None) -> list[tuple[float, float, float]]:
    """Per iteration of a real rank, (compute, exposed communication, bubble) in seconds.

    The same parts as the simulator's breakdown (`prism_megatron.sim.breakdown`), from what the
    rank measured: an iteration runs from its start mark to the next one (the last for
    `last_iteration_s`, else to the latest time the log mentions). Compute is the time in the log's compute spans; of the rest, time
    while a collective's transfer is under way (its start, when the last member arrived, to its
    completion) is exposed communication, and everything else is bubble: waiting for peers to
    arrive (a collective's issue to its start), pipeline sends and receives, and time with nothing
    to do. A p2p op's record does not separate the peer's arrival from the transfer, so its whole
    time counts as bubble: on a pipeline that is mostly waiting for the neighbouring stage.
    """
    starts = list(log.iteration_starts_ns)
    if not starts:
        return []
    last_end_ns = (
        starts[-1] + round(last_iteration_s * 1e9)
        if last_iteration_s is not None
        else max(log.latest_ns() or starts[-1], starts[-1])
    )
    ends = [*starts[1:], last_end_ns]
    compute = _merge((c.start_ns, c.end_ns) for c in log.compute)
    transfer = _merge(
        (e.start_ns, e.complete_ns)
        for e in log.events
        if e.kind not in _P2P and e.complete_ns >= e.start_ns >= 0
    )
    rows = []
    for begin, end in zip(starts, ends, strict=True):
        window = end - begin
        busy = _clip(compute, begin, end)
        computing = _length(busy)
        exposed = _length(_clip(transfer, begin, end)) - _overlap(_clip(transfer, begin, end), busy)
        rows.append((computing / 1e9, exposed / 1e9, (window - computing - exposed) / 1e9))
    return rows


def _merge(spans: Iterable[tuple[int, int]]) -> list[tuple[int, int]]:
    merged: list[list[int]] = []
    for begin, end in sorted(s for s in spans if s[1] > s[0]):
        if merged and begin <= merged[-1][1]:
            merged[-1][1] = max(merged[-1][1], end)
        else:
            merged.append([begin, end])
    return [(b, e) for b, e in merged]


def _clip(spans: Sequence[tuple[int, int]], begin: int, end: int) -> list[tuple[int, int]]:
    return [(max(b, begin), min(e, end)) for b, e in spans if e > begin and b < end]


def _length(spans: Sequence[tuple[int, int]]) -> int:
    return sum(e - b for b, e in spans)


def _overlap(a: Sequence[tuple[int, int]], b: Sequence[tuple[int, int]]) -> int:
    """Total length of the intersection of two merged, sorted span lists."""
    total, i, j = 0, 0, 0
    while i < len(a) and j < len(b):
        low, high = max(a[i][0], b[j][0]), min(a[i][1], b[j][1])
        total += max(0, high - low)
        if a[i][1] < b[j][1]:
            i += 1
        else:
            j += 1
    return total
