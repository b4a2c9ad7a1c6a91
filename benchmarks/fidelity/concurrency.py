"""The concurrency term of the CPU cost model, measured: the same op with 1, 2, 4, 8, 16 groups at once.

`calibrate.py`'s two patterns measure an op alone or with every group of the job at once; a job's
schedule is neither. Here each op kind (all-reduce of each group size, the one-peer pipeline
exchange) is measured with G groups communicating at once, G in `LEVELS` (as many as the processes
allow), every group starting from the job pattern's common deadline out of the cases' kind of
compute (a sleep), while the other processes sleep on. The file it makes
(`prism_megatron.network.measured`) holds the costs alone (G = 1) and, per op kind and group size,
the factor on them at each G: the median over message sizes of cost(G, size) / cost(1, size). The
simulator applies it to every op by the groups its simulated schedule overlaps
(`prism_megatron.sim.concurrency`).

The interleaved pipeline's batches with two peers (`calibrate._timed_batch`: 2 or 4 ops, a ring of
`ring_size` processes) are measured too, with one ring at a time (G = 1), into the file's
`batches_us`: without them the simulation costs each op of such a batch as a one-peer exchange
alone. Their factor at G > 1 is the exchange's (the simulator asks the SEND table for every p2p op).

    python -m benchmarks.fidelity.concurrency --processes 16 --out costs.json   (minutes)
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import random
import statistics
from collections.abc import Sequence

import torch.distributed as dist

from benchmarks.fidelity import calibrate
from prism_megatron.network.measured import MeasuredCost, monotone
from prism_megatron.replay import OpKind

LEVELS = (1, 2, 4, 8, 16)


@dataclasses.dataclass(frozen=True, kw_only=True)
class ConcurrencyPlan:
    group_sizes: tuple[int, ...] = (2,)
    sizes_bytes: tuple[int, ...] = calibrate.SIZES_BYTES
    levels: tuple[int, ...] = LEVELS
    repetitions: int = 10
    warmup: int = 2
    lead_in: str = "sleep"
    ring_size: int = 4
    """Members of the ring the two-peer batches are measured in, one ring at a time (0: none)."""

    def __post_init__(self) -> None:
        if not self.levels or 1 not in self.levels or min(self.levels) < 1:
            raise ValueError(f"levels must include 1 (the cost alone) and be >= 1, got {self.levels}")
        if self.ring_size and self.ring_size < 3:
            raise ValueError(f"ring_size must be 0 (no batches) or >= 3 (two peers), got {self.ring_size}")

    @property
    def timing(self) -> calibrate.Plan:
        """The deadline start of the job pattern (every process reaches it out of its compute)."""
        return calibrate.Plan(
            group_sizes=self.group_sizes,
            sizes_bytes=self.sizes_bytes,
            large_sizes_bytes=(),
            pattern="job",
            lead_in=self.lead_in,
            ring_size=self.ring_size,
        )


def measure(plan: ConcurrencyPlan) -> dict[str, list[float]]:
    """In each gloo process: per "KIND/n/size@G", this member's costs (ns)."""
    from prism_megatron.config import EmulationConfig
    from prism_megatron.megatron.run import cpu_share

    share = cpu_share.take(EmulationConfig())
    dist.init_process_group("gloo")
    rank, world_size = dist.get_rank(), dist.get_world_size()
    rng = random.Random(rank)
    samples: dict[str, list[float]] = {}
    try:
        mine: dict[int, tuple] = {}  # n -> (group, members, index of the group among those of size n)
        for n in sorted(set(plan.group_sizes) | {2}):
            for index, first in enumerate(range(0, world_size - n + 1, n)):
                members = list(range(first, first + n))
                group = dist.new_group(members)
                if rank in members:
                    mine[n] = (group, members, index)
        if plan.ring_size:  # the calibration's own rings, the first measuring (one at a time)
            blocks, measuring = calibrate._groups_of(plan.ring_size, world_size, "alone")
            for index, members in enumerate(blocks):
                group = dist.new_group(members)  # every process creates every group, in order
                if index < measuring and rank in members:
                    mine[calibrate.BATCH_KEY] = (group, members)
        for repetition in range(plan.warmup + plan.repetitions):
            _one_round(plan, mine, world_size, rng, samples, keep=repetition >= plan.warmup)
    finally:
        dist.destroy_process_group()
        share.restore()
    return samples


