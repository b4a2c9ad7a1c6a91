"""The cost of gloo communication on this machine's loopback, measured before any case runs.

The simulator needs, for every communication op of a virtual peer, its cost once every member has
arrived. Here that is measured, never fitted to a case: real gloo processes on loopback issue each
op kind the cases use (`all_reduce`; a pipeline exchange's `batch_isend_irecv` of a send and a
receive, then `wait`, the calls megatron-core makes, so their own overhead is part of the cost),
for each group size and message size the cases use. Each process takes the share of the machine a
rank takes (`prism_megatron.megatron.run.cpu_share`), and one clock serves all (CLOCK_MONOTONIC).
The result is a file of measured costs (`prism_megatron.network.measured`) that the product's passes
read through --prism-cluster; it interpolates between the measured sizes.

Two patterns, each repeated (`repeats` independent calibrations, fresh processes each; the cost model
takes each point's median over them, and their spread is reported):

* ``alone``: one group communicates while the other processes wait; members arrive in a random
  order within 1 ms; cost = from the last member's issue to each member's completion. The cost a
  network model measured on an idle pair would give.
* ``job``: the job's own concurrency. As many processes as the job has ranks, split into groups of
  the measured size, and every group communicates at once, as every pipeline pair, TP pair or
  data-parallel group of a job in lockstep does. Each repetition starts from a common deadline that
  every process reaches the way a rank reaches its next op: out of its compute (``lead_in``: a
  sleep for the sleep-compute cases, through the same call their compute makes, so the wake-ups are
  the ones the job has; busy arithmetic for the real-compute cases, whose ranks come to an exchange
  hot). Cost = from the deadline to each member's completion: on two shared cores it includes the
  wait for a core behind every other process that woke at the same moment, which is what the stop-11
  diagnosis found the ground truth's exchanges paying (1-5 ms against 0.5 ms simulated).

Besides all-reduces and one-peer exchanges, the interleaved pipeline's batches with two peers: rings
of `ring_size` processes where every member posts, in one `batch_isend_irecv`, a send to the next and
a receive from the previous (2 ops; megatron-core's send_forward_recv_forward), or both directions
at once (4 ops); the file's `batches_us` (`prism_megatron.network.measured`).

Costs are medians over members and repetitions, made non-decreasing in size; nothing here looks at
a case's iteration times.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from prism_megatron.network.measured import MeasuredCost, monotone
from prism_megatron.replay import OpKind

SIZES_BYTES = (4, 512, 4096, 32768)
LARGE_SIZES_BYTES = (262144, 2097152, 8388608)
"""Measured for pairs only (p2p and two-member all-reduce): the cases move activations and
gradients of megabytes only between two ranks (the GPT's TP and DP, the pipeline); their groups
of four and eight reduce a few kilobytes."""
MAX_JITTER_S = 0.001
PATTERNS = ("alone", "job")
LEAD_INS = ("sleep", "busy")
LEAD_IN_S = 0.02
"""From agreeing on a deadline to it, in the job pattern: long enough that the agreeing all-reduce
of the whole job (milliseconds for 16 processes here) is over before it. A member that arrives late
anyway has no sample of that op (the deadline was not its start)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    group_sizes: tuple[int, ...]
    sizes_bytes: tuple[int, ...] = SIZES_BYTES
    large_sizes_bytes: tuple[int, ...] = LARGE_SIZES_BYTES
    repetitions: int = 20
    warmup: int = 3
    """Leading repetitions of each (group, size) left out (first-use costs of a fresh group)."""
    pattern: str = "alone"
    lead_in: str = "sleep"
    ring_size: int = 4
    """Members of each ring the two-peer batches are measured in (0: none measured)."""

    def __post_init__(self) -> None:
        if self.pattern not in PATTERNS or self.lead_in not in LEAD_INS:
            raise ValueError(f"pattern must be one of {PATTERNS} and lead_in one of {LEAD_INS}")
        if self.ring_size and self.ring_size < 3:
            raise ValueError(f"ring_size must be 0 (no batches) or >= 3 (two peers), got {self.ring_size}")


BUSY = torch.randn(64, 64, generator=torch.Generator().manual_seed(0))


def _busy(seconds: float) -> None:
    """Arithmetic on this process's core until `seconds` have passed (a rank computing). The
    operands stay the same normal values: a product fed back into itself sinks into denormals,
    whose arithmetic is a hundred times slower and overshoots the deadline by milliseconds."""
    end = time.monotonic() + seconds
    while time.monotonic() < end:
        torch.mm(BUSY, BUSY)


def _start(group, plan: Plan, rng: random.Random) -> int:
    """Bring the members to the op; returns the ns the cost counts from (see the module docstring):
    alone, each member's own issue (the latest is taken later); job, the common deadline."""
    if plan.pattern == "alone":
        dist.barrier(group=group)
        time.sleep(rng.random() * MAX_JITTER_S)
        return time.monotonic_ns()
    deadline = torch.tensor([time.monotonic_ns() + round(LEAD_IN_S * 1e9)], dtype=torch.int64)
    dist.all_reduce(deadline, op=dist.ReduceOp.MAX)  # the whole job: one deadline for every group
    remaining_s = (int(deadline) - time.monotonic_ns()) / 1e9
    if remaining_s <= 0:
        return -1
    if plan.lead_in == "busy":
        _busy(remaining_s)
    else:
        from prism_megatron.replay import timeline

        timeline.compute(remaining_s)
    return int(deadline)


def _cost(group, members: int, plan: Plan, start_ns: int, done_ns: int) -> float | None:
    """ns from the op's start (alone: the last member's issue) to this member's completion; None
    when this member reached the job pattern's deadline late."""
    if plan.pattern == "job":
        return float(done_ns - start_ns) if start_ns >= 0 else None
    issues = torch.zeros(members, dtype=torch.int64)
    dist.all_gather_into_tensor(issues, torch.tensor([start_ns]), group=group)
    return float(done_ns - int(issues.max()))


def _timed_collective(group, members: int, size_bytes: int, plan: Plan, rng: random.Random) -> float | None:
    tensor = torch.zeros(max(size_bytes // 4, 1))
    start_ns = _start(group, plan, rng)
    dist.all_reduce(tensor, group=group)
    return _cost(group, members, plan, start_ns, time.monotonic_ns())


def _timed_exchange(group, peer: int, size_bytes: int, plan: Plan, rng: random.Random) -> float | None:
    """One pipeline exchange as megatron-core's batched p2p does it: a send to and a receive from the
    other side in one `batch_isend_irecv`, then a wait on both."""
    send, recv = torch.zeros(max(size_bytes // 4, 1)), torch.empty(max(size_bytes // 4, 1))
    start_ns = _start(group, plan, rng)
    ops = [dist.P2POp(dist.isend, send, peer, group), dist.P2POp(dist.irecv, recv, peer, group)]
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return _cost(group, 2, plan, start_ns, time.monotonic_ns())


def _timed_batch(group, members: list[int], num_ops: int, size_bytes: int, plan: Plan, rng) -> float | None:
    """One batch with two peers, as megatron-core's interleaved schedule posts it: send to the
    next member of the ring and receive from the previous (2 ops), and the reverse too (4 ops)."""
    me = members.index(dist.get_rank())
    following, previous = members[(me + 1) % len(members)], members[(me - 1) % len(members)]
    count = max(size_bytes // 4, 1)
    ops = [dist.P2POp(dist.isend, torch.zeros(count), following, group),
           dist.P2POp(dist.irecv, torch.empty(count), previous, group)]  # fmt: skip
    if num_ops == 4:
        ops += [dist.P2POp(dist.isend, torch.zeros(count), previous, group),
                dist.P2POp(dist.irecv, torch.empty(count), following, group)]  # fmt: skip
    start_ns = _start(group, plan, rng)
    for request in dist.batch_isend_irecv(ops):
        request.wait()
    return _cost(group, len(members), plan, start_ns, time.monotonic_ns())


BATCH_OPS = (2, 4)
BATCH_KEY = "BATCH"
"""Sample key prefix of the two-peer batches ("BATCH/<ops>/<bytes>")."""


def _groups_of(n: int, world_size: int, pattern: str) -> tuple[list[list[int]], int]:
    """The groups of size n (all consecutive blocks; every process creates every group) and how many
    of them measure (job: all of them at once; alone: the first)."""
    blocks = [list(range(first, first + n)) for first in range(0, world_size - n + 1, n)]
    return blocks, len(blocks) if pattern == "job" else 1


def _sizes(plan: Plan, n: int) -> tuple[int, ...]:
    return plan.sizes_bytes + (plan.large_sizes_bytes if n == 2 else ())


def measure(plan: Plan) -> dict[str, list[float]]:
    """In each gloo process: per "KIND/n/size", this member's costs (ns).

    Repetitions go round every (kind, group, size) in turn, so a burst of load from elsewhere on
    the machine spreads over all of them instead of owning one. Under the job pattern every process
    takes part in every step (the deadline is the whole job's), measuring or not.
    """
    from prism_megatron.config import EmulationConfig
    from prism_megatron.megatron.run import cpu_share

    share = cpu_share.take(EmulationConfig())
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    rng = random.Random(rank)
    samples: dict[str, list[float]] = {}
    try:
        mine: dict[int, tuple] = {}  # n -> (group, members) of this process, if it measures at n
        for n in sorted(set(plan.group_sizes) | {2}):
            blocks, measuring = _groups_of(n, world_size, plan.pattern)
            for index, members in enumerate(blocks):
                group = dist.new_group(members)
                if index < measuring and rank in members:
                    mine[n] = (group, members)
        if plan.ring_size:
            blocks, measuring = _groups_of(plan.ring_size, world_size, plan.pattern)
            for index, members in enumerate(blocks):
                group = dist.new_group(members)
                if index < measuring and rank in members:
                    mine[BATCH_KEY] = (group, members)
        for repetition in range(plan.warmup + plan.repetitions):
            _one_round(plan, mine, rng, samples, keep=repetition >= plan.warmup)
    finally:
        dist.destroy_process_group()
        share.restore()
    return samples


def _one_round(plan: Plan, mine: dict, rng: random.Random, samples: dict, *, keep: bool) -> None:
    """One repetition of every (kind, group size, message size) this process measures."""
    job = plan.pattern == "job"
    for n in plan.group_sizes:
        if n not in mine and not job:
            continue
        for size in _sizes(plan, n):
            if n in mine:
                group, members = mine[n]
                cost = _timed_collective(group, len(members), size, plan, rng)
                if keep and cost is not None:
                    samples.setdefault(f"{OpKind.ALL_REDUCE.name}/{n}/{size}", []).append(cost)
            else:  # not in a group of this size (the job's size is not a multiple): keep the cadence
                _start(None, plan, rng)
    _batches(plan, mine, rng, samples, keep=keep)
    if 2 not in mine:
        return
    group, members = mine[2]
    peer = members[1] if dist.get_rank() == members[0] else members[0]
    for size in plan.sizes_bytes + plan.large_sizes_bytes:
        cost = _timed_exchange(group, peer, size, plan, rng)
        if keep and cost is not None:
            samples.setdefault(f"{OpKind.SEND.name}/2/{size}", []).append(cost)


def _batches(plan: Plan, mine: dict, rng: random.Random, samples: dict, *, keep: bool) -> None:
    """One repetition of the two-peer batches (every process keeps the job pattern's cadence)."""
    if not plan.ring_size or (BATCH_KEY not in mine and plan.pattern != "job"):
        return
    for num_ops in BATCH_OPS:
        for size in plan.sizes_bytes + plan.large_sizes_bytes:
            if BATCH_KEY not in mine:
                _start(None, plan, rng)
                continue
            group, members = mine[BATCH_KEY]
            cost = _timed_batch(group, members, num_ops, size, plan, rng)
            if keep and cost is not None:
                samples.setdefault(f"{BATCH_KEY}/{num_ops}/{size}", []).append(cost)


def fit(per_process: Sequence[dict[str, list[float]]], name: str) -> MeasuredCost:
    """Median over members and repetitions per (kind, n, size)."""
    merged: dict[str, list[float]] = {}
    for samples in per_process:
        for key, values in samples.items():
            merged.setdefault(key, []).extend(values)
    points: dict[tuple[OpKind, int], list[tuple[int, float]]] = {}
    batches: dict[int, list[tuple[int, float]]] = {}
    for key, values in merged.items():
        kind, n, size = key.split("/")
        point = (int(size), statistics.median(values))
        if kind == BATCH_KEY:
            batches.setdefault(int(n), []).append(point)
        else:
            points.setdefault((OpKind[kind], int(n)), []).append(point)
    return MeasuredCost(
        {key: monotone(p) for key, p in points.items()},
        name=name,
        batches={key: monotone(p) for key, p in batches.items()},
    )


@dataclasses.dataclass(frozen=True)
class Calibration:
    """`repeats` independent calibrations of one pattern and the cost model made of them."""

    pattern: str
    lead_in: str
    world_size: int
    draws: tuple[MeasuredCost, ...]
    seconds: float

    @property
    def cost(self) -> MeasuredCost:
        """Each point's median over the draws."""
        tables = {}
        for key in self.draws[0].tables:
            columns = zip(*(draw.tables[key] for draw in self.draws), strict=True)
            tables[key] = monotone(
                [(column[0][0], statistics.median(ns for _, ns in column)) for column in columns]
            )
        batches = {}
        for key in self.draws[0].batches:
            columns = zip(*(draw.batches[key] for draw in self.draws), strict=True)
            batches[key] = monotone(
                [(column[0][0], statistics.median(ns for _, ns in column)) for column in columns]
            )
        concurrency = {}
        for key in self.draws[0].concurrency:
            columns = zip(*(draw.concurrency[key] for draw in self.draws), strict=True)
            concurrency[key] = tuple(
                (column[0][0], statistics.median(f for _, f in column)) for column in columns
            )
        return MeasuredCost(
            tables, name=self.name, description=self.description, batches=batches, concurrency=concurrency
        )

    @property
    def name(self) -> str:
        return f"loopback-{self.pattern}-{self.lead_in}-w{self.world_size}"

    @property
    def description(self) -> str:
        return (
            f"gloo on this machine's loopback, pattern {self.pattern} ({self.lead_in} lead-in), "
            f"{self.world_size} processes, median of {len(self.draws)} calibrations"
        )

    def spread(self) -> dict[str, dict[str, list[float]]]:
        """Per table and message size, every draw's median (us), for the results."""
        return {
            f"{kind.name}/n={n}": {
                str(size): [round(draw.tables[(kind, n)][i][1] / 1e3, 1) for draw in self.draws]
                for i, (size, _) in enumerate(points)
            }
            for (kind, n), points in sorted(self.draws[0].tables.items())
        } | {
            f"{BATCH_KEY}/ops={num_ops}": {
                str(size): [round(draw.batches[num_ops][i][1] / 1e3, 1) for draw in self.draws]
                for i, (size, _) in enumerate(points)
            }
            for num_ops, points in sorted(self.draws[0].batches.items())
        }


def calibrate(
    group_sizes: Sequence[int],
    *,
    pattern: str,
    world_size: int,
    lead_in: str = "sleep",
    repetitions: int = 20,
    repeats: int = 3,
) -> Calibration:
    """`repeats` calibrations in forked gloo processes (`world_size` of them), fitted each.

    Args:
        world_size: the job pattern's number of processes (a job of that size); alone measures each
            group with max(group_sizes) processes.
    """
    from benchmarks.fidelity.processes import run_processes

    plan = Plan(
        group_sizes=tuple(sorted(set(group_sizes))), repetitions=repetitions, pattern=pattern, lead_in=lead_in
    )
    num_processes = world_size if pattern == "job" else max(max(plan.group_sizes), 2, plan.ring_size)
    if num_processes < max(plan.group_sizes):
        raise ValueError(f"world_size {world_size} is smaller than the largest group {max(plan.group_sizes)}")
    begin = time.monotonic()
    draws = tuple(
        fit(run_processes(measure, [plan] * num_processes), name=f"draw-{i}") for i in range(repeats)
    )
    return Calibration(pattern, lead_in, num_processes, draws, time.monotonic() - begin)
