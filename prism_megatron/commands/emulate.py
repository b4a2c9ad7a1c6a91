"""Run real ranks of a large Megatron job here, on CPU or GPU, with every other rank virtual.

`prism-megatron emulate [--nproc-per-node N] [--script PATH] -- <megatron flags> --prism-emulate
--prism-world-size W --prism-ranks SPEC --prism-device cpu [--prism-out DIR]` runs both passes
(`prism_megatron.emulation`): the slice is captured in passes of N processes (or `--prism-graph`
reused), the execution graph is simulated, then the real ranks `--prism-ranks` selects run the
program while the replay engine serves every virtual peer, and the report is written to the run
folder. Each launch is torch's own launcher (`torch.distributed.run`) running
`python -m prism_megatron.launch SCRIPT` with the flags after `--`. Without `--script` the built-in
megatron-core GPT entry runs; with `--script $MEGATRON_LM_DIR/pretrain_gpt.py` Megatron-LM's own
script runs unmodified. N defaults to the number of ranks `--prism-ranks` selects.

Without `--prism-emulate` (a plain run) or with an explicit `--prism-phase`, the flags go to one
launch unchanged.

Ctrl-C, SIGTERM or SIGHUP stop every process the command started within seconds; report.json then
says "interrupted" and the command exits 128 + the signal's number.
"""

from __future__ import annotations

import argparse
import sys

from prism_megatron.commands import CommandLineError
from prism_megatron.config import parse_prism_flags

NAME = "emulate"
HELP = "run real ranks of a large Megatron job here; every other rank is virtual"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        help="real processes at once on this machine: the size of each capture pass (default: one per "
        "rank that --prism-ranks selects; the emulation always runs one per real rank)",
    )
    parser.add_argument(
        "--script",
        default="builtin",
        help="Megatron-LM training script to run unmodified, e.g. $MEGATRON_LM_DIR/pretrain_gpt.py "
        "(default: the built-in megatron-core GPT entry)",
    )
    parser.add_argument(
        "--report-only",
        action="store_true",
        help="only write the report of the run folder (--prism-out) whose passes you launched yourself "
        "(several machines: see prism_megatron.emulation)",
    )
    parser.add_argument(
        "megatron_args", nargs=argparse.REMAINDER, help="-- then Megatron and --prism-* flags"
    )


def default_nproc(megatron_args: list[str], script: str = "builtin") -> int:
    """One process per real rank: the number of ranks --prism-ranks selects (1 without emulation)."""
    from prism_megatron.emulation.plan import megatron_flags
    from prism_megatron.megatron.job import target

    config = parse_prism_flags(megatron_args)
    if not config.emulation.emulate:
        return 1
    job = target.derive(megatron_flags(megatron_args, script), world_size=config.emulation.world_size)
    return len(target.select_real_ranks(job.layout(), config.emulation.ranks))


def launcher_command(nproc: int, script: str, megatron_args: list[str]) -> list[str]:
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "-m", "prism_megatron.launch", script, *megatron_args,
    ]  # fmt: skip


def run(args: argparse.Namespace) -> int:
    megatron_args = list(args.megatron_args)
    if megatron_args[:1] == ["--"]:
        megatron_args = megatron_args[1:]
    if not megatron_args:
        raise CommandLineError("give the Megatron flags after --, e.g. -- --num-layers 8 ... --prism-emulate")
    if args.nproc_per_node is not None and args.nproc_per_node < 1:
        raise CommandLineError(f"--nproc-per-node must be >= 1, got {args.nproc_per_node}")
    config = parse_prism_flags(megatron_args)
    if config.emulation.emulate:
        from prism_megatron.patches import catalog

        catalog.check_installed(allow_untested=config.patches.allow_untested_megatron)
    from prism_megatron.emulation import processes

    with processes.stop_signals():
        try:
            if not config.emulation.emulate or config.emulation.phase != "auto":
                nproc = (
                    args.nproc_per_node
                    if args.nproc_per_node is not None
                    else default_nproc(megatron_args, args.script)
                )
                return processes.wait(processes.start(launcher_command(nproc, args.script, megatron_args)))
            if args.report_only:
                return report_only(megatron_args, script=args.script)
            return run_both_passes(megatron_args, script=args.script, nproc=args.nproc_per_node)
        except KeyboardInterrupt as exc:
            stop = processes.as_stop(exc)
            print(f"prism-megatron emulate: stopped by {stop.signal_name}; every process it started ended",
                  file=sys.stderr)  # fmt: skip
            return stop.exit_status


def check_builtin_flags(megatron_args: list[str], world_size: int) -> argparse.Namespace:
    """The built-in entry's own checks, as one ValueError line (its parser would print its usage);
    returns the entry's parsed args."""
    from prism_megatron.megatron.entry import arguments as pretrain_args
    from prism_megatron.megatron.entry import model

    args = pretrain_args.parse(megatron_args)  # the entry's own parser and derivations
    pretrain_args.derive_world(args, world_size)
    pretrain_args.check_local_spec(args)
    model.transformer_config(args)  # megatron-core's own checks of the model's configuration
    return args


def report_only(megatron_args: list[str], *, script: str) -> int:
    from prism_megatron.config import parse_prism_flags
    from prism_megatron.emulation import Progress, format_summary, plan_run
    from prism_megatron.emulation.driver import report_existing

    if parse_prism_flags(list(megatron_args)).output.out is None:  # either spelling, --prism-out=DIR too
        raise CommandLineError("--report-only needs --prism-out: the run folder the passes wrote to")
    plan = plan_run(megatron_args, script=script, existing_run=True)
    outcome = report_existing(plan, Progress())
    print(format_summary(outcome))
    return 0 if outcome.ok else 1


def checked_plan(megatron_args: list[str], *, script: str, nproc: int | None):
    """Every check `emulate` makes before any process starts (the installed megatron-core, the plan,
    the built-in entry's own flags), and the plan; launch/prism-chain.sh calls this too, so a chain
    of jobs is refused for what `emulate` would refuse. Raises ValueError naming the flag."""
    from prism_megatron.emulation import plan_run
    from prism_megatron.patches import catalog

    config = parse_prism_flags(list(megatron_args))
    if config.emulation.emulate:
        catalog.check_installed(allow_untested=config.patches.allow_untested_megatron)
    plan = plan_run(megatron_args, script=script, nproc=nproc)
    if script == "builtin":  # its whole flag set is known here: check it before any process starts
        args = check_builtin_flags(megatron_args, plan.layout.world_size)
        if args.tp_comm_overlap and plan.config.emulation.modelled_gpu is None:
            from prism_megatron.megatron.entry.arguments import TP_COMM_OVERLAP_NOTE

            print(TP_COMM_OVERLAP_NOTE, file=sys.stderr, flush=True)
    return plan


def run_both_passes(megatron_args: list[str], *, script: str, nproc: int | None) -> int:
    """Plan (user mistakes: ValueError before any process starts), run, print the summary."""
    from prism_megatron.emulation import Progress, format_summary, run_plan

    plan = checked_plan(megatron_args, script=script, nproc=nproc)
    try:
        outcome = run_plan(plan, Progress())
    except KeyboardInterrupt:
        print(f"prism-megatron emulate: interrupted; {plan.out_dir}/report.json says so", file=sys.stderr)
        raise
    print(format_summary(outcome))
    return 0 if outcome.ok else 1
