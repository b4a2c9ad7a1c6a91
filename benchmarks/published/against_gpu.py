"""The modelled GPU against a lent GPU's run of the same program: each measured number predicted here.

    python -m benchmarks.published.against_gpu [--gpu-results FILE] [--out-dir DIR]

Why: the published suite (`run.py`) holds the model against Megatron-LM's and Llama 3's runs, which
ran Transformer Engine's fused kernels. The GPU stages of `benchmarks/gpu/run.sh` ran the built-in
entry's own jobs on an H200 at full size (`main_claim`, `kernel_profile`, `emulated_llama_rank`) and
recorded what they measured in a GPU results file. The same jobs, run here with `--prism-device
model:h200` (the real program on fake tensors, every op timed by the model), predict each of those
numbers; nothing in the model was fitted to them. Writes benchmarks/results/<date>-modelled-vs-gpu.md
and .json.

What is compared, per job (the GPU's numbers from its results file):

* compute per iteration: `main_claim`'s rank run alone (one process, world size 1: its iteration has
  no communication but groups of one) against the modelled role's compute; `emulated_llama_rank`'s
  stage 0 run alone (its capture pass's compute spans) against the modelled role's compute;
* GEMM and other kernels per iteration (`main_claim`'s job, from `kernel_profile`: torch.profiler's
  kernel records, matrix-multiply kernels by their cuBLAS and CUTLASS names, averaged over the run's
  iterations, the warm-up included) against the model's gemm and memory-bound (with launch) time;
* peak memory: the allocator's peak (`max_memory_allocated` over the steps) against the modelled
  rank's peak of live fake storage.

The modelled runs are told what the GPU's run was: the built-in entry runs megatron-core's local
attention there, which materialises the scores whatever `--attention-backend` says, so they pass
`--attention-backend unfused` (the modelled device keeps that kernel instead of a fused one); the GPU
had no Transformer Engine and no apex, so the built-in entry ran every Megatron fusion unfused, and
they pass Megatron's flags that turn each off (`NO_FUSIONS`: the modelled device then charges the
ops one by one). Two things have no flag and stay modelled as a Megatron GPU run has them: the norms
(one kernel each way; the GPU ran torch's) and the optimizer step (one fused Adam; the GPU ran
torch's multi-tensor AdamW).
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import subprocess
import sys
import tempfile
import time

from benchmarks.common import EVERY_PACKAGE, environment, machine_line
from prism_megatron import files

REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))
DEFAULT_GPU_RESULTS = os.path.join(REPO, "benchmarks", "results", "2026-12-04-gpu-window2.json")
GPU = "h200"
MODELLED_TIMEOUT_S = 900.0
NO_FUSIONS = (
    "--no-gradient-accumulation-fusion", "--no-bias-gelu-fusion", "--no-bias-swiglu-fusion",
    "--no-bias-dropout-fusion", "--no-rope-fusion",
)  # fmt: skip
"""Megatron's flags that turn its fusions off: what the GPU's run, without TE or apex, ran."""


def stage_results(gpu_results: dict, stage: str) -> dict | None:
    """A stage's results in a GPU results file (run.sh's summary), or None when it left none."""
    for step in gpu_results["steps"]:
        if step["name"] == stage:
            return (step.get("results") or {}).get(stage)
    return None


def as_the_gpu_ran(flags: list[str]) -> list[str]:
    """The job's flags with `--attention-backend unfused` and every fusion off (the module docstring)."""
    if "--attention-backend" in flags:
        index = flags.index("--attention-backend")
        flags = [*flags[:index], *flags[index + 2 :]]
    return [*flags, "--attention-backend", "unfused", *(flag for flag in NO_FUSIONS if flag not in flags)]


