"""The cost of gloo communication on this machine's loopback, measured before the cases.

The simulator needs, for every communication op of a virtual peer, its cost once every member has
arrived. Here that is measured, not assumed: real gloo processes on loopback issue each op kind the
cases use, for each group size and message size the cases use, with members arriving in a random
order; an op's cost is the time from the last member's issue to each member's completion (one
clock: every process reads this machine's CLOCK_MONOTONIC), median over members and repetitions.
Costs between measured sizes are interpolated linearly (segment by segment: gloo switches
algorithms with size, so one latency + bandwidth line fits it badly, e.g. a 4-byte all-reduce of four
processes costs a fifth of a 512-byte one), over medians made non-decreasing in size; beyond the
largest size the last segment continues. Sizes go up to the largest message a case sends. Ops are issued
through the same Python calls megatron-core uses (`all_reduce`; a pipeline exchange's
`batch_isend_irecv` of a send and a receive, then `wait`),
so the calls' own overhead is part of the cost, as it is part of the real run's time.

Two conditions are measured. *Alone*: one group communicates while the other processes wait, the
cost a network model measured on an idle pair would give. *Under the job's load*: as many processes
as the largest case has ranks, split into groups of the measured size, every group communicating at
once, as every TP pair or pipeline pair of a job does at about the same time; on this machine every
op of every process needs the same two cores, so an op costs more when the whole job communicates,
just as a cluster's links cost more when every rank uses them. The suite's model is the second (the
ground truth is the whole job on these cores); the first is reported beside it.

Nothing here looks at the cases' iteration times: the cost model is fixed before any case runs.
"""

from __future__ import annotations

import dataclasses
import itertools
import random
import statistics
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from prism_megatron.replay import OpKind

P2P_KEY_INT = (int(OpKind.SEND), 2)
SIZES_BYTES = (4, 512, 4096, 32768)
LARGE_SIZES_BYTES = (262144, 2097152, 8388608)
"""Measured for pairs only (p2p and two-member all-reduce): the cases move activations and
gradients of megabytes only between two ranks (the GPT's TP and DP, the pipeline); their groups
of four and eight reduce a few kilobytes."""
MAX_JITTER_S = 0.001


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    group_sizes: tuple[int, ...]
    sizes_bytes: tuple[int, ...] = SIZES_BYTES
    large_sizes_bytes: tuple[int, ...] = LARGE_SIZES_BYTES
    repetitions: int = 20
    warmup: int = 3
    """Leading repetitions of each (group, size) left out (first-use costs of a fresh group)."""
    under_load: bool = False
    """Every process in a group of each size, all groups measuring at once (see the module doc)."""


