"""Memory ground truth on one device: a 4-rank job run for real against its emulation with 1 real rank.

Why: the emulation's memory claim is that a real rank allocates exactly what the same rank of the
real job allocates. One device can hold the whole of a tiny job, so the claim is checked exactly:
(a) four real processes, all on the same device (cuda:0, or the CPU), joined over gloo (NCCL refuses
two processes on one GPU), run the built-in GPT entry as a plain run; (b) `prism-megatron emulate`
runs the same job with virtual rank 1 real and ranks 0, 2, 3 virtual.

On CUDA, (a)'s processes talk through the prism backend with every rank real, a pass-through to gloo
sub-communicators: megatron-core's gradient sync issues a coalesced all-reduce, which gloo refuses
for CUDA tensors, and the backend stages it through pinned host memory (never the device's
allocator, so the peak is untouched). On the CPU, (a) is plain gloo. Rank 1's peak, as the entry
records it (`torch.cuda.max_memory_allocated` over the training steps on CUDA, the live-storage peak
on CPU), must be the same number of bytes in both.

The job is TP2 x DP2 (no pipeline: gloo serves CUDA tensors in all-reduce and broadcast, which TP
and DP use, but not in send/recv), without sequence parallelism, so the built-in entry runs it.

Run: ``python -m benchmarks.gpu.memory_ground_truth --out DIR [--device cuda|cpu]``; writes
DIR/memory_ground_truth.json and .md. ``--device cpu`` runs the same flow without a GPU.
"""

from __future__ import annotations

import argparse
import collections
import contextlib
import json
import os
import socket
import statistics
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Callable

from benchmarks.common import environment
from prism_megatron import files

NAME = "memory_ground_truth"
WORLD_SIZE = 4
REAL_RANK = 1
WARMUP_ITERATIONS = 1
JOB_FLAGS = (
    "--num-layers", "2", "--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "128",
    "--vocab-size", "1024", "--micro-batch-size", "2", "--global-batch-size", "8",
    "--hidden-dropout", "0", "--attention-dropout", "0", "--train-iters", "4",
    "--tensor-model-parallel-size", "2",
)  # fmt: skip
"""TP2 x DP2 at W = 4, two micro-batches per step; rank 1 is TP rank 1 of replica 0."""
TIMEOUT_S = {"cuda": {"real": 50.0, "emulate": 60.0}, "cpu": {"real": 300.0, "emulate": 300.0}}
"""Per run: on the GPU both fit run.sh's 120 s step and fail with their output before it kills them;
the CPU (the tests) has two shared cores and no such step."""
REPO = os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


ATTENTION_BACKEND_VARIABLES = ("NVTE_FLASH_ATTN", "NVTE_FUSED_ATTN", "NVTE_UNFUSED_ATTN")
"""megatron-core's model build writes these into its process's environment for the backend it was
given (LanguageModule._set_attention_backend) and asserts, in the next build, that they agree with
its backend: inherited from a parent that built another model (a test process), they refuse a child
whose jobs say `--attention-backend unfused`. A stage's jobs choose their backend by flag alone."""


def child_environment(extra: dict[str, str]) -> dict[str, str]:
    """This environment without the attention-backend variables, the repository importable, and
    `extra` (torchrun's variables)."""
    env = {k: v for k, v in os.environ.items() if k not in ATTENTION_BACKEND_VARIABLES}
    env["PYTHONPATH"] = os.pathsep.join(p for p in (REPO, env.get("PYTHONPATH")) if p)
    env.setdefault("OMP_NUM_THREADS", "1")
    return env | extra


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def run_real_job(flags: list[str], out_dir: str, timeout_s: float) -> None:
    """Every rank a real process on the one device: torchrun's variables, but LOCAL_RANK 0 for all.

    Raises:
        RuntimeError: a process failed or the job outlived `timeout_s` (its output is in the message).
    """
    port = _free_port()
    os.makedirs(out_dir, exist_ok=True)
    with contextlib.ExitStack() as logs:
        processes = []
        for physical_rank in range(WORLD_SIZE):
            env = child_environment(
                {
                    "MASTER_ADDR": "127.0.0.1",
                    "MASTER_PORT": str(port),
                    "RANK": str(physical_rank),
                    "WORLD_SIZE": str(WORLD_SIZE),
                    "LOCAL_RANK": "0",  # one device shared by all: cuda:0
                    "LOCAL_WORLD_SIZE": "1",
                }
            )
            command = [sys.executable, "-m", "benchmarks.gpu.memory_ground_truth", "--gloo-rank", *flags]
            log = logs.enter_context(open(os.path.join(out_dir, f"process-{physical_rank}.log"), "w+"))
            processes.append((subprocess.Popen(command, cwd=REPO, env=env, stdout=log, stderr=log), log))
        failures = _wait_all(processes, timeout_s)
    if failures:
        raise RuntimeError("real run failed:\n" + "\n".join(failures))


