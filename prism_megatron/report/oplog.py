"""Measured op logs of real ranks: what each real rank did, on disk, and as timeline spans.

A real rank's process knows when it issued each communication op and when the op completed (the
backend's op log, `prism_megatron.replay.OpEvent`), and may know its compute spans and iteration
starts; the orchestrator is another process. So each real rank's log is a file in the run folder,
`ops/rank-<virtual rank, 5 digits>.json`, that the report reads back and draws.

All times are the device timeline's (`prism_megatron.replay.timeline`), in ns: CLOCK_MONOTONIC
(`time.monotonic_ns`) on CPU, which real ranks on one machine share and the launcher synchronises
across machines at start-up; the GPU global timer on CUDA (real ranks on one GPU share it).
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Mapping, Sequence

from prism_megatron import files
from prism_megatron.replay.events import OpEvent
from prism_megatron.replay.schedule import OpKind
from prism_megatron.sim.timeline import Span
from prism_megatron.topology import format_ranks

OPLOG_SCHEMA_VERSION = 1
COMPUTE_THREAD = "compute"
COMM_THREAD = "comm"


@dataclasses.dataclass(frozen=True, slots=True)
class ComputeSpan:
    """A stretch of compute a real rank measured (for example one microbatch's forward)."""

    name: str
    start_ns: int
    end_ns: int


@dataclasses.dataclass(frozen=True, slots=True)
class MemorySample:
    """Live bytes by category at one moment (the CPU memory account's samples)."""

    time_ns: int
    bytes_by_category: dict[str, int]


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpLog:
    """Everything one real rank measured that the timeline draws."""

    virtual_rank: int
    events: tuple[OpEvent, ...] = ()
    compute: tuple[ComputeSpan, ...] = ()
    iteration_starts_ns: tuple[int, ...] = ()
    """When each training iteration started (`prism_megatron.replay.mark_iteration_start`)."""
    memory: tuple[MemorySample, ...] = ()
    """Live memory by category over the run (CPU only; empty where nothing sampled it)."""

    def earliest_ns(self) -> int | None:
        """The first time the log mentions (None for an empty log)."""
        times = [e.issue_ns for e in self.events] + [c.start_ns for c in self.compute]
        times += [m.time_ns for m in self.memory]
        return min([*times, *self.iteration_starts_ns], default=None)

    def latest_ns(self) -> int | None:
        times = [max(e.issue_ns, e.start_ns, e.complete_ns) for e in self.events]
        times += [m.time_ns for m in self.memory]
        return max([*times, *(c.end_ns for c in self.compute), *self.iteration_starts_ns], default=None)


def as_op_log(virtual_rank: int, ops: OpLog | Sequence[OpEvent]) -> OpLog:
    """An `OpLog` from either a log or a plain list of the rank's `OpEvent`s."""
    if isinstance(ops, OpLog):
        assert ops.virtual_rank == virtual_rank, (ops.virtual_rank, virtual_rank)
        return ops
    return OpLog(virtual_rank=virtual_rank, events=tuple(ops))


def op_log_to_json(log: OpLog) -> dict:
    events = []
    for event in log.events:
        row = {f.name: getattr(event, f.name) for f in dataclasses.fields(event)}
        row["kind"] = event.kind.name.lower()
        row["group"] = list(event.group)
        events.append(row)
    return {
        "schema_version": OPLOG_SCHEMA_VERSION,
        "virtual_rank": log.virtual_rank,
        "events": events,
        "compute": [dataclasses.asdict(c) for c in log.compute],
        "iteration_starts_ns": list(log.iteration_starts_ns),
        "memory": [[m.time_ns, m.bytes_by_category] for m in log.memory],
    }


def op_log_from_json(doc: dict, source: str) -> OpLog:
    """Read one log; ValueError naming the file when it is not one."""
    try:
        if doc["schema_version"] != OPLOG_SCHEMA_VERSION:
            raise ValueError(f"schema_version {doc['schema_version']}, expected {OPLOG_SCHEMA_VERSION}")
        events = tuple(
            OpEvent(**{**row, "kind": OpKind[row["kind"].upper()], "group": tuple(row["group"])})
            for row in doc["events"]
        )
        return OpLog(
            virtual_rank=int(doc["virtual_rank"]),
            events=events,
            compute=tuple(ComputeSpan(**c) for c in doc.get("compute", ())),
            iteration_starts_ns=tuple(int(t) for t in doc.get("iteration_starts_ns", ())),
            memory=tuple(
                MemorySample(int(t), {str(k): int(v) for k, v in b.items()}) for t, b in doc.get("memory", ())
            ),
        )
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{source}: not a measured op log ({exc})") from exc


def load_op_logs(run_dir: str) -> dict[int, OpLog]:
    """Every real rank's log in `run_dir/ops/`, by virtual rank ({} when there is none)."""
    directory = files.op_log_dir(run_dir)
    if not os.path.isdir(directory):
        return {}
    logs = {}
    for name in sorted(os.listdir(directory)):
        if files.is_rank_file(name):
            path = os.path.join(directory, name)
            log = op_log_from_json(files.read_json(path, "measured op log"), path)
            logs[log.virtual_rank] = log
    return logs


def measured_spans(log: OpLog, *, end_ns: int) -> list[Span]:
    """The log's spans: compute on "compute", communication on "comm" lanes.

    Ops that overlap in time (async ops, a wait on one while another is in flight) go to further
    lanes "comm 2", "comm 3", ... because a trace viewer draws one thread's spans as a stack that
    must nest. An op that never completed (a failed run) is drawn up to `end_ns` and says so.
    """
    spans = [
        Span(log.virtual_rank, COMPUTE_THREAD, c.name, "compute", c.start_ns, c.end_ns, {})
        for c in log.compute
    ]
    lane_free_ns: list[int] = []
    for event in sorted(log.events, key=lambda e: e.issue_ns):
        done = event.complete_ns >= 0
        stop_ns = max(event.complete_ns if done else end_ns, event.issue_ns)
        lane = next((i for i, free in enumerate(lane_free_ns) if free <= event.issue_ns), len(lane_free_ns))
        if lane == len(lane_free_ns):
            lane_free_ns.append(stop_ns)
        lane_free_ns[lane] = stop_ns
        thread = COMM_THREAD if lane == 0 else f"{COMM_THREAD} {lane + 1}"
        category = _category(event.kind)
        spans.append(
            Span(
                log.virtual_rank, thread, _name(event), category, event.issue_ns, stop_ns, _args(event, done)
            )
        )
    return spans


def _name(event: OpEvent) -> str:
    kind = event.kind.name.lower()
    return f"{kind} {'to' if event.kind == OpKind.SEND else 'from'} {event.peer}" if event.peer >= 0 else kind


def _category(kind: OpKind) -> str:
    return "p2p" if kind in (OpKind.SEND, OpKind.RECV) else "collective"


def _args(event: OpEvent, done: bool) -> dict:
    args = {
        "group": format_ranks(list(event.group)),
        "group_size": len(event.group),
        "seq": event.seq,
        "size_bytes": event.size_bytes,
        "dtype": event.dtype,
        "async": event.async_op,
        "virtual_peers": event.has_virtual,
        # Before start_ns the op waited for its last member (a virtual peer's replayed arrival).
        "wait_for_peers_us": max(event.start_ns - event.issue_ns, 0) / 1000,
    }
    if not done:
        args["completed"] = False
    return args


def save_op_log(run_dir: str, log: OpLog) -> str:
    """Write one real rank's log to `run_dir/ops/` atomically (a real rank may call it itself)."""
    return files.write_json(op_log_to_json(log), files.op_log_path(run_dir, log.virtual_rank))


def as_op_logs(measured_ops: Mapping[int, OpLog | Sequence[OpEvent]] | None) -> dict[int, OpLog]:
    return {int(r): as_op_log(int(r), ops) for r, ops in (measured_ops or {}).items()}
