"""Role equivalence: which roles of the target job run the same program, so that one capture serves all.

A role (roles.py) gathers ranks that behave alike as ranks. Many roles also run the same *program*:
their iterations issue the same ops (kind, group kind, relative peer, size, dtype) because their
model chunks have the same layer structure; they differ only in which ranks they talk to, and the
graph names peers relative to the rank. Such roles form a class (`RoleClass`): the capture runs one
representative per class and the graph gives every member the representative's measured spans.

The rule, decided from the job before anything runs (`role_classes`):

* **Within a pipeline stage** every role runs the same program. The data source reads its batch on
  the host and issues the ops its TP peers issue (Megatron-LM's broadcast from it is one TP
  collective on both sides; the built-in entry makes the batch on every TP rank), and the
  expert-parallel ranks hold equally many experts of one shape (Megatron requires --num-experts to
  be a multiple of EP). How tokens are routed at run time is no part of the layout; an imbalance is
  a what-if, or a reason for `--prism-capture-all-roles`.
* **The first and the last stage** are apart from every other: the first holds the embedding and
  receives nothing forward, the last holds the output layer, the loss and the multi-token-prediction
  layers and sends nothing forward; with uneven stages (`--decoder-first/last-pipeline-num-layers`)
  their layer counts differ too.
* **Middle stages** whose chunks hold the same layers (`stage_layers`: how many, and which are MoE,
  since `--moe-layer-freq` is a pattern over global layer indices) issue the same forward and
  backward steps. Under the non-interleaved 1F1B schedule they differ in *order* only: stage s runs
  min(PP - s - 1, M) warm-up forwards before its first backward (megatron-core's
  `forward_backward_pipelining_without_interleaving`). They share a class whose members keep their
  warm-up count (`RoleClass.warmup`); `graph.classes` derives each member's op order from the
  representative's steps and the capture confirms it.
* **With an interleaved schedule (VPP)** rank s holds the virtual stages s, s + PP, ...: rank 0
  holds the embedding's chunk and rank PP-1 the loss's, so both stay alone, and middle ranks whose
  chunks hold the same layers run the same forward and backward steps, per virtual microbatch k of
  M x V, in an order that differs by their warm-up, 2 (PP - s - 1) + (V - 1) x group (at most
  M x V; megatron-core's `get_pp_rank_microbatches`). They share a class (`RoleClass.chunks`) when
  the schedule overlaps its p2p (the default; `graph.schedule.interleaved`): without it a steady
  step's forward and backward run back to back with no call between, so the steps cannot be told
  apart in a capture. Its representative is the member with the fewest warm-up microbatches: its
  capture holds every kind of step the others run (warm-up, steady and cool-down), which a member
  whose microbatches are all warm-up would not. One more thing depends on the rank: with
  overlapped gradient reduce (Megatron-LM's `grad_sync_func`, `--overlap-grad-reduce` with the
  default alignment) rank s launches a chunk's reduce after the backward step s virtual
  microbatches after the chunk's last (`grad_sync_points`), or after the loop where that is past
  its end; the graph moves a launch with the rank, and stages that launch a different number of
  chunks inside the loop are kept in different classes.

What keeps every stage apart, conservatively: a job whose per-stage layers or schedule depend on
flags not modelled (`JobModel.unmodelled`: an explicit pipeline layout, partial activation
checkpoints per microbatch, ...), or whose layer counts do not divide (Megatron would refuse it).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

if TYPE_CHECKING:
    from prism_megatron.topology.layout import Layout
    from prism_megatron.topology.roles import Role

DENSE, MOE, MTP = "dense", "moe", "mtp"
"""Layer kinds of `stage_layers`."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class JobModel:
    """What each pipeline stage of the target job computes, beyond the layout (from Megatron's flags)."""

    num_layers: int | None = None
    """Transformer layers (`--num-layers`); None: unknown, so no two stages are taken as alike."""
    first_stage_layers: int | None = None
    """`--decoder-first-pipeline-num-layers` (uneven first stage), else None."""
    last_stage_layers: int | None = None
    """`--decoder-last-pipeline-num-layers` (uneven last stage), else None."""
    embedding_in_split: bool = False
    """`--account-for-embedding-in-pipeline-split`: the embedding counts as a layer of the first stage."""
    loss_in_split: bool = False
    """`--account-for-loss-in-pipeline-split`: the loss counts as a layer of the last stage."""
    moe_layers: int | tuple[int, ...] | None = None
    """Which layers are MoE: None (a dense model), N (every N-th, `--moe-layer-freq N`) or a 0/1 pattern."""
    mtp_num_layers: int = 0
    """Multi-token-prediction layers (`--mtp-num-layers`), held by the last stage."""
    num_microbatches: int | None = None
    """Microbatches per iteration and data-parallel replica (M); None: unknown."""
    overlap_p2p_comm: bool = True
    """The interleaved schedule overlaps its p2p (not `--no-overlap-p2p-communication`)."""
    microbatch_group_size: int | None = None
    """`--microbatch-group-size-per-virtual-pipeline-stage` (None: PP, megatron-core's default)."""
    unmodelled: tuple[str, ...] = ()
    """Flags given that make stages differ in ways not modelled here; they keep every stage apart."""