def modelled_run(flags: list[str], world_size: int, rank: int, out_dir: str) -> dict:
    """`prism-megatron emulate` of the job on the modelled GPU; its report.json and the seconds it took."""
    command = [
        sys.executable, "-m", "prism_megatron.cli", "emulate", "--", *as_the_gpu_ran(flags),
        "--prism-emulate", "--prism-world-size", str(world_size), "--prism-ranks", str(rank),
        "--prism-device", f"model:{GPU}", "--prism-memory-history", "--prism-out", out_dir,
    ]  # fmt: skip
    env = dict(os.environ, PYTHONPATH=os.pathsep.join(p for p in (REPO, os.environ.get("PYTHONPATH")) if p))
    begin = time.monotonic()
    done = subprocess.run(
        command, cwd=REPO, env=env, capture_output=True, text=True, timeout=MODELLED_TIMEOUT_S
    )
    seconds = time.monotonic() - begin
    if done.returncode != 0:
        raise RuntimeError(f"the modelled run failed (exit {done.returncode}):\n{done.stderr[-3000:]}")
    with open(os.path.join(out_dir, files.REPORT_JSON)) as f:
        report = json.load(f)
    peaks, ops, calls = {}, {}, {}
    for path in files.results_paths(os.path.join(out_dir, files.CAPTURE_DIR)):
        with open(path) as f:
            rank = json.load(f)
        peaks[str(rank["virtual_rank"])] = rank["memory"].get("at_peak_allocations")
        device = rank.get("modelled_device") or {}
        iterations = max(len(device.get("iterations_by_kind_ns") or []), 1)
        ops[str(rank["virtual_rank"])] = {
            name: ns / iterations for name, ns in (device.get("top_ops_ns") or {}).items()
        }
        calls[str(rank["virtual_rank"])] = [
            {**call, "ns": call["ns"] / iterations} for call in device.get("top_op_calls") or []
        ]
    return {
        "report": report, "seconds": seconds, "at_peak_allocations": peaks, "ops_ns_per_iteration": ops,
        "op_calls_per_iteration": calls,
    }  # fmt: skip


COPY_OPS = ("_to_copy", "copy_", "clone", "contiguous")
"""One family: a cast or copy is `_to_copy` where the model sees it and `copy_`'s kernels on the GPU."""


def op_family(name: str) -> str:
    """An aten op's name as both sides can match it: no namespace, no overload, copies as one."""
    base = name.removeprefix("aten::").split(".")[0]
    return "copy" if base in COPY_OPS else base


def op_rows(profile: dict | None, modelled_ns: dict[str, float] | None, limit: int = 16) -> list[dict]:
    """Device time per iteration by aten op (kernel_profile's own device time of each op) against the
    model's charged time per iteration of the same op, the largest first."""
    if not profile or not profile.get("aten_ops") or not modelled_ns:
        return []
    measured: dict[str, float] = {}
    for op in profile["aten_ops"]:
        family = op_family(op["name"])
        measured[family] = measured.get(family, 0.0) + op["device_us"] / 1e3 / profile["iterations"]
    modelled: dict[str, float] = {}
    for name, ns in modelled_ns.items():
        family = op_family(name)
        modelled[family] = modelled.get(family, 0.0) + ns / 1e6
    families = sorted(
        measured.keys() | modelled.keys(), key=lambda f: -max(measured.get(f, 0.0), modelled.get(f, 0.0))
    )
    return [
        {"op": f, "measured_ms": measured.get(f), "modelled_ms": modelled.get(f)} for f in families[:limit]
    ]


PROFILER_DTYPES = {
    "float": "float32", "c10::BFloat16": "bfloat16", "c10::Half": "float16", "double": "float64",
    "long int": "int64", "int": "int32", "bool": "bool", "unsigned char": "uint8",
}  # fmt: skip
"""torch.profiler's names of dtypes (its C++ type names) -> the names a modelled run records."""


def _tensors(inputs: list[dict]) -> list[dict]:
    """A call's tensor inputs with the modelled run's dtype names; zero-dimensional tensors left out
    (the profiler records them like scalars)."""
    return [{**t, "dtype": PROFILER_DTYPES.get(t["dtype"], t["dtype"])} for t in inputs if t.get("shape")]


def _call_key(op: str, inputs: list[dict]) -> tuple:
    """An op call as both sides can match it: the op's family and its tensor inputs' shapes and dtypes."""
    return op_family(op), tuple((tuple(t["shape"]), t["dtype"]) for t in _tensors(inputs))


def _layout(inputs: list[dict]) -> str:
    return " ".join(
        f"{t['dtype']}{list(t['shape'])}" + ("" if t.get("stride") is None else f"/{list(t['stride'])}")
        for t in _tensors(inputs)
    )


