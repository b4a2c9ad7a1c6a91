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
(the last run is kept and says it did not converge); after `FREE_ROUNDS` costs may only grow, so a
schedule that flips between two states settles. Everything is integer or sorted arithmetic
over the timeline, so the result is as deterministic as one run.
"""

from __future__ import annotations

from collections.abc import Callable

import numpy as np

from prism_megatron.graph.schema import NodeType
from prism_megatron.graph.world import peer_of
from prism_megatron.replay.schedule import OpKind

MAX_ROUNDS = 12
"""Re-simulations before the fixed point is given up (the last is kept, marked unconverged)."""
FREE_ROUNDS = 3
"""Runs whose costs follow their schedule both ways; after them an op's cost may only grow, so a
schedule that flips between overlapping and not (costlier ops move apart, cheaper ones together)
settles on the overlapping side instead of cycling."""

ConcurrencyFactor = Callable[[OpKind, tuple[int, ...], int, float], float]
"""(op kind, members in group order, size in bytes, concurrent groups) -> factor on the op's cost
alone; members as `CostFn` takes them (SEND/RECV: source, destination). A cost model whose factor
depends on the kind, the group size and the groups alone says so (`factor_by_group_size = True` on
the object the method belongs to), and is asked once per distinct triple."""


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


def flat_ops(result) -> tuple[np.ndarray, np.ndarray]:
    """For every timeline slot: its node and its op's index in the problem's flat op arrays."""
    problem = result.problem
    bases = np.asarray(result.node_op_base, dtype=np.int64)
    lengths = np.diff(bases)
    node = np.repeat(np.arange(problem.num_nodes, dtype=np.int64), lengths)
    role_base = problem.arrays["stream_begin"][:: problem.num_streams][: len(problem.role_names)]
    roles = problem.arrays["node_role"].astype(np.int64)
    flat = role_base[roles[node]] + np.arange(len(node), dtype=np.int64) - bases[node]
    return node, flat


def ranks_in_flight(result, weights: np.ndarray, node: np.ndarray, comm: np.ndarray):
    """A function from times to the ranks communicating at each: per node, the union of its
    communication ops' [ready, end) intervals, weighted by the ranks the node stands for."""
    ready, end = result.ready_ns, result.end_ns
    keep = comm & (end > ready) & (ready >= 0)
    span = int(max(end[keep].max(initial=0), 0)) + 1
    shifted_begin, shifted_end = merged_runs(ready[keep], end[keep], node[keep], span)
    run_owner = shifted_begin // span
    run_begin, run_end = shifted_begin - run_owner * span, shifted_end - run_owner * span
    weight = weights[run_owner]
    by_begin, by_end = np.argsort(run_begin, kind="stable"), np.argsort(run_end, kind="stable")
    begin_at, end_at = run_begin[by_begin], run_end[by_end]
    opened = np.concatenate([[0], np.cumsum(weight[by_begin])])
    closed = np.concatenate([[0], np.cumsum(weight[by_end])])

    def at(times_ns: np.ndarray) -> np.ndarray:
        return (
            opened[np.searchsorted(begin_at, times_ns, side="right")]
            - closed[np.searchsorted(end_at, times_ns, side="right")]
        )

    return at


def merged_runs(begin_ns: np.ndarray, end_ns: np.ndarray, owner: np.ndarray, span_ns: int):
    """The union of each node's intervals [begin_ns, end_ns) (`owner`: each interval's node), in one
    pass: every node's times are shifted by node x `span_ns` (which exceeds every time), so a running
    maximum of the ends never crosses from one node to the next and an interval past it starts a new
    run. Returns the runs' (begin, end) on that shifted axis, sorted (node = begin // span_ns)."""
    shifted_begin, shifted_end = begin_ns + owner * span_ns, end_ns + owner * span_ns
    order = np.argsort(shifted_begin, kind="stable")
    shifted_begin, shifted_end = shifted_begin[order], shifted_end[order]
    reach = np.maximum.accumulate(shifted_end) if len(shifted_end) else shifted_end
    fresh = np.ones(len(shifted_begin), dtype=bool)
    fresh[1:] = shifted_begin[1:] > reach[:-1]
    first = np.flatnonzero(fresh)
    run_end = np.maximum.reduceat(shifted_end, first) if len(first) else shifted_begin[first]
    return shifted_begin[first], run_end


def concurrent_costs(result, base_cost_ns: np.ndarray, factor: ConcurrencyFactor) -> np.ndarray:
    """Each op's cost under the concurrency its simulated ready time saw (per role op: the largest
    over the role's nodes, as the core takes the largest cost among an op's members)."""
    problem = result.problem
    kinds, sizes = op_kinds_and_sizes(problem)
    node, flat = flat_ops(result)
    comm = kinds[flat] >= 0
    in_flight = ranks_in_flight(result, node_weights(problem), node, comm)
    slots = np.flatnonzero(comm & (result.ready_ns >= 0))
    groups = np.maximum(in_flight(result.ready_ns[slots]) / sizes[flat[slots]], 1.0)
    highest = np.zeros(len(base_cost_ns), dtype=np.float64)
    np.maximum.at(highest, flat[slots], 1.0)
    crowded = groups > 1.0
    if getattr(getattr(factor, "__self__", None), "factor_by_group_size", False):
        _by_group_size(highest, kinds, sizes, flat[slots[crowded]], groups[crowded], factor)
        crowded[:] = False
    cache: dict[tuple, float] = {}
    for slot, group_count in zip(slots[crowded].tolist(), groups[crowded].tolist(), strict=True):
        op, rank = int(flat[slot]), int(problem.node_rank[node[slot]])
        role = int(problem.arrays["node_role"][node[slot]])
        graph_op = problem.role_ops[role][op - problem.role_base(role)][2]
        if not problem.world.group(graph_op.group, rank):
            continue  # the core reports the op as having no group or peer
        members = _members(problem, rank, graph_op)
        key = (int(kinds[op]), members, graph_op.size_bytes, group_count)
        if key not in cache:
            cache[key] = float(factor(OpKind(key[0]), members, key[2], group_count))
        highest[op] = max(highest[op], cache[key])
    costs = base_cost_ns.copy()
    scaled = highest > 0
    costs[scaled] = np.round(base_cost_ns[scaled] * highest[scaled]).astype(np.int64)
    return costs


def _by_group_size(highest, kinds, sizes, ops: np.ndarray, groups: np.ndarray, factor) -> None:
    """The factors of a cost model that depends on the kind, group size and groups alone (the
    measured tables): one call per distinct triple, whatever the number of ranks."""
    if not len(ops):
        return
    keys = np.stack([kinds[ops].astype(np.float64), sizes[ops].astype(np.float64), groups], axis=1)
    unique, inverse = np.unique(keys, axis=0, return_inverse=True)
    values = np.asarray(
        [float(factor(OpKind(int(k)), tuple(range(int(n))), 0, float(g))) for k, n, g in unique.tolist()]
    )
    np.maximum.at(highest, ops, values[np.ravel(inverse)])