@dataclasses.dataclass(frozen=True)
class RoleClass:
    """Roles that run the same program; the capture of `representative` stands for all `members`."""

    representative: str
    """The role whose rank the slice captures (the class's first role in job order)."""
    members: tuple[str, ...]
    """Every role of the class, the representative first, in job order."""
    warmup: Mapping[str, int] | None = None
    """Per member, the warm-up microbatches of its pipeline schedule when members sit at different
    pipeline stages (their op order differs); None when every member issues its ops in one order.
    Under the interleaved schedule (`chunks`) they count virtual microbatches (of M x V)."""
    num_microbatches: int | None = None
    """M, with `warmup`."""
    chunks: int | None = None
    """V, the model chunks per rank, with `warmup` under the interleaved schedule; None under 1F1B."""
    microbatch_group: int | None = None
    """With `chunks`: the schedule's microbatch group per virtual stage (megatron-core's default: PP)."""
    stages: Mapping[str, int] | None = None
    """With `chunks`: each member's pipeline rank (it delays the gradient reduce launches)."""

    def __post_init__(self) -> None:
        if not self.members or self.members[0] != self.representative:
            raise ValueError(f"role class of {self.representative!r}: members must start with it")
        if self.warmup is not None and (set(self.warmup) != set(self.members) or not self.num_microbatches):
            raise ValueError(f"role class of {self.representative!r}: warm-up counts need M and every member")
        if self.chunks is not None and (
            self.warmup is None
            or self.chunks < 2
            or not self.microbatch_group
            or self.stages is None
            or set(self.stages) != set(self.members)
        ):
            raise ValueError(
                f"role class of {self.representative!r}: chunks {self.chunks} need V >= 2, warm-up "
                "counts, a microbatch group and every member's pipeline rank"
            )

    def to_json(self) -> dict[str, Any]:
        return {
            "representative": self.representative,
            "members": list(self.members),
            "warmup": None if self.warmup is None else dict(self.warmup),
            "num_microbatches": self.num_microbatches,
            "chunks": self.chunks,
            "microbatch_group": self.microbatch_group,
            "stages": None if self.stages is None else dict(self.stages),
        }

    @classmethod
    def from_json(cls, data: Mapping[str, Any]) -> RoleClass:
        try:
            warmup = data.get("warmup")
            return cls(
                representative=str(data["representative"]),
                members=tuple(str(m) for m in data["members"]),
                warmup=None if warmup is None else {str(k): int(v) for k, v in warmup.items()},
                num_microbatches=data.get("num_microbatches"),
                chunks=data.get("chunks"),
                microbatch_group=data.get("microbatch_group"),
                stages=None
                if data.get("stages") is None
                else {str(k): int(v) for k, v in data["stages"].items()},
            )
        except (KeyError, TypeError, AttributeError) as exc:
            raise ValueError(f"not a role class: {dict(data)} ({exc})") from None