def call_rows(profile: dict | None, modelled_calls: list[dict] | None, limit: int = 20) -> list[dict]:
    """The GPU's largest op calls (op, input shapes, dtypes and strides; its own device time per
    iteration) beside the modelled call of the same op, shapes and dtypes (`modelled_calls`: charged
    ns per iteration): the strides on each side show
    a layout the two ran differently. Copies are left out (a GPU copy_ has a destination the modelled
    _to_copy has not; the family table above holds them)."""
    if not profile or not profile.get("aten_op_calls") or modelled_calls is None:
        return []
    modelled: dict[tuple, dict] = {}
    for call in modelled_calls:
        key = _call_key(call["op"], call["inputs"])
        # also by shapes alone, for a profiler that records no dtypes
        for each in (key, (key[0], tuple((shape, "") for shape, _ in key[1]))):
            entry = modelled.setdefault(each, {"ns": 0, "layouts": []})
            entry["ns"] += call["ns"]
            entry["layouts"].append(_layout(call["inputs"]))
    rows = []
    for call in profile["aten_op_calls"]:
        key = _call_key(call["name"], call["inputs"])
        if key[0] == "copy":
            continue
        match = modelled.get(key)
        rows.append({
            "op": key[0], "measured_layout": _layout(call["inputs"]),
            "measured_ms": call["device_us"] / 1e3 / profile["iterations"],
            "modelled_ms": None if match is None else match["ns"] / 1e6,
            "modelled_layout": None if match is None else "; ".join(sorted(set(match["layouts"]))),
        })  # fmt: skip
        if len(rows) == limit:
            break
    return rows


def memory_rows(job: str, measured: dict | None, modelled: dict | None, limit: int = 12) -> list[dict]:
    """What is live at each peak by site and size: the groups whose counts differ between the GPU's
    history and the modelled one (both --prism-memory-history), else the modelled peak's largest."""
    from prism_megatron.passes.memory import diff_peak_allocations

    if not modelled:
        return []
    if measured:
        # A list cut at its largest groups leaves the rest out: a group past either cut is not absent.
        partial = any(
            side.get("num_groups", len(side["groups"])) > len(side["groups"]) for side in (measured, modelled)
        )
        listed = [{(g["site"], g["size"]) for g in side["groups"]} for side in (measured, modelled)]
        diff = [g for g in diff_peak_allocations(measured, modelled)
                if not partial or (g["site"], g["size"]) in listed[0] & listed[1]]  # fmt: skip
        return [{"job": job, "site": g["site"], "size": g["size"], "measured": g["count_a"], "modelled": g["count_b"],
                 "bytes": g["bytes"], "partial": partial} for g in diff[:limit]]  # fmt: skip
    return [{"job": job, "site": g["site"], "size": g["size"], "measured": None, "modelled": g["count"],
             "bytes": g["bytes"]} for g in modelled["groups"][:limit]]  # fmt: skip


def _row(job: str, quantity: str, unit: str, measured: float, modelled: float, source: str) -> dict:
    return {
        "job": job,
        "quantity": quantity,
        "unit": unit,
        "measured": measured,
        "modelled": modelled,
        "error_pct": 100 * (modelled - measured) / measured,
        "measured_by": source,
    }


def _rank_of(report: dict, rank: int) -> dict:
    """The rank's entry; a modelled run reports its roles' captured ranks, so a data-parallel job's
    one role's (the same work) when the rank itself is not there."""
    ranks = report["ranks"]
    if str(rank) in ranks:
        return ranks[str(rank)]
    if len(ranks) == 1:
        return next(iter(ranks.values()))
    raise KeyError(f"rank {rank} is not in the modelled report (ranks {sorted(ranks)})")


