"""Why a fidelity case misses: the real run's exchanges and all-reduces beside the simulated ones.

For one case: calibrate, run the ground truth with the real rank's pipeline exchanges and
all-reduces traced, capture and simulate as the suite does, and print, for one iteration of the
first real rank, each step's start and end in the real run and in the simulation (ms from the
iteration start) and how far apart their ends are. A drift that grows step by step is compute or
latency the simulation lacks; a jump at one op is that op's cost.

The last lines split the difference, for every timed iteration: before the first step, compute
between the steps (what the rank computed longer or shorter than its spans), and the steps
themselves (the op and the wait in it for later peers); and how late the rank's compute sleeps woke
against what they asked for (the sleep model's own share of "compute").

Any case of the fidelity suite or of the mechanism suite (`mechanism.py`), simulated over the costs
its suite judges it by unless `--costs` says otherwise: the job pattern's (the fidelity suite's
model) or the alone pattern's (the mechanism suite's). One calibration draw, where the suites take
three.

With `--every-rank`, a line per rank: its median drift over the timed iterations and the same split,
so that the ranks whose compute or sleeps ran long stand out from those that only waited for them.

Run: ``python -m benchmarks.fidelity.diagnose CASE [--iteration N] [--rank R] [--costs job|alone]
[--compute-scale F] [--every-rank]``.
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import itertools
import statistics
import sys
import warnings


def _simulated_steps(result, virtual_rank: int) -> list[tuple[float, float, str]]:
    """(start ms, end ms, ops) of each blocking step of the rank: p2p batches and collectives."""
    from prism_megatron.graph import NodeType
    from prism_megatron.graph.printable import format_op

    steps, batch = [], None
    for timing in result.timeline(virtual_rank):
        if timing.stream != "compute" or timing.op.type in (NodeType.COMPUTE, NodeType.WAIT):
            continue
        if batch is None:
            batch = [timing.start_ns / 1e6, timing.end_ns / 1e6, format_op(timing.op)]
        else:
            batch[1] = max(batch[1], timing.end_ns / 1e6)
            batch[2] += " + " + format_op(timing.op)
        if not timing.op.coalesced:
            steps.append(tuple(batch))
            batch = None
    return steps


PATTERNS = ("job", "alone")
"""Cost patterns a diagnosis simulates over: the fidelity suite's and the mechanism suite's."""


def _measure(case, work: str, pattern: str = "job"):
    """The traced ground truth (its compute sleeps recorded) and the simulation of the case over
    the `pattern`'s calibrated costs, as the suites make them."""
    from benchmarks.fidelity import compare, passes
    from benchmarks.fidelity.calibrate import calibrate
    from prism_megatron import files

    lead_in = "busy" if case.kind == "real-compute" else "sleep"
    cost = calibrate(
        compare.group_sizes(case.job),
        pattern=pattern,
        world_size=case.job.world_size,
        lead_in=lead_in,
        repeats=1,
    ).cost
    cost_file = f"{work}/costs.json"
    files.write_json(cost.to_dict(), cost_file)
    real = passes.real(case.job, f"{work}/real", case.iterations, trace=True, record_sleeps=True)
    plan = passes.plan(
        case.job,
        real_ranks=case.real_ranks,
        out_dir=f"{work}/emulate",
        cost_file=cost_file,
        iterations=case.iterations,
        capture_iters=case.capture_iters,
    )
    return real, passes.simulate(plan, passes.capture(plan, case.job))


def real_steps(trace: dict, index: int) -> list[tuple[float, float, str]]:
    """(start ms, end ms, what) of each traced exchange and all-reduce of a rank's iteration `index`
    (ms from the iteration's start), in order."""
    start, end = trace["starts_ns"][index], trace["ends_ns"][index]
    windows = sorted(
        [(a, b, "exchange") for a, b in trace["exchanges_ns"]]
        + [(a, b, "all-reduce") for a, b in trace["all_reduces_ns"]]
    )
    return [((a - start) / 1e6, (b - start) / 1e6, what) for a, b, what in windows if start <= a < end]


