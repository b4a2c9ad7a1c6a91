"""Show the topology of a target job: coordinates, groups and roles of selected ranks, and the slice.

Takes Megatron-LM's own flag names so a job's command line can be pasted in. Imports neither torch
nor Megatron, so it answers at once even for a 131072-rank job.
"""

from __future__ import annotations

import argparse
import json

from prism_megatron.topology import (
    GROUP_KINDS,
    Layout,
    Role,
    format_ranks,
    select_ranks,
    virtual_pipeline_size,
)

NAME = "topology"
HELP = "show coordinates, Megatron groups and roles of selected ranks of a target job, and its slice"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Compute, without any process, what megatron-core's initialize_model_parallel gives the "
        "selected virtual ranks of the target job: coordinates, the members of every group, their "
        "roles, and the default slice (one real rank per role)."
    )
    parser.add_argument("--world-size", type=int, required=True, help="ranks in the target job")
    parser.add_argument("--tensor-model-parallel-size", type=int, default=1, metavar="TP")
    parser.add_argument("--pipeline-model-parallel-size", type=int, default=1, metavar="PP")
    parser.add_argument("--context-parallel-size", type=int, default=1, metavar="CP")
    parser.add_argument("--expert-model-parallel-size", type=int, default=1, metavar="EP")
    parser.add_argument(
        "--expert-tensor-parallel-size", type=int, default=None, metavar="ETP", help="default: TP"
    )
    parser.add_argument(
        "--virtual-pipeline-model-parallel-size",
        "--num-virtual-stages-per-pipeline-rank",
        dest="virtual_pipeline_model_parallel_size",
        type=int,
        default=None,
        metavar="VPP",
        help="model chunks per pipeline rank (interleaved schedule)",
    )
    parser.add_argument(
        "--num-layers-per-virtual-pipeline-stage",
        type=int,
        default=None,
        metavar="N",
        help="derive VPP from the layer count, as Megatron-LM does (needs --num-layers)",
    )
    parser.add_argument("--num-layers", type=int, default=None)
    parser.add_argument(
        "--use-tp-pp-dp-mapping",
        action="store_true",
        help="rank order tp-cp-ep-pp-dp instead of tp-cp-ep-dp-pp",
    )
    parser.add_argument(
        "--untie-embeddings-and-output-weights",
        action="store_true",
        help="the last stage is then not in the embedding group",
    )
    parser.add_argument(
        "--ranks",
        default="slice",
        metavar="SPEC",
        help="ranks to show: slice (default), all, 0,7168, 0-7, or filters like 'pp=0,7;tp=0;dp=0'",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def layout_from_args(args: argparse.Namespace) -> Layout:
    """The target job's layout from Megatron-LM-named flags; ValueError names the offending flag."""
    vpp = virtual_pipeline_size(
        pp=args.pipeline_model_parallel_size,
        num_layers=args.num_layers,
        num_layers_per_virtual_stage=args.num_layers_per_virtual_pipeline_stage,
        vpp=args.virtual_pipeline_model_parallel_size,
    )
    return Layout(
        world_size=args.world_size,
        tp=args.tensor_model_parallel_size,
        pp=args.pipeline_model_parallel_size,
        cp=args.context_parallel_size,
        ep=args.expert_model_parallel_size,
        etp=args.expert_tensor_parallel_size,
        vpp=vpp,
        order="tp-cp-ep-pp-dp" if args.use_tp_pp_dp_mapping else "tp-cp-ep-dp-pp",
        untie_embeddings=args.untie_embeddings_and_output_weights,
    )


def run(args: argparse.Namespace) -> int:
    layout = layout_from_args(args)
    virtual_ranks = select_ranks(layout, args.ranks)
    if args.json:
        print(json.dumps(describe(layout, virtual_ranks), indent=1))
    else:
        print(render(layout, virtual_ranks))
    return 0


def _duties(layout: Layout, role: Role) -> str:
    duties = []
    if role.first_stage:
        duties.append("embedding")
    if role.last_stage:
        duties.append("output layer and loss")
    if role.data_source:
        duties.append("reads batches for its TP group")
    if layout.vpp:
        duties.append(f"model chunks {format_ranks(role.model_chunks)}")
    return ", ".join(duties)


def describe(layout: Layout, virtual_ranks: list[int]) -> dict:
    """The JSON form: sizes, roles, the slice, and for each selected rank its coordinates and groups."""
    roles = layout.roles()
    return {
        "world_size": layout.world_size,
        "data_parallel_size": layout.dp,
        "expert_data_parallel_size": layout.edp,
        "sizes": {
            "tp": layout.tp,
            "pp": layout.pp,
            "cp": layout.cp,
            "ep": layout.ep,
            "etp": layout.etp,
            "vpp": layout.vpp,
        },
        "order": layout.order,
        "roles": [
            {
                "name": role.name,
                "pp": role.pp,
                "first_stage": role.first_stage,
                "last_stage": role.last_stage,
                "data_source": role.data_source,
                "ep": role.ep,
                "model_chunks": list(role.model_chunks),
                "count": layout.role_count(role),
                "representative": layout.representative(role),
            }
            for role in roles
        ],
        "slice": layout.default_slice(),
        "ranks": {
            str(virtual_rank): {
                "coords": layout.coords(virtual_rank).as_dict(),
                "role": layout.role_of(virtual_rank).name,
                "groups": {kind: list(layout.group(kind, virtual_rank)) for kind in GROUP_KINDS},
            }
            for virtual_rank in virtual_ranks
        },
    }


def render(layout: Layout, virtual_ranks: list[int]) -> str:
    """The text form: the job, its roles and slice, then each selected rank with its groups."""
    vpp = f", VPP {layout.vpp}" if layout.vpp else ""
    lines = [
        f"target job: {layout.world_size} ranks = TP {layout.tp} x CP {layout.cp} x DP {layout.dp} x "
        f"PP {layout.pp}{vpp}, order {layout.order}",
        f"experts:    ETP {layout.etp} x EP {layout.ep} x EDP {layout.edp} x PP {layout.pp}",
    ]
    roles = layout.roles()
    lines.append(f"roles ({len(roles)}):")
    width = max(len(role.name) for role in roles)
    for role in roles:
        lines.append(
            f"  {role.name:<{width}}  {layout.role_count(role):>7} ranks  "
            f"representative {layout.representative(role):<7} {_duties(layout, role)}".rstrip()
        )
    chosen = layout.default_slice()
    lines.append(f"slice ({len(chosen)} real ranks): {format_ranks(chosen)}")
    for virtual_rank in virtual_ranks:
        coords = " ".join(f"{name}={value}" for name, value in layout.coords(virtual_rank).as_dict().items())
        lines.append("")
        lines.append(f"virtual rank {virtual_rank}: role {layout.role_of(virtual_rank).name}; {coords}")
        for kind in GROUP_KINDS:
            members = layout.group(kind, virtual_rank)
            shown = format_ranks(members) if members else "(not a member)"
            lines.append(f"  {kind:<9} {len(members):>6}  {shown}")
    return "\n".join(lines)
