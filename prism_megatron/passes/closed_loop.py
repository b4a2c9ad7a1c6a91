"""The closed loop: the next iteration's replay schedule follows what the real rank just measured.

Each real rank simulates the job from the execution graph and loads its own replay schedule before
the first iteration. After every emulated iteration past warm-up it folds the compute spans it
measured into its role's durations (`Problem.with_compute_durations`; the median of the last few
iterations, so one noisy iteration does not steer the next), and into every role of its class
(roles that run the same program, `graph.classes.spread`: each span at its place in that role's
order), re-simulates (one node per role unless a what-if makes ranks differ: milliseconds) and
loads the new schedule. Its virtual peers of the same class (its data-parallel peers, the other
ranks of its stage, the middle stages alike) then run as it ran, and every other role's virtual
ranks react to that through the simulated dependencies.

The real ranks share what they measured: each publishes its role's current durations in the
rendezvous store after every fold, and folds the latest the others published (`others`), so every
real rank's virtual peers follow every real rank. A value is at most one iteration old; the store
is read without waiting, so a slower rank never holds a faster one back.

One span cannot be measured in replay mode: the compute before waiting on an async op (a TP
all-reduce overlapped with the weight-gradient GEMM) when the op completed at its scheduled time.
The backend completes it when the program waits on it or when the replay schedule says, whichever
is later, so such a completion hides when the program began to wait. Folding it would count the
wait as compute, the next schedule would make the peers later still, and spans would only ever
grow; `blocked_waits` finds these and the loop keeps their previous value.
"""

from __future__ import annotations

import collections
import dataclasses
import os
import statistics
from collections.abc import Collection, Mapping, Sequence

from prism_megatron import files
from prism_megatron.graph import COMPUTE_STREAM, Dep, ExecutionGraph, LayoutWorld, NodeType, Op, load_graph
from prism_megatron.graph.capture import (
    CapturedIteration,
    RankCapture,
    build_graph,
    compute_durations,
    first_difference,
)
from prism_megatron.graph.classes import ClassProgram, class_programs, load_classes, spread
from prism_megatron.passes.schedule_index import ScheduleIndex
from prism_megatron.replay.events import OpEvent
from prism_megatron.replay.schedule import ReplaySchedule
from prism_megatron.sim import CostFn, NetworkCost, WhatIf
from prism_megatron.sim.engine import SimResult, run_problem
from prism_megatron.sim.problem import build_problem
from prism_megatron.topology import Layout

DEFAULT_WINDOW = 3
WAIT_TOLERANCE_NS = 200_000
"""A completion this close to the scheduled one counts as the program having waited for it (the
backend's local work and the wake-up after a timed wait take tens of microseconds)."""


def network_cost(cluster: str) -> CostFn:
    """The cost of every communication op on the cluster: a preset name or a cluster spec file (the
    NCCL cost model), or a file of costs measured where the job runs (`network.measured`)."""
    from prism_megatron.network import CostModel, load_cluster
    from prism_megatron.network.measured import is_measured, load_measured

    if is_measured(cluster):
        return load_measured(cluster)
    return NetworkCost(CostModel(load_cluster(cluster)))


def load_or_build_graph(
    path: str, layout: Layout, *, extra: Mapping[str, object] | None = None
) -> ExecutionGraph:
    """The graph in `path`: a graph directory, or a folder of capture files (built here, with the
    role classes saved beside them when the run that captured them saved some).

    Raises:
        ValueError: nothing usable there, or a graph of another job (its layout differs).
    """
    if os.path.isfile(os.path.join(path, files.GRAPH_FILE)) or path.endswith(".json"):
        graph = load_graph(path)
        mismatches = graph.metadata.mismatches(layout.kwargs())
        if mismatches:
            raise ValueError(
                f"--prism-graph {path} was captured for another job: {'; '.join(mismatches)}; "
                "capture again or pass the flags it was captured with"
            )
        return graph
    captures = [RankCapture.load(p) for p in files.capture_paths(path)]
    if not captures:
        raise ValueError(
            f"--prism-graph {path}: neither {files.GRAPH_FILE} nor capture-*.json files are there"
        )
    return build_graph(
        captures, LayoutWorld(layout), layout.kwargs(), extra=extra, classes=load_classes(path)
    )