def _timed_collective(group, members: Sequence[int], size_bytes: int, rng: random.Random) -> float:
    """ns from the last member's issue to this member's completion of one all-reduce."""
    tensor = torch.zeros(max(size_bytes // 4, 1))
    dist.barrier(group=group)
    time.sleep(rng.random() * MAX_JITTER_S)
    issue_ns = time.monotonic_ns()
    dist.all_reduce(tensor, group=group)
    done_ns = time.monotonic_ns()
    issues = torch.zeros(len(members), dtype=torch.int64)
    dist.all_gather_into_tensor(issues, torch.tensor([issue_ns]), group=group)
    return float(done_ns - int(issues.max()))


def _timed_exchange(group, peer: int, size_bytes: int, rng: random.Random) -> float:
    """ns from the later of the two posts to this side's completion of one pipeline exchange.

    An exchange is what megatron-core's batched p2p does in the steady state of a schedule: each
    side posts a send to and a receive from the other in one `batch_isend_irecv`, then waits on both.
    """
    send, recv = torch.zeros(max(size_bytes // 4, 1)), torch.empty(max(size_bytes // 4, 1))
    dist.barrier(group=group)
    time.sleep(rng.random() * MAX_JITTER_S)
    issue_ns = time.monotonic_ns()
    ops = [dist.P2POp(dist.isend, send, peer, group), dist.P2POp(dist.irecv, recv, peer, group)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    done_ns = time.monotonic_ns()
    issues = torch.zeros(2, dtype=torch.int64)
    dist.all_gather_into_tensor(issues, torch.tensor([issue_ns]), group=group)
    return float(done_ns - int(issues.max()))


def _groups_of(n: int, world_size: int, under_load: bool) -> tuple[list[list[int]], int]:
    """The groups measured for size n (all consecutive blocks under load, else the first only);
    every process must create every group. Returns (groups, how many of them measure)."""
    blocks = [list(range(first, first + n)) for first in range(0, world_size - n + 1, n)]
    return blocks, len(blocks) if under_load else 1


def measure(plan: Plan) -> dict[str, list[float]]:
    """In each gloo process: per (kind, n, size), this member's costs (ns).

    Repetitions go round every (kind, group, size) in turn, so a burst of load from elsewhere on
    the machine spreads over all of them instead of owning one.
    """
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    rng = random.Random(rank)
    samples: dict[str, list[float]] = {}
    try:
        mine: dict[int, tuple] = {}  # n -> (group, members) of this process, if it measures at n
        for n in sorted(set(plan.group_sizes) | {2}):
            blocks, measuring = _groups_of(n, world_size, plan.under_load)
            for index, members in enumerate(blocks):
                group = dist.new_group(members)
                if index < measuring and rank in members:
                    mine[n] = (group, members)
        for repetition in range(plan.warmup + plan.repetitions):
            keep = repetition >= plan.warmup
            for n in plan.group_sizes:
                if n not in mine:
                    continue
                group, members = mine[n]
                for size in plan.sizes_bytes + (plan.large_sizes_bytes if n == 2 else ()):
                    cost = _timed_collective(group, members, size, rng)
                    if keep:
                        samples.setdefault(f"{int(OpKind.ALL_REDUCE)}/{n}/{size}", []).append(cost)
            if 2 not in mine:
                continue
            group, members = mine[2]
            peer = members[1] if rank == members[0] else members[0]
            for size in plan.sizes_bytes + plan.large_sizes_bytes:
                cost = _timed_exchange(group, peer, size, rng)
                if keep:
                    samples.setdefault(f"{P2P_KEY_INT[0]}/2/{size}", []).append(cost)
    finally:
        dist.destroy_process_group()
    return samples


def monotone(points: Sequence[tuple[int, float]]) -> tuple[tuple[int, float], ...]:
    """Each cost raised to the highest at any smaller size: moving more bytes never costs less, so a
    median below a smaller size's is noise (and would make extrapolation fall with size)."""
    out, highest = [], 0.0
    for size, cost in sorted(points):
        highest = max(highest, cost)
        out.append((size, highest))
    return tuple(out)


def interpolate(points: Sequence[tuple[int, float]], size_bytes: int) -> float:
    """Piecewise-linear through (size, ns) points sorted by size and non-decreasing; flat below the
    first, the last segment's slope beyond the last."""
    if size_bytes <= points[0][0] or len(points) == 1:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if size_bytes <= x1 or (x1, y1) == points[-1]:
            return y0 + (y1 - y0) * (size_bytes - x0) / (x1 - x0)
    raise AssertionError("unreachable")


@dataclasses.dataclass(frozen=True)
class LoopbackCost:
    """A simulator cost function (`prism_megatron.sim.CostFn`) from the measured gloo costs.

    Collectives of a kind not measured cost what an all-reduce of the same group size and bytes
    does; group sizes not measured take the nearest measured size.
    """

    points: dict[tuple[int, int], tuple[tuple[int, float], ...]]
    """(op kind, group size) -> (size_bytes, median cost ns), sorted by size, made non-decreasing."""

    def __call__(self, kind: OpKind, members: tuple[int, ...], size_bytes: int) -> float:
        n = len(members)
        if kind in (OpKind.SEND, OpKind.RECV):
            return interpolate(self.points[P2P_KEY_INT], size_bytes)
        if n <= 1:
            return 0.0
        measured = [m for k, m in self.points if k == int(OpKind.ALL_REDUCE)]
        nearest = min(measured, key=lambda m: (abs(m - n), -m))
        return interpolate(self.points[(int(OpKind.ALL_REDUCE), nearest)], size_bytes)

    def as_dict(self) -> dict:
        """Median cost in us per op kind, group size and message size."""
        return {
            f"{OpKind(k).name}/n={n}": {str(size): round(ns / 1e3, 1) for size, ns in points}
            for (k, n), points in sorted(self.points.items())
        }


def fit(per_process: Sequence[dict[str, list[float]]]) -> LoopbackCost:
    """Median over members and repetitions per (kind, n, size)."""
    merged: dict[str, list[float]] = {}
    for samples in per_process:
        for key, values in samples.items():
            merged.setdefault(key, []).extend(values)
    points: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for key, values in merged.items():
        kind, n, size = (int(part) for part in key.split("/"))
        points.setdefault((kind, n), []).append((size, statistics.median(values)))
    return LoopbackCost({key: monotone(p) for key, p in points.items()})


def calibrate(
    group_sizes: Sequence[int], repetitions: int = 20, world_size: int | None = None
) -> LoopbackCost:
    """Measure in forked gloo processes and fit.

    Args:
        world_size: None measures each group alone (max(group_sizes) processes); a number measures
            under the load of a job of that many ranks (every group of each size at once).
    """
    from benchmarks.fidelity.processes import run_processes

    plan = Plan(
        group_sizes=tuple(sorted(set(group_sizes))),
        repetitions=repetitions,
        under_load=world_size is not None,
    )
    num_processes = world_size if world_size is not None else max(max(plan.group_sizes), 2)
    if num_processes < max(plan.group_sizes):
        raise ValueError(f"world_size {world_size} is smaller than the largest group {max(plan.group_sizes)}")
    return fit(run_processes(measure, [plan] * num_processes))
