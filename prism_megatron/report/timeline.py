"""timeline.json: one Perfetto trace of the real ranks (measured) beside the virtual ranks (replayed).

Each rank is one trace process named by its virtual rank and coordinates, "rank 7168 (tp=0 pp=14
dp=0) real" or "rank 7169 (tp=1 pp=14 dp=0) virtual, replayed", with one thread per stream.
Real ranks come first. Timestamps are µs from the run start (the earliest time a real rank's log
mentions).

Real ranks show what their op logs measured (`oplog.py`): one track per stream, an "iterations"
track with a span per training iteration, and memory counter tracks (live bytes by category, in
MiB, where the rank sampled them: the CPU account). Arrows link a send to its receive and a
collective's last arrival to its completion (`links.py`). Virtual ranks show the simulated
timeline of one iteration, the one whose arrivals the replay engine played back; it is drawn from
the start of the last iteration the real ranks measured, so a real rank's wait lines up with the
virtual peer it waited for. Which virtual ranks: by default each real rank's pipeline neighbours,
tensor-parallel peers and data-, context- and expert-parallel neighbours, then one representative
per role, at most `DEFAULT_MAX_VIRTUAL_TRACKS` (a trace of thousands of ranks helps nobody).
On a modelled GPU no rank runs in real time: every track is the simulation's, named "modelled":
the ranks --prism-ranks names (a run's report passes them), the captured ranks, then one
representative per role (`modelled_ranks`).

The simulated spans are saved in the run folder (`files.SIMULATED_SPANS_FILE`) when the report is written, so
`prism-megatron report RUN_DIR` redraws the same virtual tracks without simulating again.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping

from prism_megatron import files
from prism_megatron.graph.world import LayoutWorld
from prism_megatron.report.links import flows
from prism_megatron.report.oplog import OpLog, measured_spans
from prism_megatron.report.trace import Counter, chrome_trace
from prism_megatron.sim import SimResult
from prism_megatron.sim.timeline import Span, spans
from prism_megatron.topology import Layout

DEFAULT_MAX_VIRTUAL_TRACKS = 64
ITERATIONS_THREAD = "iterations"
MEMORY_COUNTER = "memory (MiB)"
SIMULATED_SCHEMA_VERSION = 1
_NEIGHBOUR_KINDS = ("dp", "cp", "ep")


@dataclasses.dataclass(frozen=True, kw_only=True)
class SimulatedTracks:
    """The simulated iteration of the virtual ranks the timeline shows, times from its start."""

    spans: tuple[Span, ...]
    roles: Mapping[int, str]
    """Virtual rank -> role name, for every rank drawn."""

    @classmethod
    def from_result(cls, result: SimResult, virtual_ranks: Iterable[int]) -> SimulatedTracks:
        ranks = list(virtual_ranks)
        problem = result.problem
        roles = {r: problem.role_names[int(problem.arrays["node_role"][problem.node_of(r)])] for r in ranks}
        return cls(spans=tuple(spans(result, ranks)), roles=roles)

    def to_json(self) -> dict:
        rows = [[s.process, s.thread, s.name, s.category, s.start_ns, s.end_ns, s.args] for s in self.spans]
        roles = {str(r): role for r, role in self.roles.items()}
        return {"schema_version": SIMULATED_SCHEMA_VERSION, "roles": roles, "spans": rows}

    @classmethod
    def from_json(cls, doc: dict, source: str) -> SimulatedTracks:
        try:
            if doc["schema_version"] != SIMULATED_SCHEMA_VERSION:
                raise ValueError(
                    f"schema_version {doc['schema_version']}, expected {SIMULATED_SCHEMA_VERSION}"
                )
            return cls(
                spans=tuple(Span(*row) for row in doc["spans"]),
                roles={int(r): str(role) for r, role in doc["roles"].items()},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{source}: not a simulated timeline ({exc})") from exc

    def save(self, run_dir: str) -> str:
        return files.write_json(self.to_json(), os.path.join(run_dir, files.SIMULATED_SPANS_FILE))

    @classmethod
    def load(cls, run_dir: str) -> SimulatedTracks | None:
        """The saved tracks of a run folder; None when it has none."""
        path = os.path.join(run_dir, files.SIMULATED_SPANS_FILE)
        if not os.path.isfile(path):
            return None
        return cls.from_json(files.read_json(path, "simulated timeline"), path)


def represented_ranks(
    result: SimResult, real_ranks: Iterable[int], *, limit: int = DEFAULT_MAX_VIRTUAL_TRACKS
) -> list[int]:
    """The virtual ranks the timeline shows by default (see the module docstring), in that order."""
    world = result.problem.world
    real = list(real_ranks)
    wanted: list[int] = []
    for virtual_rank in real:
        wanted += _neighbours(world, "pp", virtual_rank)
        wanted += list(_group(world, "tp", virtual_rank))
        for kind in _NEIGHBOUR_KINDS:
            wanted += _neighbours(world, kind, virtual_rank)
    wanted += [world.representative(name) for name in result.problem.role_names]
    chosen = [r for r in dict.fromkeys(wanted) if r not in set(real)]
    return chosen[:limit]


def modelled_ranks(result: SimResult, captured_ranks: Iterable[int], limit: int) -> list[int]:
    """The ranks a modelled GPU's timeline shows: `captured_ranks` (the run passes the ranks asked
    for first), then one representative per role. Every rank of a modelled run is simulated, and the ranks of a role share its modelled ops,
    so `represented_ranks`' neighbours and peers would draw the same spans again (a 16,384-GPU
    job's timeline was 1.3 million spans, 210 MB, most of them repeats)."""
    world = result.problem.world
    wanted = [*captured_ranks, *(world.representative(name) for name in result.problem.role_names)]
    return list(dict.fromkeys(wanted))[:limit]