def main_claim_rows(gpu_results: dict, work_dir: str) -> tuple[list[dict], dict]:
    claim = stage_results(gpu_results, "main_claim")
    if claim is None:
        return [], {}
    from benchmarks.gpu.main_claim import REAL_RANK, WORLD_SIZE

    run = modelled_run(claim["job_flags"], WORLD_SIZE, REAL_RANK, os.path.join(work_dir, "main_claim"))
    report, rank = run["report"], _rank_of(run["report"], REAL_RANK)
    kinds = report["modelled"]["time_by_kind_s"]
    job = f"main_claim (rank {REAL_RANK} of W = {WORLD_SIZE}, DP)"
    rows = [
        _row(job, "compute per iteration", "ms", 1e3 * claim["plain_iteration_s"], 1e3 * rank["compute_s"],
             "the rank run alone: median iteration after warm-up"),
        _row(job, "peak memory", "MiB", claim["plain_peak_bytes"] / 2**20, rank["peak_memory_allocated_bytes"] / 2**20,
             "max_memory_allocated over the steps (run without prism)"),
    ]  # fmt: skip
    profile = stage_results(gpu_results, "kernel_profile")
    if profile is not None:
        per_iteration_ms = 1e-3 / profile["iterations"]
        by_family = profile["device_us_by_family"]
        rows += [
            _row(job, "GEMM kernels per iteration", "ms", by_family.get("gemm", 0.0) * per_iteration_ms,
                 1e3 * kinds["gemm"], "kernel_profile: matrix-multiply kernels"),
            _row(job, "other kernels per iteration", "ms", by_family.get("other", 0.0) * per_iteration_ms,
                 1e3 * (kinds["memory"] + kinds["launch"] + kinds["attention"]),
                 "kernel_profile: every other kernel (memory-bound, softmax, copies)"),
        ]  # fmt: skip
    peaks = run["at_peak_allocations"]
    memory = memory_rows(
        job,
        claim.get("plain_at_peak_allocations"),
        peaks.get(str(REAL_RANK)) or next(iter(peaks.values()), None),
    )
    ops = run["ops_ns_per_iteration"]
    by_op = op_rows(profile, ops.get(str(REAL_RANK)) or next(iter(ops.values()), None))
    calls = run["op_calls_per_iteration"]
    by_call = call_rows(profile, calls.get(str(REAL_RANK)) or next(iter(calls.values()), None))
    return rows, {
        "main_claim": {
            "seconds": run["seconds"], "time_by_kind_s": kinds, "at_peak": memory, "by_op": by_op,
            "by_call": by_call,
        }
    }  # fmt: skip


def llama_rows(gpu_results: dict, work_dir: str) -> tuple[list[dict], dict]:
    llama = stage_results(gpu_results, "emulated_llama_rank")
    if llama is None or llama.get("tiny"):
        return [], {}
    run = modelled_run(
        llama["job_flags"], llama["world_size"], llama["real_rank"], os.path.join(work_dir, "llama")
    )
    report, rank = run["report"], _rank_of(run["report"], llama["real_rank"])
    job = f"emulated_llama_rank (rank {llama['real_rank']} of W = {llama['world_size']}, TP1 PP4)"
    rows = [
        _row(job, "compute per iteration", "ms", llama["compute_alone_ms"], 1e3 * rank["compute_s"],
             "the stage run alone (capture pass): median compute after warm-up"),
        _row(job, "peak memory", "MiB", llama["peak_bytes"] / 2**20, rank["peak_memory_allocated_bytes"] / 2**20,
             "max_memory_allocated over the emulated steps"),
        _row(job, "iteration (emulated on the GPU vs modelled)", "ms", 1e3 * llama["iteration_s"],
             1e3 * report["modelled"]["iteration_time_s"], "the emulated rank's median iteration"),
    ]  # fmt: skip
    memory = memory_rows(
        job, llama.get("at_peak_allocations"), run["at_peak_allocations"].get(str(llama["real_rank"]))
    )
    kinds = report["modelled"]["time_by_kind_s"]
    return rows, {"llama": {"seconds": run["seconds"], "time_by_kind_s": kinds, "at_peak": memory}}


