"""Emulate a GPT job on 8192 GPUs (TP8 PP8 DP128) with two real ranks on this machine's CPU.

The demo runs what `prism-megatron emulate` runs, on a job small enough per rank for a CPU: the
topology and slice of the 8192-rank job first, then the capture in passes of two processes (its ten
roles run three programs: the first stage, the six middle stages, whose 1F1B order the graph derives
from one capture, and the last; the spare place of the last pass confirms the middle stages with a
second one), the simulation of the whole job, and the emulation of virtual ranks 0 and 1024 (the
first two pipeline stages, so real pipeline traffic flows between them) while the replay engine
plays the other 8190. It ends with the summary: emulated against simulated iteration time, how many
roles were captured and how long that took, the per-role breakdown, peak memory per real rank and
where the outputs are.
"""

from __future__ import annotations

import argparse

from prism_megatron.commands.topology import render
from prism_megatron.topology import Layout

NAME = "demo"
HELP = "emulate an 8192-GPU GPT job (TP8 PP8 DP128) with two real ranks on this CPU"

DEMO_JOB = dict(world_size=8192, tp=8, pp=8)
"""The demo job: a GPT run on 8192 GPUs, tensor-parallel 8, pipeline-parallel 8."""
REAL_RANKS = "pp=0,1;tp=0;dp=0"
"""Virtual ranks 0 and 1024: TP rank 0 of DP replica 0 on the first two pipeline stages."""

MODEL_FLAGS = (
    "--num-layers", "8", "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "64",
    "--vocab-size", "1000", "--micro-batch-size", "1", "--global-batch-size", "512",
    "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "8",
    "--hidden-dropout", "0", "--attention-dropout", "0", "--log-interval", "1000",
)  # fmt: skip
"""A GPT small enough per rank for a CPU (hidden 64, one layer per stage); 4 micro-batches per
data-parallel replica (global batch 512 = 1 x 128 x 4)."""

TRAIN_ITERS = 15
"""Emulated iterations: one of warm-up, then 14 each compared with the schedule it ran. The closed
loop simulates each schedule from the last three iterations, and each is also compared with that
schedule's expected time, replayed with those three (`ClosedLoop.expected_ns`): the first three
schedules have fewer behind them (the first none), so a run of six compared two iterations with a
full window, this one eleven (about 1.5 s longer on a 2-core machine)."""

INTRO = """\
prism-megatron emulates a production-scale Megatron-LM job on a few devices. The ranks you care
about run the real training program; a replay engine speaks for every other rank of the job.

Target job: GPT on 8192 ranks, TP 8 x PP 8 (DP 128). Ranks that behave alike share a role, and
roles that run the same program share one capture: the slice runs one real rank per such class and
expands what it records into the whole job.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.splitlines()[0]
    parser.add_argument("--out", default=None, help="run folder (default: a new prism-out/<YYYYmmdd-HHMMSS>)")
    parser.add_argument("--overwrite", action="store_true", help="replace an existing run folder")
    parser.add_argument(
        "--train-iters",
        type=int,
        default=TRAIN_ITERS,
        help=f"emulated iterations, the first warm-up (default: {TRAIN_ITERS})",
    )
    parser.add_argument("--capture-iters", type=int, default=4, help="capture iterations (default: 4)")


def demo_flags(args: argparse.Namespace) -> list[str]:
    """The Megatron and --prism-* flags of the demo run."""
    flags = [
        *MODEL_FLAGS,
        "--train-iters", str(args.train_iters),
        "--prism-emulate", "--prism-world-size", str(DEMO_JOB["world_size"]), "--prism-device", "cpu",
        "--prism-ranks", REAL_RANKS, "--prism-capture-iters", str(args.capture_iters),
    ]  # fmt: skip
    if args.out is not None:
        flags += ["--prism-out", args.out]
    if args.overwrite:
        flags.append("--prism-overwrite")
    return flags


def run(args: argparse.Namespace) -> int:
    from prism_megatron.emulation import Progress, format_summary, plan_run, run_plan

    layout = Layout(**DEMO_JOB)
    plan = plan_run(demo_flags(args))  # checks the flags and the run folder first
    print(INTRO)
    print(render(layout, []))
    print(
        f"real ranks: {', '.join(map(str, plan.real_ranks))} of {layout.world_size} "
        f"({len(plan.real_ranks) / layout.world_size:.3%}); the other {layout.world_size - len(plan.real_ranks)} "
        "are virtual",
        flush=True,
    )
    programs = "; ".join(" ".join(c.members) for c in plan.role_classes)
    print(
        f"capture: ranks {', '.join(map(str, plan.slice_ranks))} for the {len(layout.roles())} roles, "
        f"which run {len(plan.role_classes)} programs ({programs})\n",
        flush=True,
    )
    outcome = run_plan(plan, Progress())
    print()
    print(format_summary(outcome))
    return 0 if outcome.ok else 1