def timeline_ranks(result: SimResult, real_ranks: Iterable[int], *, modelled: bool, limit: int) -> list[int]:
    """The simulated ranks a timeline shows by default: `modelled_ranks` on a modelled GPU, else
    `represented_ranks`."""
    if modelled:
        return modelled_ranks(result, real_ranks, limit)
    return represented_ranks(result, real_ranks, limit=limit)


def _group(world, kind: str, virtual_rank: int) -> tuple[int, ...]:
    try:
        return world.group(kind, virtual_rank)
    except ValueError:  # a world without groups of this kind (hand-made worlds in tests)
        return ()


def _neighbours(world, kind: str, virtual_rank: int) -> list[int]:
    """The members just before and after the rank in its group of this kind (no wrap-around)."""
    members = _group(world, kind, virtual_rank)
    if virtual_rank not in members:
        return []
    at = members.index(virtual_rank)
    return [members[i] for i in (at - 1, at + 1) if 0 <= i < len(members)]


def process_name(
    virtual_rank: int, layout: Layout | None, *, real: bool, role: str | None = None, modelled: bool = False
) -> str:
    """ "rank 7168 (tp=0 pp=14 dp=0) real", "... virtual, replayed" or, on a modelled GPU,
    "... modelled"; cp and ep shown when > 1."""
    kind = "modelled" if modelled else "real" if real else "virtual, replayed"
    if layout is None or not 0 <= virtual_rank < layout.world_size:
        return f"rank {virtual_rank}" + (f" ({role})" if role else "") + f" {kind}"
    coords = layout.coords(virtual_rank)
    shown = ["tp", *(["cp"] if layout.cp > 1 else []), "pp", "dp", *(["ep"] if layout.ep > 1 else [])]
    return f"rank {virtual_rank} ({' '.join(f'{c}={getattr(coords, c)}' for c in shown)}) {kind}"