def _layer_counts(layout: Layout, model: JobModel) -> list[int] | None:
    """Transformer layers of each pipeline stage, as megatron-core's `get_num_layers_to_build` splits
    them (before the embedding and loss adjustments); None when the split is unknown or uneven."""
    pp, total = layout.pp, model.num_layers
    first, last = model.first_stage_layers, model.last_stage_layers
    if total is None:
        return None
    if first is not None or last is not None:
        if model.embedding_in_split or model.loss_in_split:
            return None  # megatron-core refuses the combination
        ends = [n for n in (first, last) if n is not None]
        middle_stages = pp - len(ends)
        rest = total - sum(ends)
        if middle_stages and (rest < 0 or rest % middle_stages):
            return None
        middle = rest // middle_stages if middle_stages else 0
        counts = [middle] * pp
        if first is not None:
            counts[0] = first
        if last is not None:
            counts[-1] = last
        return counts
    total += int(model.embedding_in_split) + int(model.loss_in_split)
    return None if total % pp else [total // pp] * pp


def stage_layers(layout: Layout, model: JobModel) -> list[tuple[tuple[str, ...], ...]] | None:
    """Per pipeline stage, the layer kinds of each of its model chunks (`DENSE`, `MOE`, `MTP`).

    Layers are numbered in virtual-stage order (chunk 0 of every stage, then chunk 1 ...), as
    megatron-core's `get_transformer_layer_offset` places them. None when the job's layers per stage
    are unknown or do not divide.
    """
    counts = _layer_counts(layout, model)
    chunks = layout.vpp or 1
    if counts is None or any(n % chunks for n in counts):
        return None
    sizes = {(s, c): counts[s] // chunks for s in range(layout.pp) for c in range(chunks)}
    if model.embedding_in_split:
        sizes[(0, 0)] -= 1
    if model.loss_in_split:
        sizes[(layout.pp - 1, chunks - 1)] -= 1
    if any(n < 0 for n in sizes.values()):
        return None
    pattern = model.moe_layers
    if isinstance(pattern, tuple) and len(pattern) != model.num_layers:
        return None
    kinds: dict[tuple[int, int], tuple[str, ...]] = {}
    index = 0
    for chunk in range(chunks):
        for stage in range(layout.pp):
            layers = range(index, index + sizes[(stage, chunk)])
            index = layers.stop
            kinds[(stage, chunk)] = tuple(_kind(pattern, layer) for layer in layers)
    last = (layout.pp - 1, chunks - 1)
    kinds[last] += (MTP,) * model.mtp_num_layers
    return [tuple(kinds[(s, c)] for c in range(chunks)) for s in range(layout.pp)]


def _kind(pattern: int | tuple[int, ...] | None, layer: int) -> str:
    if pattern is None:
        return DENSE
    if isinstance(pattern, int):
        return MOE if pattern > 0 and layer % pattern == 0 else DENSE
    return MOE if pattern[layer] else DENSE


def _stage_groups(layout: Layout, model: JobModel) -> list[list[int]]:
    """Pipeline stages that run one program, the first and last stage always alone."""
    layers = None if model.unmodelled else stage_layers(layout, model)
    derivable = model.num_microbatches is not None and layers is not None
    if layout.vpp is not None:
        derivable = derivable and model.overlap_p2p_comm
    groups: list[list[int]] = []
    by_program: dict[tuple, list[int]] = {}
    for stage in range(layout.pp):
        if stage in (0, layout.pp - 1) or not derivable:
            groups.append([stage])
            continue
        program = (layers[stage], _launches_in_loop(layout, model, stage))
        if program in by_program:
            by_program[program].append(stage)
        else:
            by_program[program] = [stage]
            groups.append(by_program[program])
    return groups


def _group(layout: Layout, model: JobModel) -> int:
    return layout.pp if model.microbatch_group_size is None else model.microbatch_group_size


def schedule_table(num_microbatches: int, chunks: int, group: int) -> list[tuple[int, int]]:
    """(microbatch, chunk) of each forward virtual microbatch of the interleaved schedule, as
    megatron-core's `get_schedule_table` orders them: groups of `group` microbatches, chunk by chunk
    (the last group takes what is left). Backward virtual microbatch k is the same microbatch of
    chunk V - 1 - chunk."""
    table = []
    for first in range(0, num_microbatches, group):
        last = num_microbatches if first + group >= num_microbatches else first + group
        table += [(mb, chunk) for chunk in range(chunks) for mb in range(first, last)]
    return table


def grad_sync_points(num_microbatches: int, chunks: int, group: int) -> list[int]:
    """The backward virtual microbatches that finish a chunk (its last microbatch), in order: with
    overlapped gradient reduce (`grad_sync_func`), pipeline rank s launches that chunk's reduce after
    backward step k + s, or after the loop when k + s is past its end."""
    table = schedule_table(num_microbatches, chunks, group)
    return [k for k, (mb, _) in enumerate(table) if mb == num_microbatches - 1]


def param_sync_points(num_microbatches: int, chunks: int, group: int) -> list[int]:
    """The forward virtual microbatches that start chunk c's first microbatch, for 1 <= c <= V - 2,
    in order: with aligned parameter all-gathers (`param_sync_func`, Megatron-LM's default with
    `--overlap-param-gather` and the interleaved schedule), pipeline rank s launches chunk c + 1's
    all-gather at the start of forward step k - s (chunks 0 and 1 are launched before the loop). Every
    stage launches them all inside the loop: k >= group >= PP > s, as megatron-core requires
    PP <= group <= M."""
    table = schedule_table(num_microbatches, chunks, group)
    return [k for k, (mb, chunk) in enumerate(table) if mb == 0 and 1 <= chunk <= chunks - 2]


def _launches_in_loop(layout: Layout, model: JobModel, stage: int) -> int | None:
    """How many chunks' gradient reduce a stage launches inside the interleaved loop (None: 1F1B).
    Aligned parameter all-gathers need no count: every stage launches them all there
    (`param_sync_points`)."""
    if layout.vpp is None:
        return None
    total = model.num_microbatches * layout.vpp
    points = grad_sync_points(model.num_microbatches, layout.vpp, _group(layout, model))
    return sum(1 for k in points if k + stage < total)


def _warmup(layout: Layout, model: JobModel, stage: int) -> int:
    """Warm-up microbatches of a pipeline stage: of its 1F1B schedule, or virtual microbatches of the
    interleaved one (module docstring)."""
    num = model.num_microbatches
    if layout.vpp is None:
        return min(layout.pp - stage - 1, num)
    group = _group(layout, model)
    return min(2 * (layout.pp - stage - 1) + (layout.vpp - 1) * group, num * layout.vpp)


def role_classes(layout: Layout, model: JobModel, *, capture_all: bool = False) -> tuple[RoleClass, ...]:
    """The job's roles in classes that run one program (see the module docstring), in job order of
    their first stage; an interleaved class's representative is its member with the fewest warm-up
    microbatches (its roles first, then the others in job order).

    Args:
        capture_all: every role its own class (`--prism-capture-all-roles`).
    """
    roles = layout.roles()
    if capture_all:
        return tuple(RoleClass(role.name, (role.name,)) for role in roles)
    by_stage: dict[int, list[Role]] = {}
    for role in roles:
        by_stage.setdefault(role.pp, []).append(role)
    classes = []
    for stages in _stage_groups(layout, model):
        if len(stages) == 1:
            members = tuple(role.name for role in by_stage[stages[0]])
            classes.append(RoleClass(members[0], members))
            continue
        if layout.vpp is not None:
            stages = [stages[-1], *stages[:-1]]  # the fewest warm-up microbatches first
        members = tuple(role.name for stage in stages for role in by_stage[stage])
        warmup = {role.name: _warmup(layout, model, s) for s in stages for role in by_stage[s]}
        if layout.vpp is None:
            classes.append(RoleClass(members[0], members, warmup, model.num_microbatches))
            continue
        ranks = {role.name: s for s in stages for role in by_stage[s]}
        group = _group(layout, model)
        classes.append(
            RoleClass(members[0], members, warmup, model.num_microbatches, layout.vpp, group, ranks)
        )
    return tuple(classes)


def class_of(classes: Sequence[RoleClass]) -> dict[str, RoleClass]:
    """Role name -> its class."""
    return {member: cls for cls in classes for member in cls.members}
