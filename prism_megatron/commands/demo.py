"""Show what prism-megatron does, on a production-size GPT job (interim: the topology view).

Until the emulation pipeline is complete, the demo shows its first step on the default demo job:
an 8192-rank GPT run with TP 8 and PP 8 (DP 128), its roles, and the slice of real ranks that
stands for all 8192.
"""

from __future__ import annotations

import argparse

from prism_megatron.commands.topology import render
from prism_megatron.topology import Layout

NAME = "demo"
HELP = "show the topology and slice of an 8192-rank GPT job (TP8 PP8 DP128)"

DEMO_JOB = dict(world_size=8192, tp=8, pp=8)
"""The default demo job: a GPT run on 8192 GPUs, tensor-parallel 8, pipeline-parallel 8."""

INTRO = """\
prism-megatron emulates a production-scale Megatron-LM job on a few devices. The ranks you care
about run the real training program; a replay engine speaks for every other rank of the job.

Target job: GPT on 8192 ranks, TP 8 x PP 8 (DP 128). Ranks that behave alike share a role; the
slice runs one real rank per role and expands what it records into the whole job. Below: the roles,
the slice, and for each slice rank the members of every group megatron-core would build for it.
"""


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = __doc__.splitlines()[0]


def run(args: argparse.Namespace) -> int:
    layout = Layout(**DEMO_JOB)
    print(INTRO)
    print(render(layout, layout.default_slice()))
    print(
        f"\n{len(layout.default_slice())} real ranks of {layout.world_size} "
        f"({len(layout.default_slice()) / layout.world_size:.2%}) cover every role of this job."
    )
    return 0