def timeline_trace(
    real_ranks: Iterable[int],
    real_logs: Mapping[int, OpLog],
    simulated: SimulatedTracks | None,
    layout: Layout | None,
    *,
    modelled: bool = False,
) -> dict:
    """The Chrome/Perfetto trace of the real ranks' logs and the simulated virtual ranks.

    Every real rank gets its named track, empty when it left no log (a rank that died early).
    `modelled`: a modelled GPU's run, whose every rank is simulated (pass no real ranks or logs):
    the tracks are named "modelled".
    """
    starts = [t for log in real_logs.values() if (t := log.earliest_ns()) is not None]
    ends = [t for log in real_logs.values() if (t := log.latest_ns()) is not None]
    run_start_ns = min(starts, default=0)
    end_ns = max(ends, default=run_start_ns)
    measured: list[Span] = []
    counters: list[Counter] = []
    names: dict[int, str] = {}
    real = sorted({*real_ranks, *real_logs})
    for virtual_rank in real:
        names[virtual_rank] = process_name(virtual_rank, layout, real=True)
        if virtual_rank in real_logs:
            log = real_logs[virtual_rank]
            spans = [*_iteration_spans(log, end_ns), *measured_spans(log, end_ns=end_ns)]
            measured += _shifted(spans, -run_start_ns)
            counters += _memory_counters(log, -run_start_ns)
    replayed: list[Span] = []
    if simulated is not None:
        origin_ns = _simulated_origin_ns(real_logs, run_start_ns) - run_start_ns
        for virtual_rank, role in simulated.roles.items():
            if virtual_rank not in names:
                names[virtual_rank] = process_name(
                    virtual_rank, layout, real=False, role=role, modelled=modelled
                )
        replayed = _shifted((s for s in simulated.spans if s.process not in real), origin_ns)
    world = LayoutWorld(layout) if layout is not None else None
    trace = chrome_trace(
        [*measured, *replayed], names, flows=flows(measured, replayed, world), counters=counters
    )
    trace["traceEvents"] += [
        {"ph": "M", "name": "process_sort_index", "pid": pid, "tid": 0, "args": {"sort_index": index}}
        for index, pid in enumerate(names)
    ]
    return trace


def _iteration_spans(log: OpLog, end_ns: int) -> list[Span]:
    """One span per training iteration, from its start to the next one's (the last: to `end_ns`)."""
    starts = list(log.iteration_starts_ns)
    stops = [*starts[1:], max(end_ns, starts[-1])] if starts else []
    return [
        Span(log.virtual_rank, ITERATIONS_THREAD, f"iteration {i}", "iteration", a, b, {"index": i})
        for i, (a, b) in enumerate(zip(starts, stops, strict=True))
    ]


def _memory_counters(log: OpLog, offset_ns: int) -> list[Counter]:
    return [
        Counter(
            log.virtual_rank,
            MEMORY_COUNTER,
            sample.time_ns + offset_ns,
            {category: size / (1 << 20) for category, size in sample.bytes_by_category.items()},
        )
        for sample in log.memory
    ]


def _simulated_origin_ns(real_logs: Mapping[int, OpLog], run_start_ns: int) -> int:
    """The start of the last measured iteration (the earliest real rank's), else the run start."""
    last_starts = [log.iteration_starts_ns[-1] for log in real_logs.values() if log.iteration_starts_ns]
    return min(last_starts, default=run_start_ns)


def _shifted(items: Iterable[Span], offset_ns: int) -> list[Span]:
    """The spans moved by `offset_ns` (with the last arrival a simulated span records)."""
    if offset_ns == 0:  # a modelled run's: every span where the simulation put it
        return list(items)
    out = []
    for s in items:  # Span(...), not dataclasses.replace: a modelled job's timeline has 10^5 spans
        args = {**s.args, "ready_ns": s.args["ready_ns"] + offset_ns} if "ready_ns" in s.args else s.args
        out.append(
            Span(s.process, s.thread, s.name, s.category, s.start_ns + offset_ns, s.end_ns + offset_ns, args)
        )
    return out