def split(real: list[tuple[float, float, str]], simulated: list[tuple[float, float, str]]) -> dict:
    """Where the real iteration's steps drift from the simulated ones, in ms (real - simulated), over
    the steps both have: `before` the first step's start (the first compute), `compute` the sum over
    the gaps between consecutive steps (what the rank computed between two ops) and `steps` the sum
    over the steps' own lengths (the op, and waiting in it for its peers). The three add up to the
    last matched step's end difference."""
    pairs = list(zip(real, simulated, strict=False))
    if not pairs:
        return {"steps_matched": 0, "before": 0.0, "compute": 0.0, "steps": 0.0}
    gaps = [(r[0] - r_prev[1]) - (s[0] - s_prev[1]) for (r_prev, s_prev), (r, s) in itertools.pairwise(pairs)]
    return {
        "steps_matched": len(pairs),
        "before": pairs[0][0][0] - pairs[0][1][0],
        "compute": sum(gaps),
        "steps": sum((r[1] - r[0]) - (s[1] - s[0]) for r, s in pairs),
    }


def late_sleeps_ms(sleeps_ns, start_ns: int, end_ns: int) -> tuple[int, float]:
    """(count, ms late in all) of the compute sleeps that began in [start_ns, end_ns): each sleep's
    length beyond what it asked for (`workload.Request.record_sleeps`' (begin, end, requested))."""
    inside = [(b, e, asked) for b, e, asked in sleeps_ns if start_ns <= b < end_ns]
    return len(inside), sum(e - b - asked for b, e, asked in inside) / 1e6


def iteration_split(trace: dict, index: int, simulated, finish_ms: float) -> dict:
    """A rank's iteration `index` against its simulation, in ms: `real`, `drift` (real - simulated
    iteration), `split`'s parts over the matched steps, `after` the last matched step (the rest of
    the drift), and `sleeps` / `late`: how many compute sleeps began in it and what they overslept."""
    begin_ns, end_ns = trace["starts_ns"][index], trace["ends_ns"][index]
    real_ms = (end_ns - begin_ns) / 1e6
    parts = split(real_steps(trace, index), simulated)
    sleeps, late = late_sleeps_ms(trace.get("sleeps_ns") or [], begin_ns, end_ns)
    drift = real_ms - finish_ms
    return {
        **parts,
        "real": real_ms,
        "drift": drift,
        "after": drift - parts["before"] - parts["compute"] - parts["steps"],
        "sleeps": sleeps,
        "late": late,
    }


def median_split(trace: dict, indices, simulated, finish_ms: float) -> dict:
    """`iteration_split`'s numbers, each the median over the iterations `indices` (a rank's summary)."""
    splits = [iteration_split(trace, i, simulated, finish_ms) for i in indices]
    if not splits:
        raise ValueError("no timed iterations to summarise")
    return {key: statistics.median(s[key] for s in splits) for key in splits[0]}


def _cases(scale: float | None = None) -> dict:
    """Every case of both suites by name; the mechanism suite's at `scale` (its default when None)."""
    from benchmarks.fidelity import mechanism
    from benchmarks.fidelity.cases import real_compute_cases, sleep_cases, smoke_case

    every = [
        smoke_case(),
        *sleep_cases(),
        *real_compute_cases(),
        mechanism.smoke_case(),
        *mechanism.mechanism_cases(scale=mechanism.COMPUTE_SCALE if scale is None else scale),
    ]
    return {c.name: c for c in every}


def default_pattern(name: str) -> str:
    """The costs a case's suite judges it by: the mechanism suite's for its cases, else the job pattern."""
    from benchmarks.fidelity import mechanism

    return mechanism.MODEL if name.startswith("mech-") else "job"


