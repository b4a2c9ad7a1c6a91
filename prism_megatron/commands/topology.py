"""Show the topology of a target job: coordinates, groups and roles of selected ranks, and the slice.

Takes Megatron-LM's own flag names so a job's command line can be pasted in. Imports neither torch
nor Megatron, so it answers at once even for a 131072-rank job; listing every rank (`--ranks all`)
grows linearly with the world size (`GroupLookup`), with progress on a terminal.
"""

from __future__ import annotations

import argparse
import json
import sys
from collections.abc import Iterator

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
    groups = GroupLookup(layout, len(virtual_ranks))
    if args.json:
        check_json_size(layout, virtual_ranks, args.ranks)
        write_json(layout, virtual_ranks, groups, sys.stdout, job.schedule)
    else:
        for line in render_lines(layout, virtual_ranks, groups, job.schedule):
            sys.stdout.write(line + "\n")
    return 0


TABLE_ABOVE = 64
"""Above this many selected ranks, every group is built once for all of them (`GroupLookup`)."""
PROGRESS_ABOVE = 4096
"""Above this many selected ranks, a terminal's stderr shows how far the listing got."""
MAX_JSON_MEMBERS = 50_000_000
"""The most group members a --json listing prints (every rank lists every group in full: about
6 bytes each, so some 300 MB); a larger one is refused before anything is printed."""


class GroupLookup:
    """The groups of the selected ranks, each built and formatted once.

    Building a rank's groups costs about their size, so listing every rank of a W-rank job rank by
    rank grows with W squared (8192 ranks: 4 s; 32768: a minute). With many ranks selected, each
    kind's groups are enumerated once instead (O(W) in all) and every member looks its group up.
    """

    def __init__(self, layout: Layout, num_selected: int) -> None:
        self.layout = layout
        self._tables = None
        if num_selected > TABLE_ABOVE:
            self._tables = {kind: self._table(kind) for kind in GROUP_KINDS}
        self._text: dict[tuple[str, str, int], str] = {}

    def _table(self, kind: str) -> tuple[list[tuple[int, ...]], list[int]]:
        groups = list(self.layout.groups(kind))
        which = [-1] * self.layout.world_size
        for index, members in enumerate(groups):
            for virtual_rank in members:
                which[virtual_rank] = index
        return groups, which

    def members(self, kind: str, virtual_rank: int) -> tuple[int, ...]:
        """The rank's group of this kind, () when it has none (as `Layout.group`)."""
        if self._tables is None:
            return self.layout.group(kind, virtual_rank)
        groups, which = self._tables[kind]
        index = which[virtual_rank]
        return groups[index] if index >= 0 else ()

    def text(self, kind: str, virtual_rank: int, form: str) -> str:
        """The group as the text listing's line ("line") or as a JSON list ("json"), made once per
        group (with few ranks selected, once per rank)."""
        if self._tables is None:
            return _as_text(kind, self.members(kind, virtual_rank), form)
        key = (form, kind, self._tables[kind][1][virtual_rank])
        if key not in self._text:
            self._text[key] = _as_text(kind, self.members(kind, virtual_rank), form)
        return self._text[key]


def _as_text(kind: str, members: tuple[int, ...], form: str) -> str:
    if form == "json":
        return json.dumps(list(members))
    return f"  {kind:<9} {len(members):>6}  {format_ranks(members) if members else '(not a member)'}"


def check_json_size(layout: Layout, virtual_ranks: list[int], spec: str) -> None:
    """Refuse a --json listing larger than MAX_JSON_MEMBERS group members, before printing any."""
    per_rank = sum(layout.group_size(kind) for kind in GROUP_KINDS)
    total = per_rank * len(virtual_ranks)
    if total > MAX_JSON_MEMBERS:
        raise ValueError(
            f"--ranks {spec} --json would list {total:,} group members (about {total * 6 / 1e9:.1f} GB; the "
            f"limit is {MAX_JSON_MEMBERS:,}): every rank lists every group in full. Select fewer ranks "
            "(--ranks 'pp=0;tp=0', a range 0-1023), or drop --json: the text form lists each group compactly"
        )


class _Progress:
    """'listed N of M ranks' on a terminal's stderr, for long listings (silent otherwise)."""

    def __init__(self, total: int) -> None:
        self.total = total
        self.shown = total > PROGRESS_ABOVE and sys.stderr.isatty()

    def at(self, done: int) -> None:
        if self.shown and done % 1024 == 0:
            sys.stderr.write(f"\rtopology: listed {done} of {self.total} ranks")
            sys.stderr.flush()

    def end(self) -> None:
        if self.shown:
            sys.stderr.write("\r" + " " * 60 + "\r")
            sys.stderr.flush()


def write_json(
    layout: Layout,
    virtual_ranks: list[int],
    groups: GroupLookup,
    out,
    schedule: target.Schedule | None = None,
) -> None:
    """`describe`'s document, streamed: the job first, then one line per selected rank."""
    head = json.dumps(describe(layout, [], schedule), indent=1)
    out.write(head[: head.rindex('"ranks"')] + '"ranks": {')
    progress = _Progress(len(virtual_ranks))
    for done, virtual_rank in enumerate(virtual_ranks, start=1):
        coords = json.dumps(layout.coords(virtual_rank).as_dict())
        listed = ", ".join(f'"{kind}": {groups.text(kind, virtual_rank, "json")}' for kind in GROUP_KINDS)
        role = json.dumps(layout.role_of(virtual_rank).name)
        comma = "," if done < len(virtual_ranks) else ""
        out.write(
            f'\n  "{virtual_rank}": {{"coords": {coords}, "role": {role}, "groups": {{{listed}}}}}{comma}'
        )
        progress.at(done)
    out.write("\n }\n}\n")
    progress.end()


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


def _schedule_lines(schedule: target.Schedule | None) -> list[str]:
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
    return "\n".join(render_lines(layout, virtual_ranks, GroupLookup(layout, len(virtual_ranks)), schedule))


def render_lines(
    layout: Layout, virtual_ranks: list[int], groups: GroupLookup, schedule: target.Schedule | None = None
) -> Iterator[str]:
    """`render`'s lines, one at a time (a listing of every rank of a large job is long)."""
    vpp = f", VPP {layout.vpp}" if layout.vpp else ""
    yield (
        f"target job: {layout.world_size} ranks = TP {layout.tp} x CP {layout.cp} x DP {layout.dp} x "
        f"PP {layout.pp}{vpp}, order {layout.order}"
    )
    yield f"experts:    ETP {layout.etp} x EP {layout.ep} x EDP {layout.edp} x PP {layout.pp}"
    yield from _schedule_lines(schedule)
    roles = layout.roles()
    yield f"roles ({len(roles)}):"
    width = max(len(role.name) for role in roles)
    for role in roles:
        yield (
            f"  {role.name:<{width}}  {layout.role_count(role):>7} ranks  "
            f"representative {layout.representative(role):<7} {_duties(layout, role)}".rstrip()
        )
    chosen = layout.default_slice()
    yield f"slice ({len(chosen)} real ranks): {format_ranks(chosen)}"
    progress = _Progress(len(virtual_ranks))
    for done, virtual_rank in enumerate(virtual_ranks, start=1):
        coords = " ".join(f"{name}={value}" for name, value in layout.coords(virtual_rank).as_dict().items())
        yield ""
        yield f"virtual rank {virtual_rank}: role {layout.role_of(virtual_rank).name}; {coords}"
        for kind in GROUP_KINDS:
            yield groups.text(kind, virtual_rank, "line")
        progress.at(done)
    progress.end()