def _wait_all(processes: list, timeout_s: float) -> list[str]:
    """Wait for every process (all killed at the deadline); the failures with their output's tail."""
    deadline = time.monotonic() + timeout_s
    failures = []
    for physical_rank, (process, log) in enumerate(processes):
        try:
            rc = process.wait(timeout=max(deadline - time.monotonic(), 1.0))
        except subprocess.TimeoutExpired:
            for other, _ in processes:
                other.kill()
            rc = f"killed after {timeout_s} s"
        if rc != 0:
            log.seek(0)
            failures.append(f"rank {physical_rank}: exit {rc}\n{log.read()[-3000:]}")
    return failures


def gloo_rank_main(flags: list[str]) -> int:
    """One process of the real run: its process group first (the entry keeps a default group it
    finds), then the built-in entry's plain run, which writes rank-<r>.json to --prism-out."""
    import datetime

    import torch.distributed as dist

    from prism_megatron import backend
    from prism_megatron.megatron.entry import pretrain

    if flags[flags.index("--prism-device") + 1] != "cuda":
        dist.init_process_group("gloo")
        return pretrain.main(flags)
    physical_rank = int(os.environ["RANK"])
    store = dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=WORLD_SIZE,
                          is_master=physical_rank == 0, timeout=datetime.timedelta(seconds=60))  # fmt: skip
    backend.activate(world_size=WORLD_SIZE, virtual_rank=physical_rank, real_ranks=list(range(WORLD_SIZE)),
                     real_store=dist.PrefixStore("prism/", store), device="cuda", timeout_s=60.0)  # fmt: skip
    try:
        return pretrain.main(flags)
    finally:
        backend.deactivate()


def run_emulation(flags: list[str], timeout_s: float) -> dict:
    """`prism-megatron emulate` as a user types it; returns the run folder's report.json."""
    command = [sys.executable, "-m", "prism_megatron.cli", "emulate", "--", *flags]
    out_dir = flags[flags.index("--prism-out") + 1]
    returncode, tail = run_streamed(command, timeout_s)
    if returncode != 0:
        raise RuntimeError(f"{' '.join(command[2:5])} ... failed (exit {returncode}):\n{tail[-4000:]}")
    with open(os.path.join(out_dir, files.REPORT_JSON)) as f:
        return json.load(f)


def run_streamed(command: list[str], timeout_s: float) -> tuple[int, str]:
    """Run `command`, its output (stdout and stderr) passed through line by line as it comes, so that
    a step killed by run.sh's limit still shows how far the command got; at `timeout_s` the command
    gets SIGTERM (its own clean-up), SIGKILL 10 s later. Returns the exit status and the output's tail."""
    tail: collections.deque[str] = collections.deque(maxlen=200)
    with subprocess.Popen(
        command,
        cwd=REPO,
        env=child_environment({}),
        stdout=subprocess.PIPE,
        stderr=subprocess.STDOUT,
        text=True,
    ) as child:
        killed = threading.Event()
        timer = threading.Timer(timeout_s, _terminate, (child, killed))
        timer.start()
        try:
            for line in child.stdout:
                print(line, end="", flush=True)
                tail.append(line)
            returncode = child.wait()
        finally:
            timer.cancel()
    if killed.is_set():
        tail.append(f"(killed at the stage's limit for the command, {timeout_s:.0f} s)\n")
    return returncode, "".join(tail)


def _terminate(child: subprocess.Popen, killed: threading.Event) -> None:
    killed.set()
    child.terminate()
    try:
        child.wait(timeout=10)
    except subprocess.TimeoutExpired:
        child.kill()


def read_rank(out_dir: str, virtual_rank: int) -> dict:
    with open(files.results_path(out_dir, virtual_rank)) as f:
        return json.load(f)