def diagnose(
    name: str,
    iteration: int | None,
    rank: int | None = None,
    pattern: str | None = None,
    scale: float | None = None,
    every_rank: bool = False,
) -> None:
    import tempfile

    from prism_megatron.graph import NodeType

    pattern = default_pattern(name) if pattern is None else pattern
    if pattern not in PATTERNS:
        raise ValueError(f"--costs must be one of {', '.join(PATTERNS)}, got {pattern!r}")
    cases = _cases(scale)
    if name not in cases:
        raise ValueError(f"no case {name!r}; cases: {', '.join(cases)}")
    case = cases[name]
    virtual_rank = case.real_ranks[0] if rank is None else rank
    if not 0 <= virtual_rank < case.job.world_size:
        raise ValueError(f"--rank must be a rank of the case's job, 0..{case.job.world_size - 1}, got {rank}")
    with tempfile.TemporaryDirectory(prefix="prism-diagnose-") as work:
        real, result = _measure(case, work, pattern)
    trace = real[virtual_rank]
    times = trace["iteration_times_ms"]
    index = case.iterations - 1 if iteration is None else iteration
    start, end = trace["starts_ns"][index], trace["ends_ns"][index]
    windows = real_steps(trace, index)
    simulated = _simulated_steps(result, virtual_rank)
    finish_ms = result.finish_ns(virtual_rank) / 1e6
    print(
        f"{name}: virtual rank {virtual_rank}, real iterations {[round(t, 1) for t in times]} ms, "
        f"simulated {finish_ms:.1f} ms over the {pattern} costs; iteration {index}:"
    )
    print(
        f"{'real':>10} {'start':>9} {'end':>9}   {'sim start':>9} {'sim end':>9}   {'end diff':>8}  simulated ops"
    )
    for (a, b, what), (sa, sb, ops) in zip(windows, simulated, strict=False):
        print(f"{what:>10} {a:9.2f} {b:9.2f}   {sa:9.2f} {sb:9.2f}   {b - sb:+8.2f}  {ops}")
    print(f"{'end':>10} {(end - start) / 1e6:9.2f}   simulated {finish_ms:9.2f}")
    spans = [t.op for t in result.timeline(virtual_rank) if t.op.type == NodeType.COMPUTE]
    host_ms = sum(op.overhead_ns for op in spans) / 1e6
    print(
        f"the rank's {len(spans)} captured compute spans: {sum(op.duration_ns for op in spans) / 1e6:.2f} ms, "
        f"of which host work (the program around its sleeps) {host_ms:.2f} ms, "
        f"{host_ms / max(len(spans), 1):.3f} ms a span"
    )
    timed = range(case.warmup, case.iterations)
    print("real - simulated, per timed iteration (the matched steps split as the table's end diff):")
    for i in timed:
        parts = iteration_split(trace, i, simulated, finish_ms)
        sleeps = "no sleeps recorded (real compute)"
        if trace.get("sleeps_ns"):
            sleeps = f"of which its {parts['sleeps']} sleeps woke {parts['late']:+.2f} late"
        print(
            f"  iteration {i}: {parts['drift']:+.2f} ms = before the first step {parts['before']:+.2f}, "
            f"compute between steps {parts['compute']:+.2f} ({sleeps}), the {parts['steps_matched']} "
            f"steps themselves {parts['steps']:+.2f}, after the last step {parts['after']:+.2f}"
        )
    if every_rank:
        print(
            "every rank, median over the timed iterations of real - simulated (ms) and of each part of "
            "its split (each column its own median, so they need not add up); late: what its compute "
            "sleeps overslept (n/a: none recorded)"
        )
        print(
            f"{'rank':>5} {'real':>9} {'sim':>9} {'drift':>8} {'before':>8} {'compute':>8} "
            f"{'late':>7} {'steps':>8} {'after':>7}"
        )
        for r in range(case.job.world_size):
            rank_sim = _simulated_steps(result, r)
            rank_finish_ms = result.finish_ns(r) / 1e6
            m = median_split(real[r], timed, rank_sim, rank_finish_ms)
            late = f"{m['late']:+7.2f}" if real[r].get("sleeps_ns") else f"{'n/a':>7}"
            print(
                f"{r:5d} {m['real']:9.1f} {rank_finish_ms:9.1f} {m['drift']:+8.2f} {m['before']:+8.2f} "
                f"{m['compute']:+8.2f} {late} {m['steps']:+8.2f} {m['after']:+7.2f}"
            )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("case")
    parser.add_argument(
        "--iteration", type=int, default=None, help="which timed iteration (default: the last)"
    )
    parser.add_argument(
        "--rank",
        type=int,
        default=None,
        help="which rank of the real run (every rank is traced; default: the case's first real rank)",
    )
    parser.add_argument(
        "--costs",
        default=None,
        choices=PATTERNS,
        help="simulate over the job pattern's costs (the fidelity suite's model) or alone's (the "
        "mechanism suite's); default: those of the case's suite",
    )
    parser.add_argument(
        "--compute-scale",
        type=float,
        default=None,
        help="a mechanism case's compute per step against the fidelity suite's, as the mechanism "
        "suite's --compute-scale (default: that suite's default)",
    )
    parser.add_argument(
        "--every-rank",
        action="store_true",
        help="also a line per rank of the job: the median drift over the timed iterations and its split "
        "(which peers' compute or waits the chosen rank's excess comes from)",
    )
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    import megatron.core  # noqa: F401  (once here; the forked processes inherit it)

    try:
        diagnose(args.case, args.iteration, args.rank, args.costs, args.compute_scale, args.every_rank)
    except ValueError as exc:
        parser.error(str(exc))
    return 0


if __name__ == "__main__":
    sys.exit(main())
