"""Run the simulator: the typed face of the C++ core (`prism_megatron._C.sim`).

`simulate(graph, world, cost_fn)` predicts one iteration of the whole job and returns every
simulated node's timeline. With no asymmetry it simulates one node per role (symmetric mode), which
costs the same at any world size; what-ifs that make ranks of one role differ (a straggler, a slow
NIC) make it simulate every rank.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable

import numpy as np

from prism_megatron.graph.schema import ExecutionGraph, Op
from prism_megatron.graph.world import World
from prism_megatron.sim import concurrency, contention, faults, reference
from prism_megatron.sim.cost import CostFn
from prism_megatron.sim.problem import Problem, build_problem
from prism_megatron.sim.whatif import WhatIf


@dataclasses.dataclass(frozen=True, slots=True)
class OpTiming:
    """When one op of one rank ran: posted at `start_ns`, every participant there at `ready_ns`
    (equal to start for compute and waits), done at `end_ns`. Times from the iteration start."""

    stream: str
    index: int
    op: Op
    start_ns: int
    ready_ns: int
    end_ns: int


@dataclasses.dataclass(frozen=True, eq=False)
class SimResult:
    """Timelines of every simulated node (a role's node stands for all its ranks in symmetric mode)."""

    problem: Problem
    iteration_time_ns: int
    """When the last op of any rank completes."""
    node_op_base: np.ndarray
    start_ns: np.ndarray
    ready_ns: np.ndarray
    end_ns: np.ndarray
    num_events: int
    num_rounds: int = 1
    """Simulations run to reach the fixed point of the concurrency and contention terms (1 without)."""
    converged: bool = True
    """False when those terms' costs still moved after `concurrency.MAX_ROUNDS` runs."""

    def node_slice(self, node: int) -> slice:
        return slice(int(self.node_op_base[node]), int(self.node_op_base[node + 1]))

    def times(self, virtual_rank: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """(start, ready, end) of the rank's ops, in its role's flat op order (`Problem.role_ops`)."""
        window = self.node_slice(self.problem.node_of(virtual_rank))
        return self.start_ns[window], self.ready_ns[window], self.end_ns[window]

    def timeline(self, virtual_rank: int) -> list[OpTiming]:
        """Every op of the rank with its times."""
        start, ready, end = self.times(virtual_rank)
        role = int(self.problem.arrays["node_role"][self.problem.node_of(virtual_rank)])
        return [
            OpTiming(stream, index, op, int(start[i]), int(ready[i]), int(end[i]))
            for i, (stream, index, op) in enumerate(self.problem.role_ops[role])
        ]

    def finish_ns(self, virtual_rank: int) -> int:
        """When the rank's last op completes."""
        return int(self.times(virtual_rank)[2].max(initial=0))


Core = Callable[[dict, int, int, int], dict]


def native_core() -> Core:
    import torch  # noqa: F401  (the extension links libc10)

    from prism_megatron import _C

    return _C.sim.run


def simulate(
    graph: ExecutionGraph,
    world: World,
    cost_fn: CostFn,
    what_if: WhatIf | None = None,
    *,
    symmetric: bool | None = None,
    core: Core | None = None,
    compute_slowdown: float | None = None,
) -> SimResult:
    """Simulate one iteration of `graph` over `world`.

    Args:
        cost_fn: communication cost per op (see `prism_megatron.sim.cost`).
        what_if: stragglers, slow NICs, expert imbalance (see `prism_megatron.sim.whatif`).
        symmetric: force one node per role (True) or per rank (False); default: per role unless
            `what_if` makes ranks of one role differ.
        core: the event loop; default the C++ core, `reference.run` for the Python reference.
        compute_slowdown: compute slowed by overlapping communication (`sim.contention`); default:
            the GPU model's figure where the graph was captured on a modelled GPU, else none.

    Raises:
        DeadlockError: some ops wait for peers that never come (the message names them).
        SimulationFault: matched ops disagree, or an op's rank lacks its group or peer.
        ValueError: the graph does not fit the world (missing roles, bad numbering).
    """
    problem = build_problem(
        graph, world, cost_fn, what_if, symmetric=symmetric, compute_slowdown=compute_slowdown
    )
    return run_problem(problem, core)


def run_problem(problem: Problem, core: Core | None = None) -> SimResult:
    """Run the core once, or, when the cost model has a concurrency term or the problem a contention
    term, until the costs and durations the simulated schedule gives are those it was simulated with
    (`sim.concurrency`, `sim.contention`)."""
    core = core or native_core()
    result = _run_once(problem, core)
    if problem.concurrency is None and not problem.compute_slowdown:
        return result
    base_cost_ns = problem.arrays["op_cost_ns"]
    base_duration_ns = problem.arrays["op_duration_ns"]
    runs = 1
    while True:
        costs, durations = _schedule_costs(result, base_cost_ns, base_duration_ns)
        ran = result.problem.arrays
        if runs > concurrency.FREE_ROUNDS:  # from here costs only grow: a flip-flop settles
            costs = np.maximum(costs, ran["op_cost_ns"])
            durations = np.maximum(durations, ran["op_duration_ns"])
        if np.array_equal(costs, ran["op_cost_ns"]) and np.array_equal(durations, ran["op_duration_ns"]):
            return dataclasses.replace(result, num_rounds=runs)
        if runs == concurrency.MAX_ROUNDS:
            return dataclasses.replace(result, num_rounds=runs, converged=False)
        arrays = {**problem.arrays, "op_cost_ns": costs, "op_duration_ns": durations}
        result = _run_once(dataclasses.replace(problem, arrays=arrays), core)
        runs += 1


def _schedule_costs(result: SimResult, base_cost_ns: np.ndarray, base_duration_ns: np.ndarray):
    """(communication costs, compute durations) under the schedule `result` simulated: each term
    from the ops' costs alone, the base of every round."""
    problem = result.problem
    costs = base_cost_ns
    if problem.concurrency is not None:
        costs = concurrency.concurrent_costs(result, base_cost_ns, problem.concurrency)
    durations = contention.contended_durations(result, base_duration_ns, problem.compute_slowdown)
    return costs, durations


def _run_once(problem: Problem, core: Core) -> SimResult:
    out = core(problem.arrays, problem.num_nodes, len(problem.role_names), problem.num_streams)
    if out["fault"][0]:
        raise faults.fault_error(problem, out["fault"])
    timeline = np.asarray(out["timeline"])
    start, ready, end = timeline[:, 0], timeline[:, 1], timeline[:, 2]
    if out["stuck"]:
        raise faults.deadlock_error(problem, start, out["node_op_base"], out["stuck"])
    return SimResult(
        problem=problem,
        iteration_time_ns=int(out["makespan_ns"]),
        node_op_base=np.asarray(out["node_op_base"]),
        start_ns=start,
        ready_ns=ready,
        end_ns=end,
        num_events=int(out["num_events"]),
    )


reference_core: Core = reference.run
