"""Show the topology of a target job: coordinates, groups and roles of selected ranks, and the slice.

Takes Megatron-LM's own flag names so a job's command line can be pasted in. Imports neither torch
nor Megatron, so it answers at once even for a 131072-rank job.
"""

from __future__ import annotations

import argparse
import json

from prism_megatron.megatron.job import target
from prism_megatron.topology import GROUP_KINDS, Layout, Role, format_ranks, select_ranks

NAME = "topology"
HELP = "show coordinates, Megatron groups and roles of selected ranks of a target job, and its slice"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Compute, without any process, what megatron-core's initialize_model_parallel gives the "
        "selected virtual ranks of the target job: coordinates, the members of every group, their "
        "roles, and the default slice (one real rank per role). Takes a job's Megatron-LM flags as "
        "plan and emulate do (prism_megatron.megatron.job.target)."
    )
    parser.add_argument(
        "--world-size",
        "--prism-world-size",
        dest="world_size",
        type=int,
        required=True,
        help="ranks in the target job",
    )
    target.add_job_arguments(parser)
    parser.add_argument(
        "--ranks",
        default="slice",
        metavar="SPEC",
        help="ranks to show: slice (default), all, 0,7168, 0-7, or filters like 'pp=0,7;tp=0;dp=0'",
    )
    parser.add_argument("--json", action="store_true", help="print one JSON object instead of text")


def run(args: argparse.Namespace) -> int:
    job = target.derive(args, world_size=args.world_size)
    layout = job.layout()
    virtual_ranks = select_ranks(layout, args.ranks)
    if args.json:
        print(json.dumps(describe(layout, virtual_ranks, job.schedule), indent=1))
    else:
        print(render(layout, virtual_ranks, job.schedule))
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


def describe(layout: Layout, virtual_ranks: list[int], schedule: target.Schedule | None = None) -> dict:
    """The JSON form: sizes, schedule, roles, the slice, and for each selected rank its coordinates
    and groups."""
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
        "schedule": _schedule_json(schedule),
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


def _schedule_json(schedule: target.Schedule | None) -> dict | None:
    if schedule is None:
        return None
    layers = schedule.layers_per_stage
    return {
        "vpp": schedule.vpp,
        "layers_per_stage": None if layers is None else list(layers),
        "overlap_p2p_comm": schedule.overlap_p2p_comm,
        "num_microbatches": schedule.num_microbatches,
    }


def _schedule_line(schedule: target.Schedule | None) -> list[str]:
    if schedule is None or (schedule.layers_per_stage is None and schedule.num_microbatches is None):
        return []
    parts = []
    if schedule.layers_per_stage is not None:
        parts.append(f"layers per stage {' '.join(map(str, schedule.layers_per_stage))}")
    if schedule.num_microbatches is not None:
        parts.append(f"{schedule.num_microbatches} microbatches")
    return [f"schedule:   {', '.join(parts)}"]


def render(layout: Layout, virtual_ranks: list[int], schedule: target.Schedule | None = None) -> str:
    """The text form: the job, its schedule, roles and slice, then each selected rank with its groups."""
    vpp = f", VPP {layout.vpp}" if layout.vpp else ""
    lines = [
        f"target job: {layout.world_size} ranks = TP {layout.tp} x CP {layout.cp} x DP {layout.dp} x "
        f"PP {layout.pp}{vpp}, order {layout.order}",
        f"experts:    ETP {layout.etp} x EP {layout.ep} x EDP {layout.edp} x PP {layout.pp}",
        *_schedule_line(schedule),
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