def _one_round(plan: ConcurrencyPlan, mine: dict, world_size: int, rng, samples: dict, *, keep: bool) -> None:
    timing = plan.timing
    measured = [(OpKind.ALL_REDUCE, n) for n in plan.group_sizes] + [(OpKind.SEND, 2)]
    for kind, n in measured:
        sizes = plan.sizes_bytes
        for level in plan.levels:
            if level * n > world_size:
                continue
            for size in sizes:
                group, members, index = mine.get(n, (None, (), level))
                if index >= level:
                    calibrate._start(None, timing, rng)  # keep the cadence of the job's deadline
                    continue
                if kind == OpKind.SEND:
                    peer = members[1] if dist.get_rank() == members[0] else members[0]
                    cost = calibrate._timed_exchange(group, peer, size, timing, rng)
                else:
                    cost = calibrate._timed_collective(group, len(members), size, timing, rng)
                if keep and cost is not None:
                    samples.setdefault(f"{kind.name}/{n}/{size}@{level}", []).append(cost)
    if plan.ring_size > world_size:
        return
    batches: dict[str, list[float]] = {}  # the job pattern's batches, as calibrate measures them
    calibrate._batches(timing, mine, rng, batches, keep=keep)
    for key, values in batches.items():
        samples.setdefault(f"{key}@1", []).extend(values)


def fit(per_process: Sequence[dict[str, list[float]]], name: str) -> MeasuredCost:
    """Costs alone (G = 1), each (kind, n)'s factors (median over sizes of cost(G) / cost(1)) and the
    two-peer batches alone (per op count: median over members and repetitions)."""
    medians: dict[tuple[OpKind, int, int], dict[int, float]] = {}
    batches: dict[int, list[tuple[int, float]]] = {}
    merged: dict[str, list[float]] = {}
    for samples in per_process:
        for key, values in samples.items():
            merged.setdefault(key, []).extend(values)
    for key, values in merged.items():
        head, _, level = key.partition("@")
        kind, n, size = head.split("/")
        if kind == calibrate.BATCH_KEY:
            batches.setdefault(int(n), []).append((int(size), statistics.median(values)))
            continue
        medians.setdefault((OpKind[kind], int(n), int(level)), {})[int(size)] = statistics.median(values)
    tables, factors = {}, {}
    for (kind, n, level), by_size in sorted(medians.items()):
        alone = medians.get((kind, n, 1), {})
        if level == 1:
            tables[(kind, n)] = monotone(sorted(by_size.items()))
            factors.setdefault((kind, n), []).append((1.0, 1.0))
            continue
        ratios = [cost / alone[size] for size, cost in by_size.items() if alone.get(size)]
        if ratios:
            factors.setdefault((kind, n), []).append((float(level), statistics.median(ratios)))
    concurrency = {key: tuple(sorted(points)) for key, points in factors.items() if len(points) > 1}
    return MeasuredCost(
        tables,
        name=name,
        batches={num_ops: monotone(sorted(points)) for num_ops, points in batches.items()},
        concurrency=concurrency,
    )


def calibrate_concurrency(
    plan: ConcurrencyPlan, *, num_processes: int, repeats: int = 1
) -> calibrate.Calibration:
    """`repeats` calibrations in forked gloo processes (pattern "concurrent"); the cost model
    (`Calibration.cost`) takes each point's and each factor's median over them."""
    import time

    from benchmarks.fidelity.processes import run_processes

    begin = time.monotonic()
    draws = tuple(
        fit(run_processes(measure, [plan] * num_processes), name=f"draw-{i}") for i in range(repeats)
    )
    return calibrate.Calibration("concurrent", plan.lead_in, num_processes, draws, time.monotonic() - begin)


def _median_points(draws: Sequence[Sequence[tuple[float, float]]]) -> list[tuple[float, float]]:
    """Point by point, the median of the draws' values (every draw measured the same points)."""
    return [
        (column[0][0], statistics.median(value for _, value in column)) for column in zip(*draws, strict=True)
    ]


def main(argv: Sequence[str] | None = None) -> None:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--processes", type=int, default=16, help="gloo processes (groups of 2: up to half)")
    parser.add_argument("--group-sizes", type=int, nargs="+", default=[2])
    parser.add_argument("--levels", type=int, nargs="+", default=list(LEVELS))
    parser.add_argument("--repetitions", type=int, default=10)
    parser.add_argument("--repeats", type=int, default=1)
    parser.add_argument("--out", required=True, help="the measured-costs file to write (JSON)")
    args = parser.parse_args(argv)
    plan = ConcurrencyPlan(
        group_sizes=tuple(args.group_sizes),
        levels=tuple(sorted(set(args.levels))),
        repetitions=args.repetitions,
    )
    cost = calibrate_concurrency(plan, num_processes=args.processes, repeats=args.repeats).cost
    with open(args.out, "w", encoding="utf-8") as f:
        json.dump(cost.to_dict(), f, indent=1)
    print(json.dumps(cost.to_dict()["concurrency"], indent=1))


if __name__ == "__main__":
    main()
