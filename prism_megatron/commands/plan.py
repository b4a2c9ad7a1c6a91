"""Plan the memory of selected ranks of a full-size job on the meta device (no GPU needed)."""

from __future__ import annotations

import argparse
import sys
import warnings

from prism_megatron import files

NAME = "plan"
HELP = "plan the memory of selected ranks of a full-size job on the meta device (no GPU needed)"

_USAGE_EXAMPLE = (
    "prism-megatron plan launch/configs/llama3-405b-16384gpus.args --ranks 'pp=0,15;tp=0;dp=0'  "
    "or  prism-megatron plan --ranks 0 --num-layers 32 ... --prism-world-size 64"
)


def _own_options() -> argparse.ArgumentParser:
    """The command's own options; they may appear anywhere among the Megatron-LM flags."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    parser.add_argument(
        "--ranks",
        "--prism-ranks",
        dest="ranks",
        default="slice",
        help="virtual ranks to plan, in the --prism-ranks language (slice, all, 0,8191, 'pp=0,15;tp=0'); "
        "default: slice (one rank per role)",
    )
    parser.add_argument(
        "--json", dest="json_path", default=None, help="also write the plan as JSON to this path"
    )
    return parser


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Declare the options, and keep every other word, in order, as CONFIG_OR_FLAGS.

    Megatron-LM flags are not options of this command (there are hundreds, and `megatron.job.flags` owns
    them), so the subcommand's `parse_known_args` is wrapped on this parser instance: it takes out
    `--ranks`/`--json` and hands everything else, untouched and in order, to the plan.
    """
    for action in _own_options()._actions:
        parser._add_action(action)
    parser.add_argument(
        "config_or_flags",
        nargs="*",
        metavar="CONFIG_OR_FLAGS",
        help="a configuration file (launch/configs/*.args) and/or Megatron-LM flags with --prism-world-size",
    )
    parser.epilog = f"example: {_USAGE_EXAMPLE}"
    original = parser.parse_known_args

    def parse_known_args(args=None, namespace=None):
        words = list(sys.argv[1:] if args is None else args)
        if "-h" in words or "--help" in words:
            return original(words, namespace)
        own, rest = _own_options().parse_known_args(words)
        namespace, extras = original(
            ["--ranks", own.ranks] + (["--json", own.json_path] if own.json_path else []), namespace
        )
        namespace.config_or_flags = rest
        return namespace, extras

    parser.parse_known_args = parse_known_args


def _megatron_argv(words: list[str]) -> list[str]:
    """Expand a leading configuration file into its flags; later flags override it."""
    from prism_megatron.megatron.job.configs import is_config_path, read_config

    if words and is_config_path(words[0]):
        return read_config(words[0]) + words[1:]
    if words and not words[0].startswith("-"):
        raise ValueError(f"CONFIG_OR_FLAGS: {words[0]!r} is not a file; give a configuration file or flags")
    return words


def run(args: argparse.Namespace) -> int:
    from prism_megatron.commands import CommandLineError

    if args.json_path:
        files.check_output(args.json_path, "--json")
    argv = _megatron_argv(args.config_or_flags)
    if not argv:
        raise CommandLineError(f"plan: give a configuration file or Megatron-LM flags, e.g. {_USAGE_EXAMPLE}")

    # megatron-core warns at import that Transformer Engine and apex are missing and at config time
    # about deprecated CUDA-graph scopes; the plan builds on the meta device and needs neither.
    warnings.filterwarnings("ignore", category=UserWarning, module=r"megatron\.core\..*")
    from prism_megatron.megatron.job.job import job_from_flags
    from prism_megatron.megatron.plan.rank_plan import plan_ranks
    from prism_megatron.megatron.plan.report import format_text, job_summary, rank_dict
    from prism_megatron.topology import select_ranks

    job = job_from_flags(argv)
    virtual_ranks = select_ranks(job.target.layout(), args.ranks)
    print(
        f"planning {len(virtual_ranks)} rank(s) of a {job.world_size}-GPU job ...",
        file=sys.stderr,
        flush=True,
    )
    plans = plan_ranks(job, virtual_ranks)
    print(format_text(job, plans))
    if args.json_path:
        payload = {"job": job_summary(job), "argv": list(job.argv), "ranks": [rank_dict(p) for p in plans]}
        files.write_json(payload, args.json_path, indent=1)
    return 0
