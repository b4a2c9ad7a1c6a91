"""Run real ranks of a large Megatron job here, on CPU or GPU, with every other rank virtual.

`prism-megatron emulate [--nproc-per-node N] [--script PATH] -- <megatron flags> --prism-emulate
--prism-world-size W --prism-ranks SPEC --prism-device cpu --prism-out DIR` starts N processes with
torch's own launcher (`torch.distributed.run`), each running `python -m prism_megatron.launch SCRIPT`
with the flags after `--`. Without `--script` the built-in megatron-core GPT entry runs; with
`--script $MEGATRON_LM_DIR/pretrain_gpt.py` Megatron-LM's own script runs unmodified. N defaults to the
number of ranks `--prism-ranks` selects (one process per real rank).
"""

from __future__ import annotations

import argparse
import subprocess
import sys

from prism_megatron.cli import CommandLineError

NAME = "emulate"
HELP = "run real ranks of a large Megatron job here; every other rank is virtual"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.add_argument(
        "--nproc-per-node",
        type=int,
        default=None,
        help="real processes to start (default: one per rank that --prism-ranks selects)",
    )
    parser.add_argument(
        "--script",
        default="builtin",
        help="Megatron-LM training script to run unmodified, e.g. $MEGATRON_LM_DIR/pretrain_gpt.py "
        "(default: the built-in megatron-core GPT entry)",
    )
    parser.add_argument(
        "megatron_args", nargs=argparse.REMAINDER, help="-- then Megatron and --prism-* flags"
    )


def _parallel_flags(megatron_args: list[str]) -> argparse.Namespace:
    """The target job's parallel flags among the Megatron flags, as Megatron-LM names them."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    for flag, default in (
        ("--tensor-model-parallel-size", 1),
        ("--pipeline-model-parallel-size", 1),
        ("--context-parallel-size", 1),
        ("--expert-model-parallel-size", 1),
        ("--expert-tensor-parallel-size", None),
        ("--num-layers", None),
        ("--num-layers-per-virtual-pipeline-stage", None),
        ("--virtual-pipeline-model-parallel-size", None),
    ):
        parser.add_argument(flag, type=int, default=default)
    parser.add_argument("--use-tp-pp-dp-mapping", action="store_true")
    parser.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    return parser.parse_known_args(megatron_args)[0]


def default_nproc(megatron_args: list[str]) -> int:
    """One process per real rank: the number of ranks --prism-ranks selects (1 without emulation)."""
    from prism_megatron.config import parse_prism_flags
    from prism_megatron.topology import Layout, select_ranks, virtual_pipeline_size

    config = parse_prism_flags(megatron_args)
    if not config.emulation.emulate:
        return 1
    flags = _parallel_flags(megatron_args)
    vpp = virtual_pipeline_size(
        pp=flags.pipeline_model_parallel_size,
        num_layers=flags.num_layers,
        num_layers_per_virtual_stage=flags.num_layers_per_virtual_pipeline_stage,
        vpp=flags.virtual_pipeline_model_parallel_size,
    )
    layout = Layout(
        world_size=config.emulation.world_size,
        tp=flags.tensor_model_parallel_size,
        pp=flags.pipeline_model_parallel_size,
        cp=flags.context_parallel_size,
        ep=flags.expert_model_parallel_size,
        etp=flags.expert_tensor_parallel_size,
        vpp=vpp,
        order="tp-cp-ep-pp-dp" if flags.use_tp_pp_dp_mapping else "tp-cp-ep-dp-pp",
        untie_embeddings=flags.untie_embeddings_and_output_weights,
    )
    spec = config.emulation.ranks
    return len(layout.default_slice() if spec is None else select_ranks(layout, spec))


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
    nproc = args.nproc_per_node if args.nproc_per_node is not None else default_nproc(megatron_args)
    if nproc < 1:
        raise CommandLineError(f"--nproc-per-node must be >= 1, got {nproc}")
    return subprocess.call(launcher_command(nproc, args.script, megatron_args))