@dataclasses.dataclass
class ClosedLoop:
    """One real rank's simulation of the job, re-run with what the rank measures.

    Build with `ClosedLoop.start(...)`; `schedule()` is what the replay engine loads next.
    """

    base: object
    """The `Problem` built from the graph (durations as captured)."""
    result: SimResult
    role: str
    virtual_rank: int
    real_ranks: tuple[int, ...]
    graph_streams: Mapping[str, Sequence[Op]]
    measured: collections.deque
    index: ScheduleIndex
    current: list[int]
    """The role's compute durations the current simulation uses."""
    num_folded: int = 0
    programs: Mapping[str, ClassProgram] = dataclasses.field(default_factory=dict)
    """Role -> its class's program (`graph.classes.class_programs`), for folding into the class."""

    @classmethod
    def start(
        cls,
        graph: ExecutionGraph,
        world: LayoutWorld,
        cost_fn,
        *,
        virtual_rank: int,
        real_ranks: Sequence[int],
        what_if: WhatIf | None = None,
        window: int = DEFAULT_WINDOW,
    ) -> ClosedLoop:
        base = build_problem(graph, world, cost_fn, what_if)
        role = world.roles()[int(world.role_ids()[virtual_rank])]
        result = run_problem(base)
        return cls(
            base=base,
            result=result,
            role=role,
            virtual_rank=virtual_rank,
            real_ranks=tuple(real_ranks),
            graph_streams=graph.roles[role].streams,
            measured=collections.deque(maxlen=window),
            index=ScheduleIndex(result, virtual_rank, tuple(real_ranks)),
            current=compute_durations(graph.roles[role].streams),
            programs=class_programs(graph),
        )

    def schedule(self) -> ReplaySchedule:
        return self.index.schedule(self.result)

    @property
    def iteration_time_ns(self) -> int:
        return self.result.iteration_time_ns

    def fold(
        self,
        streams: Mapping[str, Sequence[Op]],
        keep: Collection[int] = (),
        others: Mapping[str, Sequence[int]] | None = None,
    ) -> str | None:
        """Fold one measured iteration (`graph.capture.iteration_streams`) and re-simulate.

        Args:
            keep: positions (among the compute ops) whose measurement cannot be trusted; they keep
                the value the current simulation uses.
            others: other roles' current durations, as the other real ranks measured them (each folds
                into its class too).

        Returns None when folded, else why not (the iteration issued other ops than the graph).
        """
        difference = first_difference(self.graph_streams, streams)
        if difference is not None:
            return f"the iteration's ops differ from the graph's at {difference}"
        measured = compute_durations(streams)
        for position in keep:
            measured[position] = self.current[position]
        self.measured.append(measured)
        self.current = [round(statistics.median(values)) for values in zip(*self.measured, strict=True)]
        durations = {role: list(values) for role, values in (others or {}).items() if role != self.role}
        durations[self.role] = self.current
        self.result = run_problem(self.base.with_compute_durations(spread(self.programs, durations)))
        self.num_folded += 1
        return None


def blocked_waits(
    iteration: CapturedIteration,
    streams: Mapping[str, Sequence[Op]],
    posted: Mapping[OpEvent, Dep],
    schedule: ReplaySchedule,
) -> set[int]:
    """Positions (among the compute ops) of the spans that end where the program waited on an async
    op that then completed at its scheduled time (see the module docstring).

    Args:
        posted: the async ops' events and their side-stream ops (`iteration_streams(..., posted=)`).
        schedule: the replay schedule the iteration ran with (the engine counts a group's ops in
            issue order, so the n-th op issued on a group is the schedule's n-th for it).
    """
    slot_index: collections.Counter[tuple[int, ...]] = collections.Counter()
    blocked: set[Dep] = set()
    collectives = sorted((e for e in iteration.events if e.peer < 0), key=lambda e: e.issue_ns)
    for event in collectives:
        index = slot_index[event.group]
        slot_index[event.group] += 1
        if event not in posted or not event.has_virtual:
            continue
        ops = schedule.collectives.get(event.group, ())
        cost_ns = max(ops[index].cost_ns, 0) if index < len(ops) else 0
        if event.complete_ns <= event.start_ns + cost_ns + WAIT_TOLERANCE_NS:
            blocked.add(posted[event])
    positions, compute_position = set(), -1
    for op in streams[COMPUTE_STREAM]:
        if op.type == NodeType.COMPUTE:
            compute_position += 1
        elif op.type == NodeType.WAIT and blocked.intersection(op.deps):
            positions.add(compute_position)
    return positions
