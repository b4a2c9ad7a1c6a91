"""The cost of gloo communication on this machine's loopback, measured before the cases.

The simulator needs, for every communication op of a virtual peer, its cost once every member has
arrived. Here that is measured, not assumed: real gloo processes on loopback issue each op kind the
cases use, for each group size and message size the cases use, with members arriving in a random
order; an op's cost is the time from the last member's issue to each member's completion (one
clock: every process reads this machine's CLOCK_MONOTONIC), median over members and repetitions.
A line `latency + bytes * ns_per_byte` is then fitted per (op kind, group size). Ops are issued
through the same Python calls megatron-core uses (`all_reduce`; `batch_isend_irecv` then `wait`),
so the calls' own overhead is part of the cost, as it is part of the real run's time.

Nothing here looks at the cases' iteration times: the cost model is fixed before any case runs.
"""

from __future__ import annotations

import dataclasses
import random
import statistics
import time
from collections.abc import Sequence

import torch
import torch.distributed as dist

from prism_megatron.replay import CostLine, OpKind

P2P_KEY = (OpKind.SEND, 2)
SIZES_BYTES = (4, 512, 4096, 32768, 131072)
MAX_JITTER_S = 0.001


@dataclasses.dataclass(frozen=True, kw_only=True)
class Plan:
    group_sizes: tuple[int, ...]
    sizes_bytes: tuple[int, ...] = SIZES_BYTES
    repetitions: int = 25


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


def _timed_p2p(group, peer: int, sender: bool, size_bytes: int, rng: random.Random) -> float:
    """ns from the later of the two posts to this side's completion of one send/recv pair."""
    tensor = torch.zeros(max(size_bytes // 4, 1))
    dist.barrier(group=group)
    time.sleep(rng.random() * MAX_JITTER_S)
    issue_ns = time.monotonic_ns()
    op = dist.P2POp(dist.isend if sender else dist.irecv, tensor, peer, group)
    for request in dist.batch_isend_irecv([op]):
        request.wait()
    done_ns = time.monotonic_ns()
    issues = torch.zeros(2, dtype=torch.int64)
    dist.all_gather_into_tensor(issues, torch.tensor([issue_ns]), group=group)
    return float(done_ns - int(issues.max()))


def measure(plan: Plan) -> dict[str, list[float]]:
    """In each of max(group sizes) gloo processes: per (kind, n, size), this member's costs (ns)."""
    torch.set_num_threads(1)
    dist.init_process_group("gloo")
    rank = dist.get_rank()
    rng = random.Random(rank)
    samples: dict[str, list[float]] = {}
    try:
        for n in plan.group_sizes:
            members = list(range(n))
            group = dist.new_group(members)
            if rank >= n:
                continue
            for size in plan.sizes_bytes:
                key = f"{int(OpKind.ALL_REDUCE)}/{n}/{size}"
                samples[key] = [_timed_collective(group, members, size, rng) for _ in range(plan.repetitions)]
        pair = dist.new_group([0, 1])
        if rank < 2:
            for size in plan.sizes_bytes:
                key = f"{int(P2P_KEY[0])}/2/{size}"
                samples[key] = [
                    _timed_p2p(pair, 1 - rank, (rep + rank) % 2 == 0, size, rng)
                    for rep in range(plan.repetitions)
                ]
    finally:
        dist.destroy_process_group()
    return samples


def fit_line(points: Sequence[tuple[int, float]]) -> CostLine:
    """Least-squares latency + ns/byte, both kept >= 0 (a negative slope means: latency only)."""
    xs, ys = [p[0] for p in points], [p[1] for p in points]
    mean_x, mean_y = statistics.fmean(xs), statistics.fmean(ys)
    var_x = sum((x - mean_x) ** 2 for x in xs)
    slope = sum((x - mean_x) * (y - mean_y) for x, y in zip(xs, ys, strict=True)) / var_x if var_x else 0.0
    slope = max(slope, 0.0)
    return CostLine(max(mean_y - slope * mean_x, 0.0), slope)


@dataclasses.dataclass(frozen=True)
class LoopbackCost:
    """A simulator cost function (`prism_megatron.sim.CostFn`) from fitted gloo lines.

    Collectives of a kind not measured cost what an all-reduce of the same group size and bytes
    does; group sizes not measured take the nearest measured size.
    """

    lines: dict[tuple[int, int], CostLine]
    medians_ns: dict[str, float]

    def __call__(self, kind: OpKind, members: tuple[int, ...], size_bytes: int) -> float:
        n = len(members)
        if kind in (OpKind.SEND, OpKind.RECV):
            line = self.lines[(int(OpKind.SEND), 2)]
        else:
            if n <= 1:
                return 0.0
            measured = [m for k, m in self.lines if k == int(OpKind.ALL_REDUCE)]
            nearest = min(measured, key=lambda m: (abs(m - n), -m))
            line = self.lines[(int(OpKind.ALL_REDUCE), nearest)]
        return line.latency_ns + line.ns_per_byte * size_bytes

    def as_dict(self) -> dict:
        return {
            "lines": {
                f"{OpKind(k).name}/n={n}": {
                    "latency_us": line.latency_ns / 1e3,
                    "ns_per_byte": line.ns_per_byte,
                }
                for (k, n), line in sorted(self.lines.items())
            },
            "medians_us": {key: value / 1e3 for key, value in sorted(self.medians_ns.items())},
        }


def fit(per_process: Sequence[dict[str, list[float]]]) -> LoopbackCost:
    """Median over members and repetitions per (kind, n, size); one line per (kind, n)."""
    merged: dict[str, list[float]] = {}
    for samples in per_process:
        for key, values in samples.items():
            merged.setdefault(key, []).extend(values)
    medians = {key: statistics.median(values) for key, values in merged.items()}
    points: dict[tuple[int, int], list[tuple[int, float]]] = {}
    for key, value in medians.items():
        kind, n, size = (int(part) for part in key.split("/"))
        points.setdefault((kind, n), []).append((size, value))
    return LoopbackCost({key: fit_line(sorted(p)) for key, p in points.items()}, medians)


def calibrate(group_sizes: Sequence[int], repetitions: int = 25) -> LoopbackCost:
    """Measure in max(group_sizes) forked gloo processes and fit."""
    from benchmarks.fidelity.processes import run_processes

    plan = Plan(group_sizes=tuple(sorted(set(group_sizes))), repetitions=repetitions)
    num_processes = max(max(plan.group_sizes), 2)
    return fit(run_processes(measure, [plan] * num_processes))