def median_iteration_s(rank_result: dict, warmup: int = WARMUP_ITERATIONS) -> float:
    """Median step time of a rank's iterations after the warm-up ones."""
    return statistics.median(it["time_s"] for it in rank_result["iterations"][warmup:])


def requested_peak_bytes(memory: dict) -> int | None:
    """The peak of the bytes the program asked for: the CUDA allocator's statistic, or on the CPU the
    live-storage peak (it counts storage sizes, which are what was asked for)."""
    if memory.get("method") == "live-storage":
        return memory["peak_bytes"]
    return memory.get("requested_peak_bytes")


def peak_groups(memory: dict, limit: int = 200) -> dict | None:
    """A rank's allocations live at its history's peak (--prism-memory-history), the largest `limit`
    groups (site and size), for a results file; None without a history."""
    peak = memory.get("at_peak_allocations")
    if not peak:
        return None
    return {
        **{k: v for k, v in peak.items() if k not in ("groups", "history")},
        "groups": peak["groups"][:limit],
    }


def peak_difference(real: dict, emulated: dict, limit: int = 20) -> dict | None:
    """With both runs' allocator histories (--prism-memory-history): what each held at its history's
    peak, and the (site, size) groups whose counts differ, largest first (None without histories)."""
    from prism_megatron.passes.memory import diff_peak_allocations

    a, b = real.get("at_peak_allocations"), emulated.get("at_peak_allocations")
    if not a or not b:
        return None
    return {
        "real_history_peak_bytes": a["peak_bytes"],
        "emulated_history_peak_bytes": b["peak_bytes"],
        "cut": a["cut"] or b["cut"],
        "groups": diff_peak_allocations(a, b)[:limit],
    }


def measure(device: str, work_dir: str) -> dict:
    # On CUDA both runs record the allocator's history: a difference names the lines that make it.
    job = [*JOB_FLAGS, "--prism-device", device, *(["--prism-memory-history"] if device == "cuda" else [])]
    real_dir, emulated_dir = os.path.join(work_dir, "real"), os.path.join(work_dir, "emulated")
    begin = time.monotonic()
    run_real_job([*job, "--prism-out", real_dir], real_dir, TIMEOUT_S[device]["real"])
    real_s = time.monotonic() - begin
    begin = time.monotonic()
    report = run_emulation(
        [*job, "--prism-emulate", "--prism-world-size", str(WORLD_SIZE), "--prism-ranks", str(REAL_RANK),
         "--prism-out", emulated_dir],
        timeout_s=TIMEOUT_S[device]["emulate"],
    )  # fmt: skip
    emulated_s = time.monotonic() - begin
    real, emulated = read_rank(real_dir, REAL_RANK), read_rank(emulated_dir, REAL_RANK)
    real_peak, emulated_peak = real["memory"]["peak_bytes"], emulated["memory"]["peak_bytes"]
    return {
        "device": device,
        "job_flags": list(JOB_FLAGS),
        "world_size": WORLD_SIZE,
        "real_rank": REAL_RANK,
        "memory_method": {"real": real["memory"]["method"], "emulated": emulated["memory"]["method"]},
        "real_peak_bytes": real_peak,
        "emulated_peak_bytes": emulated_peak,
        "memory_diff_bytes": emulated_peak - real_peak,
        "real_requested_peak_bytes": requested_peak_bytes(real["memory"]),
        "emulated_requested_peak_bytes": requested_peak_bytes(emulated["memory"]),
        "real_reserved_peak_bytes": real["memory"].get("reserved_peak_bytes"),
        "emulated_reserved_peak_bytes": emulated["memory"].get("reserved_peak_bytes"),
        "peak_difference": peak_difference(real["memory"], emulated["memory"]),
        "report_peak_bytes": report["ranks"][str(REAL_RANK)]["peak_memory_allocated_bytes"],
        "real_memory_at_peak_bytes": real["memory"]["at_peak_bytes"],
        "emulated_memory_at_peak_bytes": emulated["memory"]["at_peak_bytes"],
        "real_iteration_s": median_iteration_s(real),
        "emulated_iteration_s": median_iteration_s(emulated),
        "report_iteration_time_s": report["iteration_time_s"],
        "simulated_iteration_time_s": report["simulated_iteration_time_s"],
        "warmup_iterations": WARMUP_ITERATIONS,
        "wall_s": {"real_run": real_s, "emulate_command": emulated_s},
        "environment": environment(),
    }


