"""Costs that follow the schedule: how many groups communicate at once when an op transfers.

A communication op costs more while other transfers share its links (or, on CPU, its cores): the
16 processes of a job on two cores all waking for their exchanges at once pay for each other's
turns, and a straggler's job, out of step, pays less. The simulator knows at each op's start
which other transfers run, so the cost model's concurrency term is driven by the simulated
schedule itself:

* ranks in flight: a rank is communicating from an op's ready time (every member there) to its end;
  a rank with several ops in flight counts once (one process, one set of links). In symmetric
  mode a role's node stands for every rank of the role, which the schedule keeps in step.
* concurrent groups of an op: the ranks in flight when it becomes ready (its own members among
  them) over its group size (2 for a p2p transfer): 1 when it runs alone.
* its cost: the cost alone (the problem's base cost) times the cost model's
  `concurrency_factor(kind, members, size_bytes, groups)` (exactly 1 at one group, never asked).

Changing costs moves the schedule, which changes who overlaps whom, so the run repeats with the
costs its own timeline gives until the costs stop changing (a fixed point) or `MAX_ROUNDS` pass
(the last run is kept and says it did not converge). Everything is integer or sorted arithmetic
over the timeline, so the result is as deterministic as one run.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from prism_megatron.graph.schema import COMMUNICATION, NodeType
from prism_megatron.graph.world import peer_of
from prism_megatron.replay.schedule import OpKind

MAX_ROUNDS = 12
"""Re-simulations before the fixed point is given up (the last is kept, marked unconverged)."""

ConcurrencyFactor = Callable[[OpKind, tuple[int, ...], int, float], float]
"""(op kind, members in group order, size in bytes, concurrent groups) -> factor on the op's cost
alone; members as `CostFn` takes them (SEND/RECV: source, destination)."""


def op_kinds_and_sizes(problem) -> tuple[np.ndarray, np.ndarray]:
    """Per op of the problem (flat, role by role): its cost-model kind (-1 for no communication) and
    its group size in ranks."""
    kinds, sizes = [], []
    for role_ops in problem.role_ops:
        for _, _, op in role_ops:
            if op.type == NodeType.COLLECTIVE:
                kinds.append(int(op.comm))
                sizes.append(problem.world.group_size(op.group))
            elif op.type in (NodeType.SEND, NodeType.RECV):
                kinds.append(int(OpKind.SEND if op.type == NodeType.SEND else OpKind.RECV))
                sizes.append(2)
            else:
                kinds.append(-1)
                sizes.append(1)
    return np.asarray(kinds, dtype=np.int64), np.asarray(sizes, dtype=np.int64)


def _members(problem, virtual_rank: int, op) -> tuple[int, ...]:
    """The op's members for the cost model, from `virtual_rank`'s view."""
    if op.type == NodeType.COLLECTIVE:
        return problem.world.group(op.group, virtual_rank)
    peer = peer_of(problem.world, op.group, virtual_rank, op.offset)
    return (virtual_rank, peer) if op.type == NodeType.SEND else (peer, virtual_rank)


def node_weights(problem) -> np.ndarray:
    """Ranks each node stands for: the role's rank count in symmetric mode, else 1."""
    if not problem.symmetric:
        return np.ones(problem.num_nodes, dtype=np.int64)
    return np.bincount(problem.world.role_ids(), minlength=len(problem.role_names)).astype(np.int64)


def ranks_in_flight(result, weights: np.ndarray) -> Callable[[np.ndarray], np.ndarray]:
    """A function from times to the ranks communicating at each (intervals [ready, end))."""
    problem = result.problem
    comm_types = np.asarray([int(t) for t in COMMUNICATION], dtype=np.int8)
    starts, ends, marks = [], [], []
    for node in range(problem.num_nodes):
        window = result.node_slice(node)
        base = problem.role_base(int(problem.arrays["node_role"][node]))
        types = problem.arrays["op_type"][base : base + (window.stop - window.start)]
        ready, end = result.ready_ns[window], result.end_ns[window]
        keep = np.isin(types, comm_types) & (end > ready) & (ready >= 0)
        for begin_ns, end_ns in _union(ready[keep], end[keep]):
            starts.append(begin_ns)
            ends.append(end_ns)
            marks.append(weights[node])
    order_start, order_end = np.argsort(starts, kind="stable"), np.argsort(ends, kind="stable")
    start_at = np.asarray(starts, dtype=np.int64)[order_start]
    end_at = np.asarray(ends, dtype=np.int64)[order_end]
    weight = np.asarray(marks, dtype=np.int64)
    started = np.concatenate([[0], np.cumsum(weight[order_start])])
    ended = np.concatenate([[0], np.cumsum(weight[order_end])])

    def at(times_ns: np.ndarray) -> np.ndarray:
        opened = started[np.searchsorted(start_at, times_ns, side="right")]
        closed = ended[np.searchsorted(end_at, times_ns, side="right")]
        return opened - closed

    return at


def _union(begins: np.ndarray, ends: np.ndarray) -> list[tuple[int, int]]:
    """The union of intervals [begin, end) as disjoint intervals in time order."""
    merged: list[tuple[int, int]] = []
    for begin_ns, end_ns in sorted(zip(begins.tolist(), ends.tolist(), strict=True)):
        if merged and begin_ns <= merged[-1][1]:
            merged[-1] = (merged[-1][0], max(merged[-1][1], end_ns))
        else:
            merged.append((begin_ns, end_ns))
    return merged


def concurrent_costs(result, base_cost_ns: np.ndarray, factor: ConcurrencyFactor) -> np.ndarray:
    """Each op's cost under the concurrency its simulated ready time saw (per role op: the largest
    over the role's nodes, as the core takes the largest cost among an op's members)."""
    problem = result.problem
    kinds, sizes = op_kinds_and_sizes(problem)
    in_flight = ranks_in_flight(result, node_weights(problem))
    costs = base_cost_ns.copy()
    highest = np.zeros(len(base_cost_ns), dtype=np.float64)
    cache: dict[tuple, float] = {}
    for node in range(problem.num_nodes):
        window = result.node_slice(node)
        role = int(problem.arrays["node_role"][node])
        base = problem.role_base(role)
        flat = np.arange(base, base + (window.stop - window.start))
        comm = kinds[flat] >= 0
        if not comm.any():
            continue
        ready = result.ready_ns[window][comm]
        groups = np.maximum(in_flight(ready) / sizes[flat][comm], 1.0)
        rank = int(problem.node_rank[node])
        for op, group_count in zip(flat[comm].tolist(), groups.tolist(), strict=True):
            if group_count <= 1.0:
                highest[op] = max(highest[op], 1.0)
                continue
            graph_op = problem.role_ops[role][op - base][2]
            if not problem.world.group(graph_op.group, rank):
                continue  # the core reports the op as having no group or peer
            members = _members(problem, rank, graph_op)
            key = (int(kinds[op]), members, graph_op.size_bytes, group_count)
            if key not in cache:
                cache[key] = float(factor(OpKind(key[0]), members, key[2], group_count))
            highest[op] = max(highest[op], cache[key])
    scaled = highest > 0
    costs[scaled] = np.round(base_cost_ns[scaled] * highest[scaled]).astype(np.int64)
    return costs
