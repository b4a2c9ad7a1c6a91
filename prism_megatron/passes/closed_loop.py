"""The closed loop: the next iteration's replay schedule follows what the real rank just measured.

Each real rank simulates the job from the execution graph and loads its own replay schedule before
the first iteration. After every emulated iteration past warm-up it folds the compute spans it
measured into its role's durations (`Problem.with_compute_durations`; the spans of the median of the
last few iterations, so one noisy iteration does not steer the next), and into every role of its class
(roles that run the same program, `graph.classes.spread`: each span at its place in that role's
order), re-simulates (one node per role unless a what-if makes ranks differ: milliseconds) and
loads the new schedule. Its virtual peers of the same class (its data-parallel peers, the other
ranks of its stage, the middle stages alike) then run as it ran, and every other role's virtual
ranks react to that through the simulated dependencies.

The real ranks share what they measured: after each iteration each takes its own measurement
(`measure`), publishes its role's durations in the rendezvous store, waits until every real rank
has published that iteration's, and re-simulates with all of them (`resimulate`). Every real rank
then simulates from the same inputs, so all load schedules of one simulated job, and each emulated
iteration can be compared with the simulation of the schedule it ran. The wait lies between
iterations, where the real ranks wait for their agreed start anyway (`agreed_start.py`).

The ops among real ranks (a transfer between two real stages, the real part of a collective with
two or more real members) run for real; on the CPU device over the host, which takes far longer
than the target's network. Each real rank publishes what it measured of them with its durations, and the loop gives
them those costs instead of the network model's (`real_costs.py`), so the simulation describes the
job the emulation runs and each emulated iteration can be compared with it.

The compute before waiting on an async op (a TP all-reduce overlapped with the weight-gradient
GEMM) ends where the program began to wait, which the backend records (`OpEvent.wait_ns`). Where
it was not recorded (the program asked through a future), the span ends at the completion, and
when the op completed at its scheduled time that hides when the program began to wait. Folding
it would count the wait as compute, the next schedule would make the peers later still, and spans
would only ever grow (a virtual straggler, whose compute is the measured one times its factor,
the fastest); `blocked_waits` finds these and the loop keeps their previous value.
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
from prism_megatron.passes.real_costs import is_mixed, op_keys, shared_costs
from prism_megatron.passes.replayed import replayed_finish_ns
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
    real_ops: Mapping[int, tuple[str, Mapping[str, Sequence[int]]]] = dataclasses.field(default_factory=dict)
    """Real rank -> (its role, instance key -> positions of its role's ops among real ranks), for
    the costs the real ranks measure (`real_costs.py`)."""
    indices: dict[int, ScheduleIndex] = dataclasses.field(default_factory=dict)
    """Real rank -> where its schedule reads its virtual members' arrivals (for `replayed_ns`)."""
    window: collections.deque = dataclasses.field(
        default_factory=lambda: collections.deque(maxlen=DEFAULT_WINDOW)
    )
    """The last iterations after warm-up (`judge`): every real rank's spans as folded and the costs
    measured of the ops among them, or None where a real rank's iteration did not match the graph;
    the measurements the current schedule was simulated from (`expected_ns`)."""

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
        roles = world.roles()
        role = roles[int(world.role_ids()[virtual_rank])]
        result = run_problem(base)
        index = ScheduleIndex(result, virtual_rank, tuple(real_ranks))
        real_ops = {}
        for rank in real_ranks:
            role_id = int(world.role_ids()[rank])
            real_ops[rank] = (roles[role_id], op_keys(base.role_ops[role_id], world, rank, real_ranks))
        return cls(
            base=base,
            result=result,
            role=role,
            virtual_rank=virtual_rank,
            real_ranks=tuple(real_ranks),
            graph_streams=graph.roles[role].streams,
            measured=collections.deque(maxlen=window),
            window=collections.deque(maxlen=window),
            index=index,
            current=compute_durations(graph.roles[role].streams),
            programs=class_programs(graph),
            real_ops=real_ops,
            indices={virtual_rank: index},
        )

    def schedule(self) -> ReplaySchedule:
        return self.index.schedule(self.result)

    @property
    def iteration_time_ns(self) -> int:
        """The simulated job's iteration: until the last op of any rank completes."""
        return self.result.iteration_time_ns

    @property
    def finish_ns(self) -> int:
        """When this rank's last op completes in the simulation: what its emulated iteration, from
        its start to its own end, is compared with. The job's iteration can end later, on a rank
        with more work after the last op they share (the last pipeline stage's optimizer step)."""
        return self.result.finish_ns(self.virtual_rank)

    def replayed_ns(
        self,
        compute_ns: Mapping[int, Sequence[int]],
        costs: Mapping[int, Mapping[str, int]] | None = None,
    ) -> dict[int, int]:
        """The current schedule replayed with one iteration's own compute spans and costs of the ops
        among real ranks (`replayed.py`): what that iteration should have taken on each real rank,
        had every op completed as the schedule says. Every real rank's loop simulates the same job,
        so each can replay them all.

        Call it before `resimulate`, while `result` is the simulation of the schedules the
        iteration ran.

        Args:
            compute_ns: real rank -> its measured spans in the iteration
                (`graph.capture.compute_durations`); every real rank's, this one's included.
            costs: what each real rank measured of the ops among real ranks in the iteration
                (virtual rank -> `RealCosts.latest()`); they cost that in the replay, by the rule
                `real_op_costs` gives the simulation.
        """
        op_costs: dict[int, dict[int, int]] = {}
        if costs:
            by_role = self.real_op_costs(costs)
            op_costs = {
                rank: by_role.get(role, {}) for rank, (role, _) in self.real_ops.items() if rank in compute_ns
            }
        for rank in compute_ns:
            if rank not in self.indices:
                self.indices[rank] = ScheduleIndex(self.result, rank, self.real_ranks)
        return replayed_finish_ns(
            self.result,
            compute_ns=compute_ns,
            arrivals_ns={rank: self.indices[rank].arrivals(self.result) for rank in compute_ns},
            shared={rank: keys for rank, (_, keys) in self.real_ops.items()},
            op_costs_ns=op_costs,
        )

    def judge(
        self,
        spans: Mapping[int, Sequence[int]] | None,
        folded: Mapping[int, Sequence[int]] | None,
        costs: Mapping[int, Mapping[str, int]] | None = None,
    ) -> tuple[dict[int, int] | None, dict[int, int] | None]:
        """One iteration against the schedule it ran: that schedule's expected finish of each real
        rank (`expected_ns`, from the iterations before this one) and its replay with this
        iteration's measurements (`replayed_ns`). Then the iteration joins the window the next
        schedule is simulated from. Call it once per iteration after warm-up, before `resimulate`.

        Args:
            spans: each real rank's compute spans in the iteration as measured (`replayed_ns`);
                None where a real rank's iteration did not match the graph: no replay, and a gap in
                the window (no expected time until it has left the window).
            folded: the same as the real ranks' loops took them (`measure`: a span that ended in a
                wait the schedule decided at its assumed value); what the window keeps.
            costs: what each real rank measured of the ops among real ranks in the iteration.
        """
        expected = self.expected_ns()
        replayed = None if spans is None else self.replayed_ns(spans, costs)
        self.window.append(None if spans is None or folded is None else (dict(folded), costs))
        return expected, replayed

    def expected_ns(self) -> dict[int, int] | None:
        """The current schedule's expected finish of each real rank: the schedule replayed with each
        iteration of the window it was simulated from (as the loops took them, with the costs of
        the ops among real ranks measured in each), the median of those replays (the larger of the
        two middle ones in an even window, as `median_iteration`).

        The schedule itself is simulated from one iteration's spans per role (`median_iteration`),
        chosen for each real rank apart. An iteration's spans move from the window's, some up, some
        down, and the emulation takes the moves one-sidedly: a span that runs long delays every op
        after it on the rank's path and, where two real ranks feed each other, on the other's; one
        that runs short waits for its peers. So iterations that compute as the window did run over
        the schedule's simulation, in their median too; replaying the schedule with the window's own
        iterations counts the moves the window had. The first schedule, simulated from the capture's
        spans, has no window: its simulated finish. None while the window has a gap (`judge`).
        """
        if None in self.window:
            return None
        if not self.window:
            return {rank: self.result.finish_ns(rank) for rank in self.real_ranks}
        replays = [self.replayed_ns(compute, costs) for compute, costs in self.window]
        return {rank: int(statistics.median_high(r[rank] for r in replays)) for rank in replays[0]}

    def fold(
        self,
        streams: Mapping[str, Sequence[Op]],
        keep: Collection[int] = (),
        others: Mapping[str, Sequence[int]] | None = None,
        costs: Mapping[int, Mapping[str, int]] | None = None,
    ) -> str | None:
        """Fold one measured iteration (`graph.capture.iteration_streams`) and re-simulate:
        `measure` then `resimulate`.

        Returns None when folded, else why not (the iteration issued other ops than the graph).
        """
        reason = self.measure(streams, keep)
        self.window.append(None)  # one rank's measurement: no replay of every real rank's (`judge`)
        if reason is None:
            self.resimulate(others, costs)
        return reason

    def measure(self, streams: Mapping[str, Sequence[Op]], keep: Collection[int] = ()) -> str | None:
        """Take one measured iteration into this role's durations (`current`, the spans of the
        window's median iteration, `median_iteration`), without re-simulating.

        Args:
            keep: positions (among the compute ops) whose measurement cannot be trusted; they keep
                the value the current simulation uses.

        Returns None when taken, else why not (the iteration issued other ops than the graph).
        """
        difference = first_difference(self.graph_streams, streams)
        if difference is not None:
            return f"the iteration's ops differ from the graph's at {difference}"
        measured = compute_durations(streams)
        for position in keep:
            measured[position] = self.current[position]
        self.measured.append(measured)
        self.current = list(median_iteration(self.measured))
        return None

    def resimulate(
        self,
        others: Mapping[str, Sequence[int]] | None = None,
        costs: Mapping[int, Mapping[str, int]] | None = None,
    ) -> None:
        """Simulate the job again with this role's `current` durations and what the other real
        ranks measured.

        Args:
            others: other roles' current durations, as the other real ranks measured them (each folds
                into its class too).
            costs: what each real rank measured of the ops among real ranks (virtual rank ->
                `RealCosts.current()`, this rank's included); an instance every real member of which
                has measured costs the least of their values, in place of the network model's.
        """
        durations = {role: list(values) for role, values in (others or {}).items() if role != self.role}
        durations[self.role] = self.current
        problem = self.base.with_compute_durations(spread(self.programs, durations))
        if costs:
            problem = problem.with_comm_costs(self.real_op_costs(costs))
        self.result = run_problem(problem)
        self.num_folded += 1

    def real_op_costs(self, costs: Mapping[int, Mapping[str, int]]) -> dict[str, dict[int, int]]:
        """Role -> {op position: cost} for the ops among real ranks whose every real member has
        published a measurement (see `real_costs.shared_costs`)."""
        holders: dict[str, list[int]] = {}
        for rank, (_, keys) in self.real_ops.items():
            for key in keys:
                holders.setdefault(key, []).append(rank)
        shared = shared_costs(costs, holders)
        model_ns = self.base.arrays["op_cost_ns"]
        out: dict[str, dict[int, int]] = {}
        for role, keys in self.real_ops.values():
            base = self.base.role_base(self.base.role_names.index(role))
            for key, positions in keys.items():
                if key not in shared:
                    continue
                for position in positions:  # an op with virtual members still crosses the network
                    floor_ns = int(model_ns[base + position]) if is_mixed(key) else 0
                    out.setdefault(role, {})[position] = max(shared[key], floor_ns)
        return out


def median_iteration(window: Sequence[Sequence[int]]) -> Sequence[int]:
    """The spans of the window's median iteration: the one whose total compute is the median (the
    larger of the two middle ones in an even window).

    One iteration's spans, not each span's median: compute on a host varies from span to span, and
    where two real ranks meet the later arrival sets the time, so spans that are each their median
    describe a quieter iteration than any the ranks ran and every emulated iteration runs over its
    schedule. The demo's two real ranks (one pipeline, polling their real peers), three runs each:
    median per-iteration difference against the schedule's simulation +1.45 to +2.46 % with
    per-span medians, +0.18 to +1.15 % with this.
    """
    ranked = sorted(range(len(window)), key=lambda i: (sum(window[i]), i))
    return window[ranked[len(ranked) // 2]]


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
        if event not in posted or not event.has_virtual or event.wait_ns >= 0:
            continue  # a recorded wait ends its span where the program began to wait
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
