"""Time and memory of the topology arithmetic at production scale (W = 8192, 65536, 131072).

Why: the backend, the capture pass and the replay engine ask for one rank's groups at start-up and
the `topology` command answers interactively, so one rank must cost milliseconds at any W and
never enumerate the world; listing every group of one kind is O(W) and is what a caller pays when
it truly needs the whole table.

Measured per job and W, each as the median over several runs (time without tracing; memory as the
tracemalloc peak of one separate run):
* one rank: coordinates, role, and the members of all 16 group kinds, for ranks spread over the world;
* roles and slice: building the layout, listing its roles and the default slice;
* all groups of one kind (tp, dp_cp, tp_dp_cp), materialised as a list;
* for reference, megatron-core's `RankGenerator.get_ranks` for the same kind (when installed).

Run: ``python -m benchmarks.topology.run [--quick] [--out DIR]``. Writes
``<DIR>/<YYYY-MM-DD>-topology.json`` and ``.md`` (DIR defaults to benchmarks/results/).
"""

from __future__ import annotations

import argparse
import statistics
import time
import tracemalloc

from benchmarks.common import EVERY_PACKAGE, RESULTS_DIR, environment, machine_line, today, write_results
from prism_megatron.topology import GROUP_KINDS, Layout

WORLD_SIZES = (8192, 65536, 131072)
JOBS = {
    "dense TP8 PP16": dict(tp=8, pp=16),
    "MoE TP8 PP8 CP2 EP8": dict(tp=8, pp=8, cp=2, ep=8),
}
LISTED_KINDS = ("tp", "dp_cp", "tp_dp_cp")
# kind -> (generator, megatron-core token) for the reference timing.
MEGATRON_TOKENS = {
    "tp": ("decoder", "tp"),
    "dp_cp": ("decoder", "dp-cp"),
    "tp_dp_cp": ("decoder", "tp-dp-cp"),
}


def median_ms_and_peak_kib(fn, repeats: int) -> tuple[float, float]:
    """Median wall time of `fn()` over `repeats` runs, and the tracemalloc peak of one more run."""
    times_ns = []
    for _ in range(repeats):
        start_ns = time.perf_counter_ns()
        fn()
        times_ns.append(time.perf_counter_ns() - start_ns)
    tracemalloc.start()
    fn()
    _, peak_bytes = tracemalloc.get_traced_memory()
    tracemalloc.stop()
    return statistics.median(times_ns) / 1e6, peak_bytes / 1024


def answer_one_rank(layout: Layout, virtual_rank: int) -> dict:
    return {
        "coords": layout.coords(virtual_rank),
        "role": layout.role_of(virtual_rank),
        "groups": {kind: layout.group(kind, virtual_rank) for kind in GROUP_KINDS},
    }


def one_rank_rows(job: str, layout: Layout, repeats: int) -> list[dict]:
    probes = [(layout.world_size * k) // 7 + k for k in range(7)]  # spread over stages and replicas
    times_ms, peaks_kib = [], []
    for virtual_rank in probes:
        time_ms, peak_kib = median_ms_and_peak_kib(lambda r=virtual_rank: answer_one_rank(layout, r), repeats)
        times_ms.append(time_ms)
        peaks_kib.append(peak_kib)
    return [
        {
            "job": job,
            "world_size": layout.world_size,
            "what": "one rank: coords, role, all 16 groups",
            "median_ms": statistics.median(times_ms),
            "peak_kib": max(peaks_kib),
        }
    ]


def build_and_slice(config: dict, world_size: int) -> list[int]:
    layout = Layout(world_size=world_size, **config)
    layout.roles()
    return layout.default_slice()


def megatron_generators(layout: Layout):
    try:
        from megatron.core.parallel_state import RankGenerator
    except ImportError:
        return None
    decoder = RankGenerator(tp=layout.tp, ep=1, dp=layout.dp, pp=layout.pp, cp=layout.cp, order=layout.order)
    return {"decoder": decoder}


def job_rows(job: str, config: dict, world_size: int, quick: bool) -> list[dict]:
    layout = Layout(world_size=world_size, **config)
    repeats = 3 if quick else 20
    rows = one_rank_rows(job, layout, repeats)
    time_ms, peak_kib = median_ms_and_peak_kib(lambda: build_and_slice(config, world_size), repeats)
    rows.append(
        {
            "job": job,
            "world_size": world_size,
            "what": "layout, roles, slice",
            "median_ms": time_ms,
            "peak_kib": peak_kib,
        }
    )
    generators = megatron_generators(layout)
    for kind in LISTED_KINDS:
        time_ms, peak_kib = median_ms_and_peak_kib(lambda k=kind: list(layout.groups(k)), 3 if quick else 5)
        row = {"job": job, "world_size": world_size, "what": f"all {kind} groups", "median_ms": time_ms}
        row["peak_kib"] = peak_kib
        row["num_groups"] = layout.num_groups(kind)
        if generators is not None:
            generator, token = MEGATRON_TOKENS[kind]
            row["megatron_core_get_ranks_ms"] = median_ms_and_peak_kib(
                lambda g=generators[generator], t=token: g.get_ranks(t), 1
            )[0]
        rows.append(row)
    for row in rows:
        print(
            f"{row['job']:22s} W={row['world_size']:<7d} {row['what']:40s} {row['median_ms']:9.3f} ms  "
            f"{row['peak_kib']:10.1f} KiB"
            + (
                f"  (megatron-core {row['megatron_core_get_ranks_ms']:.1f} ms)"
                if "megatron_core_get_ranks_ms" in row
                else ""
            ),
            flush=True,
        )
    return rows


def markdown(record: dict) -> str:
    env = record["environment"]
    lines = [
        f"# Topology arithmetic at production scale ({record['date']})",
        "",
        machine_line(env, EVERY_PACKAGE) + ".",
        "Medians; memory is the tracemalloc peak of one run. megatron-core column: `RankGenerator.get_ranks`"
        " for the same kind (one run), for reference.",
        "",
        "| job | W | what | median ms | peak KiB | megatron-core ms |",
        "|---|---:|---|---:|---:|---:|",
    ]
    for row in record["rows"]:
        reference = row.get("megatron_core_get_ranks_ms")
        lines.append(
            f"| {row['job']} | {row['world_size']} | {row['what']} | {row['median_ms']:.3f} | "
            f"{row['peak_kib']:.1f} | {'' if reference is None else f'{reference:.1f}'} |"
        )
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--quick", action="store_true", help="fewer repeats (a smoke run)")
    parser.add_argument("--out", default=RESULTS_DIR, help="directory for the JSON and .md results")
    args = parser.parse_args(argv)
    rows = []
    for job, config in JOBS.items():
        for world_size in WORLD_SIZES:
            rows += job_rows(job, config, world_size, args.quick)
    record = {
        "suite": "topology",
        "date": today(),
        "environment": environment(),
        "quick": args.quick,
        "rows": rows,
    }
    for path in write_results("topology", record, markdown(record), args.out):
        print(f"wrote {path}")
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