def markdown(result: dict) -> str:
    lines = [
        f"# The modelled GPU against a lent GPU's run of the same program ({result['date']})",
        "",
        f"Measured: `{result['gpu_results']}` ({machine_line(result['measured_environment'], EVERY_PACKAGE) if result.get('measured_environment') else result['measured_on']}). "
        f"Modelled: `--prism-device model:{GPU}` on {machine_line(result['environment'], EVERY_PACKAGE)}, the "
        f"same flags with `--attention-backend unfused` and Megatron's fusions off ({', '.join(NO_FUSIONS)}). "
        "Error = modelled / measured - 1. Nothing in the model is fitted to these numbers.",
        "",
        *_version_warning(result),
        "| job | quantity | measured | modelled | error | measured by |",
        "|---|---|---:|---:|---:|---|",
        *(
            f"| {r['job']} | {r['quantity']} | {r['measured']:.1f} {r['unit']} | {r['modelled']:.1f} {r['unit']} | "
            f"{r['error_pct']:+.1f} % | {r['measured_by']} |"
            for r in result["rows"]
        ),
        "",
        "Seconds per modelled run: "
        + ", ".join(f"{name} {run['seconds']:.0f} s" for name, run in result["runs"].items())
        + ".",
        "",
    ]
    for name, run in result["runs"].items():
        if run.get("by_op"):
            lines += [
                f"Device time per iteration by aten op, {name} (the GPU: each op's own kernels, torch.profiler; "
                "modelled: the time the model charged the op, over the captured iterations):",
                "",
                "| op | measured ms | modelled ms | error |",
                "|---|---:|---:|---:|",
                *(
                    f"| {r['op']} | {_ms(r['measured_ms'])} | {_ms(r['modelled_ms'])} | {_error(r)} |"
                    for r in run["by_op"]
                ),
                "",
            ]
        if run.get("by_call"):
            lines += [
                f"The GPU's largest op calls, {name}, beside the modelled call of the same op, shapes and dtypes "
                "(strides after the slash; a layout that differs is a kernel ATen ran otherwise):",
                "",
                "| op | measured: inputs | measured ms | modelled ms | modelled: inputs |",
                "|---|---|---:|---:|---|",
                *(
                    f"| {r['op']} | {r['measured_layout']} | {_ms(r['measured_ms'])} | {_ms(r['modelled_ms'])} | "
                    f"{r['modelled_layout'] or '-'} |"
                    for r in run["by_call"]
                ),
                "",
            ]
        rows = run.get("at_peak") or []
        if not rows:
            continue
        compared = rows[0]["measured"] is not None
        lines += [
            f"Live at the peak, {name}: " + ("the groups whose counts differ (GPU history against modelled"
                                            + ("; a list was cut, so only groups in both lists" if rows[0].get("partial") else "")
                                            + ")" if compared else "the modelled peak's largest groups (the GPU's "
                                            "results hold no history)"),
            "",
            "| site | size | live (GPU) | live (modelled) | MiB |",
            "|---|---:|---:|---:|---:|",
            *(f"| {r['site']} | {r['size']} | {'-' if r['measured'] is None else r['measured']} | {r['modelled']} | "
              f"{r['bytes'] / 2**20:+.1f} |" for r in rows),
            "",
        ]  # fmt: skip
    return "\n".join(lines)


def _version_warning(result: dict) -> list[str]:
    """A line when the two sides ran different megatron-core releases: their programs differ (ops,
    casts, fallbacks), so part of any difference is the program's, not the model's."""
    measured = (result.get("measured_environment") or {}).get("megatron_core")
    modelled = result["environment"].get("megatron_core")
    if not measured or measured == modelled:
        return []
    return [
        f"**Not the same program**: the GPU ran megatron-core {measured}, the modelled runs {modelled}; "
        "run this with an interpreter that has the GPU's release (`make venv-compat`) to compare like with like.",
        "",
    ]


def _ms(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}"


def _error(row: dict) -> str:
    measured, modelled = row["measured_ms"], row["modelled_ms"]
    return "-" if not measured or modelled is None else f"{100 * (modelled - measured) / measured:+.1f} %"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--gpu-results", default=DEFAULT_GPU_RESULTS, help="a GPU run's results (.json)")
    parser.add_argument("--out-dir", default=os.path.join(REPO, "benchmarks", "results"))
    args = parser.parse_args(argv)
    try:
        with open(args.gpu_results) as f:
            gpu_results = json.load(f)
    except (OSError, json.JSONDecodeError) as exc:
        parser.error(f"--gpu-results {args.gpu_results}: {exc}")
    with tempfile.TemporaryDirectory(prefix="prism-against-gpu-") as work_dir:
        rows, runs = main_claim_rows(gpu_results, work_dir)
        more_rows, more_runs = llama_rows(gpu_results, work_dir)
    if not rows and not more_rows:
        parser.error(f"--gpu-results {args.gpu_results}: no main_claim or emulated_llama_rank results in it")
    claim = stage_results(gpu_results, "main_claim") or {}
    result = {
        "date": datetime.date.today().isoformat(),
        "gpu_results": os.path.relpath(args.gpu_results, REPO),
        "measured_on": (claim.get("environment") or {}).get("platform", "the lent GPU"),
        "measured_environment": claim.get("environment") or {},
        "gpu_model": GPU,
        "rows": rows + more_rows,
        "runs": {**runs, **more_runs},
        "environment": environment(),
    }
    stem = os.path.join(args.out_dir, f"{result['date']}-modelled-vs-gpu")
    files.write_json(result, stem + ".json")
    with files.atomic_open(stem + ".md") as f:
        f.write(markdown(result))
    print(markdown(result))
    return 0


if __name__ == "__main__":
    sys.exit(main())
