"""The memory plan of every shipped configuration, per rank and category, and what it costs to make.

Why: the plan's numbers come from megatron-core's own model, DDP buffers and optimizer sharding, so a
new megatron-core (or a change in the plugin) that moves what a production rank holds moves them;
keeping them here shows when and by how much. The time shows that a full-size job plans in minutes on
a 2-core machine without a GPU.

For each configuration in launch/configs/, the ranks planned are, on every pipeline stage, the first
and the last data-parallel rank (tp = cp = ep = 0); the last one holds the optimizer shard with the
buckets' padding. Recorded per rank: bytes of parameters, gradients, optimizer state (main params,
fp32 gradient copies, moments) and the activation estimate, and Megatron-LM's theoretical estimate for
the same rank. Recorded per configuration: the wall time of the whole plan and the median time to
build one stage. For the largest job (Llama 3 405B at 16384 GPUs) the default slice (one rank per
role) is also timed, as `prism-megatron plan` runs it by default.

Run: ``python -m benchmarks.plan.run [--out DIR] [--only NAME ...]``. Writes
``<DIR>/<YYYY-MM-DD>-plan.json`` and ``.md`` (DIR defaults to benchmarks/results/).
"""

from __future__ import annotations

import argparse
import statistics
import time
from pathlib import Path

from benchmarks.common import RESULTS_DIR, environment, today, write_results
from prism_megatron.megatron.job.configs import read_config
from prism_megatron.megatron.job.job import job_from_flags
from prism_megatron.megatron.plan.rank_plan import plan_ranks
from prism_megatron.megatron.plan.report import job_summary
from prism_megatron.topology import select_ranks

CONFIG_DIR = Path(__file__).resolve().parents[2] / "launch" / "configs"
SLICE_TIMED = "llama3-405b-16384gpus"
GIB = 2**30


def ranks_to_plan(job) -> list[int]:
    """First and last data-parallel rank of every pipeline stage, at tp = cp = ep = 0."""
    layout = job.target.layout()
    last_dp = layout.dp - 1
    return select_ranks(layout, f"tp=0;cp=0;ep=0;dp=0,{last_dp}" if last_dp else "tp=0;cp=0;ep=0;dp=0")


CATEGORIES = (
    "parameters", "gradients", "optimizer_main_params", "optimizer_grad_copies", "optimizer_moments", "activations",
)  # fmt: skip


def rank_record(plan) -> dict:
    """The numbers of one rank (the sources, the same for every rank of a job, are kept once per job)."""
    return {
        "virtual_rank": plan.virtual_rank,
        "coords": plan.coords,
        "num_params": plan.num_params,
        "bytes": {name: getattr(plan, name).bytes for name in CATEGORIES},
        "total_bytes": plan.total_bytes,
        "padding_elements": sum(b.numel_padded - b.num_params for b in plan.buffers if b.has_param_buffer),
        "megatron_estimate": {
            "num_params": plan.megatron.num_params,
            "weight_and_optimizer_bytes": plan.megatron.weight_and_optimizer_bytes,
            "activation_bytes": plan.megatron.activation_bytes,
        },
    }


def plan_config(path: Path) -> dict:
    job = job_from_flags(read_config(path))
    started = time.perf_counter()
    plans = plan_ranks(job, ranks_to_plan(job))
    seconds = time.perf_counter() - started
    builds = [p.seconds for p in plans if p.built_as == p.virtual_rank]
    return {
        "config": path.stem,
        "job": job_summary(job),
        "plan_seconds": round(seconds, 2),
        "median_stage_build_seconds": round(statistics.median(builds), 3),
        "sources": {name: getattr(plans[0], name).source for name in CATEGORIES},
        "ranks": [rank_record(p) for p in plans],
    }


def time_default_slice(name: str) -> dict:
    job = job_from_flags(read_config(CONFIG_DIR / f"{name}.args"))
    ranks = job.target.layout().default_slice()
    started = time.perf_counter()
    plan_ranks(job, ranks)
    return {"config": name, "num_ranks": len(ranks), "seconds": round(time.perf_counter() - started, 2)}


def _row(entry: dict, rank: dict) -> str:
    b = rank["bytes"]
    optimizer = b["optimizer_main_params"] + b["optimizer_grad_copies"] + b["optimizer_moments"]
    m = rank["megatron_estimate"]
    cells = [
        entry["config"], str(rank["virtual_rank"]), str(rank["coords"]["pp"]), f"{rank['num_params'] / 1e9:.3f}",
        f"{b['parameters'] / GIB:.2f}", f"{b['gradients'] / GIB:.2f}", f"{optimizer / GIB:.2f}",
        f"{b['activations'] / GIB:.2f}", f"{rank['total_bytes'] / GIB:.2f}",
        f"{m['weight_and_optimizer_bytes'] / GIB:.2f}", f"{m['activation_bytes'] / GIB:.2f}",
    ]  # fmt: skip
    return "| " + " | ".join(cells) + " |"


def markdown(record: dict) -> str:
    lines = [
        f"# Memory plan of the shipped configurations ({record['date']})",
        "",
        f"Machine: {record['environment']['platform']}, {record['environment']['cpu_count']} CPUs; "
        f"megatron-core {record['environment']['megatron_core']}, torch {record['environment']['torch']}.",
        "GiB per rank, first data-parallel rank of the first and the last pipeline stage (all planned ranks "
        "are in the JSON). Activations are an estimate; Megatron's columns are its theoretical estimate "
        "(weights + optimizer, activations) for the same rank's stage.",
        "",
        "| config | rank | pp | params (B) | parameters | gradients | optimizer | activations | total "
        "| Megatron w+o | Megatron act |",
        "|---|---|---|---|---|---|---|---|---|---|---|",
    ]
    for entry in record["configs"]:
        first = entry["ranks"][0]
        last_stage = max(r["coords"]["pp"] for r in entry["ranks"])
        last = next(r for r in entry["ranks"] if r["coords"]["pp"] == last_stage)
        lines.append(_row(entry, first))
        if last is not first:
            lines.append(_row(entry, last))
    lines += ["", "| config | ranks planned | plan time (s) | median stage build (s) |", "|---|---|---|---|"]
    for entry in record["configs"]:
        lines.append(
            f"| {entry['config']} | {len(entry['ranks'])} | {entry['plan_seconds']} | {entry['median_stage_build_seconds']} |"
        )
    s = record.get("default_slice")
    if s:
        lines += ["", f"Default slice of {s['config']}: {s['num_ranks']} ranks planned in {s['seconds']} s."]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", default=RESULTS_DIR)
    parser.add_argument("--only", nargs="*", default=None, help="configuration names (file stems) to plan")
    args = parser.parse_args(argv)
    paths = sorted(CONFIG_DIR.glob("*.args"))
    if args.only:
        paths = [p for p in paths if p.stem in args.only]
    record = {"suite": "plan", "date": today(), "environment": environment(), "configs": []}
    for path in paths:
        record["configs"].append(plan_config(path))
        print(f"{path.stem}: {record['configs'][-1]['plan_seconds']} s", flush=True)
    if not args.only or SLICE_TIMED in args.only:
        record["default_slice"] = time_default_slice(SLICE_TIMED)
    for path in write_results("plan", record, markdown(record), args.out):
        print(path)
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