def markdown(result: dict) -> str:
    verdict = "exact" if result["memory_diff_bytes"] == 0 else "DIFFERENT"
    return "\n".join(
        [
            f"## Memory ground truth ({result['device']})",
            "",
            f"TP2 x DP2 built-in GPT, W = {result['world_size']}: {result['world_size']} real processes on "
            f"one device (gloo) against `prism-megatron emulate` with rank {result['real_rank']} real. "
            f"Peak: {result['memory_method']['real']}.",
            "",
            "| run | peak bytes | median iteration (ms) |",
            "|---|---:|---:|",
            f"| real ({result['world_size']} processes) | {result['real_peak_bytes']} | "
            f"{result['real_iteration_s'] * 1e3:.2f} |",
            f"| emulated (1 real) | {result['emulated_peak_bytes']} | {result['emulated_iteration_s'] * 1e3:.2f} |",
            "",
            f"Difference {result['memory_diff_bytes']} B (**{verdict}**); simulated iteration "
            f"{result['simulated_iteration_time_s'] * 1e3:.2f} ms.",
            "",
            f"Requested at the peak (the program's bytes, before the allocator rounds them to its blocks): "
            f"real {result.get('real_requested_peak_bytes')} B, emulated {result.get('emulated_requested_peak_bytes')} B.",
            "",
            *difference_lines(result.get("peak_difference"), "real"),
        ]
    )


def difference_lines(difference: dict | None, reference: str) -> list[str]:
    """The allocations live at one run's peak and not the other's (`peak_difference`), as markdown;
    `reference` names the run the emulation is held against."""
    if difference is None:
        return []
    lines = [
        f"Allocator histories: peak {difference['real_history_peak_bytes']} B {reference}, "
        f"{difference['emulated_history_peak_bytes']} B emulated{' (a history was cut)' if difference['cut'] else ''}.",
        "",
    ]
    if not difference["groups"]:
        return [*lines, "The same allocations are live at both peaks.", ""]
    lines += [f"| site | size | live ({reference}) | live (emulated) | bytes |", "|---|---:|---:|---:|---:|"]
    lines += [
        f"| {g['site']} | {g['size']} | {g['count_a']} | {g['count_b']} | {g['bytes']:+d} |"
        for g in difference["groups"]
    ]
    return [*lines, ""]


def run_on_device(
    name: str,
    description: str,
    measure_on: Callable[[argparse.Namespace, str], dict],
    render: Callable[[dict], str],
    argv: list[str] | None,
    add_options: Callable[[argparse.ArgumentParser], None] = lambda parser: None,
) -> dict | None:
    """`--device cuda` (default): `run_stage`, with its GPU check; `--device cpu`: the same flow here.

    `measure_on(options, work_dir)` gets the stage's own options and a scratch folder for run folders.
    """
    from benchmarks.gpu.stage import run_stage

    parser = argparse.ArgumentParser(description=description, add_help=False)
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where the ranks run")
    add_options(parser)
    options, rest = parser.parse_known_args(argv)
    with tempfile.TemporaryDirectory(prefix=f"prism-{name}-") as work_dir:
        measure_here = lambda: measure_on(options, work_dir)  # noqa: E731
        if options.device == "cuda":
            return run_stage(name, description, measure_here, render, rest)
        out_parser = argparse.ArgumentParser(description=description)
        out_parser.add_argument("--out", required=True, help=f"directory for {name}.json and .md")
        out = out_parser.parse_args(rest).out
        result = measure_here()
    os.makedirs(out, exist_ok=True)
    with open(os.path.join(out, f"{name}.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(out, f"{name}.md"), "w") as f:
        f.write(render(result))
    return result


def main(argv: list[str] | None = None) -> int:
    from benchmarks.gpu.stage import printed

    argv = list(sys.argv[1:] if argv is None else argv)
    if argv[:1] == ["--gloo-rank"]:
        return gloo_rank_main(argv[1:])
    result = run_on_device(
        NAME, __doc__.splitlines()[0], lambda options, work: measure(options.device, work), markdown, argv
    )
    return printed(result, markdown)


if __name__ == "__main__":
    sys.exit(main())
