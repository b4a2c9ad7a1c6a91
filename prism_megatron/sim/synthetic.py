"""Megatron-shaped synthetic execution graphs: pipelines whose ops are known exactly.

For analytic tests, benchmarks and the fidelity suite: every role is a pipeline stage (or a role of
one, such as its TP data-source rank) and runs Megatron's schedule with the given compute times.

The schedule orders follow megatron-core 0.16.1 `schedules.py`: 1F1B warms up with PP-s-1
forwards on stage s, then alternates one forward and one backward, then cools down; the interleaved
schedule (VPP model chunks per stage) warms up with 2(PP-s-1) + (VPP-1)PP forwards, capped at all
M VPP of them (with M = PP only the first half of the stages run every forward first), and maps the
k-th forward to chunk (k // PP) % VPP, microbatch (k // (PP VPP)) PP + k % PP (backwards mirror the
chunks). Data flows as it must: a stage receives its input on the compute stream right before the
compute that needs it and sends outputs on a send stream (per direction), so a send never holds
up compute. Optional tensor-parallel all-reduces split each chunk's compute on the compute stream,
and an optional MoE block follows (all-to-all dispatch, expert compute, all-to-all combine);
after the last microbatch, optional data-parallel gradient reduce-scatter, grad-norm all-reduce
over the world, optimizer step and parameter all-gather.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from prism_megatron.graph.schema import (
    COMPUTE_STREAM,
    WORLD_GROUP,
    Dep,
    ExecutionGraph,
    GraphMetadata,
    NodeType,
    Op,
    RoleGraph,
)
from prism_megatron.replay.schedule import OpKind


@dataclasses.dataclass(frozen=True, kw_only=True)
class PipelineSpec:
    """The shape and timings of a synthetic pipeline-parallel iteration."""

    num_microbatches: int
    fwd_ns: int
    """Forward time of one microbatch on one stage (all its model chunks together)."""
    bwd_ns: int
    """Backward time of one microbatch on one stage."""
    vpp: int = 1
    """Model chunks per stage (1: plain 1F1B)."""
    activation_bytes: int = 0
    """Size of each pipeline send/receive."""
    tp_allreduce_bytes: int = 0
    """Size of each tensor-parallel all-reduce; 0 for none."""
    tp_allreduces_per_chunk: int = 1
    """All-reduces in each forward and each backward of one model chunk (for example two per
    layer); the chunk's compute is split evenly between them, each piece followed by one."""
    expert_ns: int = 0
    """MoE: expert compute of one microbatch's forward on one stage (backward: twice), between an
    all-to-all dispatch and combine over the "ep" group; 0 for a dense model."""
    all_to_all_bytes: int = 0
    """Size of each MoE all-to-all."""
    dp_grad_bytes: int = 0
    """Gradient bytes reduce-scattered (and parameters all-gathered) over DP; 0 for no DP phase."""
    optimizer_ns: int = 0
    grad_norm: bool = True
    """A world-wide all-reduce of the grad norm between the two DP collectives."""
    dtype: str = "bf16"

    def __post_init__(self) -> None:
        if self.num_microbatches < 1 or self.vpp < 1:
            raise ValueError(
                f"num_microbatches and vpp must be >= 1, got {self.num_microbatches}, {self.vpp}"
            )
        if min(self.fwd_ns, self.bwd_ns, self.activation_bytes, self.optimizer_ns) < 0:
            raise ValueError("times and sizes must be >= 0")


def schedule_order(stage: int, pp: int, num_microbatches: int, vpp: int = 1) -> list[tuple[str, int, int]]:
    """Megatron's order of compute on one stage: ("F" or "B", model chunk, microbatch).

    Interleaved (vpp > 1), as megatron-core 0.16.1's `forward_backward_pipelining_with_interleaving`
    with its default group of PP contiguous microbatches per model chunk: the k-th forward runs
    the k-th entry of `get_schedule_table`'s order, the k-th backward the mirror chunk of the same
    entry; warm-up is 2(PP-s-1) + (VPP-1)PP forwards, capped at every forward
    (`get_pp_rank_microbatches`). With M == PP only the first half of the stages run every
    forward before their first backward.

    Raises:
        ValueError: an interleaved M that is not a multiple of PP (megatron-core refuses a last
            group of 1 to PP-1 microbatches).
    """
    m = num_microbatches
    if vpp == 1:
        warmup = min(pp - stage - 1, m)
        order = [("F", 0, j) for j in range(warmup)]
        for i in range(m - warmup):
            order += [("F", 0, warmup + i), ("B", 0, i)]
        return order + [("B", 0, j) for j in range(m - warmup, m)]
    table = interleaved_table(pp, m, vpp)
    total = m * vpp
    warmup = min(2 * (pp - stage - 1) + (vpp - 1) * pp, total)

    def action(kind: str, k: int) -> tuple[str, int, int]:
        microbatch, chunk = table[k]
        return kind, chunk if kind == "F" else vpp - 1 - chunk, microbatch

    order = [action("F", k) for k in range(warmup)]
    for i in range(total - warmup):
        order += [action("F", warmup + i), action("B", i)]
    return order + [action("B", k) for k in range(total - warmup, total)]


def interleaved_table(pp: int, num_microbatches: int, vpp: int) -> list[tuple[int, int]]:
    """(microbatch, model chunk) of each virtual microbatch, megatron-core's `get_schedule_table`
    with groups of PP microbatches: PP microbatches of chunk 0, the same of chunk 1, ..., then the
    next group.

    Raises:
        ValueError: M not a multiple of PP (megatron-core refuses a last group of 1 to PP-1).
    """
    m = num_microbatches
    if m < pp or m % pp:
        raise ValueError(f"the interleaved schedule needs microbatches ({m}) divisible by PP ({pp})")
    return [
        (microbatch, chunk)
        for first in range(0, m, pp)
        for chunk in range(vpp)
        for microbatch in range(first, first + pp)
    ]


class _StageBuilder:
    """Appends one stage's ops, numbering sequence numbers and wiring sends to their compute."""

    def __init__(self, stage: int, pp: int, spec: PipelineSpec) -> None:
        self.stage, self.pp, self.spec = stage, pp, spec
        self.compute: list[Op] = []
        self.sends: dict[str, list[Op]] = {}
        self.seq: dict[tuple, int] = {}

    def next_seq(self, *key) -> int:
        number = self.seq.get(key, 0)
        self.seq[key] = number + 1
        return number

    def p2p(self, kind: NodeType, offset: int, microbatch: int) -> Op:
        seq = self.next_seq(kind, offset % self.pp)
        return Op(
            type=kind,
            group="pp",
            offset=offset,
            seq=seq,
            size_bytes=self.spec.activation_bytes,
            dtype=self.spec.dtype,
            microbatch=microbatch,
        )

    def collective(self, comm: OpKind, group: str, size: int, name: str) -> Op:
        return Op(
            type=NodeType.COLLECTIVE,
            comm=comm,
            group=group,
            seq=self.next_seq("coll", group),
            size_bytes=size,
            dtype=self.spec.dtype,
            name=name,
        )

    def chunk(self, kind: str, chunk: int, microbatch: int) -> None:
        spec, pp = self.spec, self.pp
        virtual_stage, last = chunk * pp + self.stage, pp * spec.vpp - 1
        receives = virtual_stage > 0 if kind == "F" else virtual_stage < last
        sends = virtual_stage < last if kind == "F" else virtual_stage > 0
        toward = 1 if kind == "F" else -1
        if receives:
            self.compute.append(self.p2p(NodeType.RECV, -toward, microbatch))
        duration = (spec.fwd_ns if kind == "F" else spec.bwd_ns) // spec.vpp
        # Compute in as many pieces as there are all-reduces, each piece followed by its
        # all-reduce (a row-parallel layer's output); the chunk's output is the last op.
        pieces = spec.tp_allreduces_per_chunk if spec.tp_allreduce_bytes else 1
        for piece in range(pieces):
            share = duration // pieces + (duration % pieces if piece == pieces - 1 else 0)
            name = "fwd" if kind == "F" else "bwd"
            self.compute.append(
                Op(type=NodeType.COMPUTE, name=name, duration_ns=share, microbatch=microbatch)
            )
            if spec.tp_allreduce_bytes:
                self.compute.append(self.collective(OpKind.ALL_REDUCE, "tp", spec.tp_allreduce_bytes, "tp"))
        if spec.expert_ns:
            self.experts(kind, microbatch)
        produced = len(self.compute) - 1
        if sends:
            stream = "send" if pp == 2 else ("send_next" if toward == 1 else "send_prev")
            send = self.p2p(NodeType.SEND, toward, microbatch)
            self.sends.setdefault(stream, []).append(
                dataclasses.replace(send, deps=(Dep(COMPUTE_STREAM, produced),))
            )

    def experts(self, kind: str, microbatch: int) -> None:
        spec = self.spec
        duration = spec.expert_ns // spec.vpp * (1 if kind == "F" else 2)
        self.compute.append(self.collective(OpKind.ALL_TO_ALL, "ep", spec.all_to_all_bytes, "dispatch"))
        self.compute.append(
            Op(type=NodeType.COMPUTE, name="expert", duration_ns=duration, microbatch=microbatch)
        )
        self.compute.append(self.collective(OpKind.ALL_TO_ALL, "ep", spec.all_to_all_bytes, "combine"))

    def data_parallel(self) -> None:
        spec = self.spec
        if not spec.dp_grad_bytes:
            return
        self.compute.append(self.collective(OpKind.REDUCE_SCATTER, "dp", spec.dp_grad_bytes, "grads"))
        if spec.grad_norm:
            self.compute.append(self.collective(OpKind.ALL_REDUCE, WORLD_GROUP, 8, "gradnorm"))
        self.compute.append(Op(type=NodeType.COMPUTE, name="optimizer", duration_ns=spec.optimizer_ns))
        self.compute.append(self.collective(OpKind.ALL_GATHER, "dp", spec.dp_grad_bytes, "params"))

    def streams(self) -> dict[str, tuple[Op, ...]]:
        return {COMPUTE_STREAM: tuple(self.compute), **{k: tuple(v) for k, v in sorted(self.sends.items())}}


def stage_ops(stage: int, pp: int, spec: PipelineSpec) -> dict[str, tuple[Op, ...]]:
    """The streams of one pipeline stage."""
    if spec.vpp > 1 and pp == 2:
        raise ValueError(
            "synthetic interleaved pipelines need PP >= 3 (with PP=2 both directions share a peer)"
        )
    builder = _StageBuilder(stage, pp, spec)
    for kind, chunk, microbatch in schedule_order(stage, pp, spec.num_microbatches, spec.vpp):
        builder.chunk(kind, chunk, microbatch)
    builder.data_parallel()
    return builder.streams()


def pipeline_graph(
    stage_of_role: Mapping[str, int], pp: int, spec: PipelineSpec, layout: Mapping[str, object] | None = None
) -> ExecutionGraph:
    """A graph whose every role runs its stage's synthetic schedule.

    Args:
        stage_of_role: role name -> pipeline stage (0..pp-1).
        layout: the job's layout keyword arguments, stored in the metadata.
    """
    per_stage = {stage: stage_ops(stage, pp, spec) for stage in sorted(set(stage_of_role.values()))}
    roles = {name: RoleGraph(name, per_stage[stage]) for name, stage in stage_of_role.items()}
    source = "synthetic:" + ("interleaved" if spec.vpp > 1 else "1f1b")
    extra = {k: v for k, v in dataclasses.asdict(spec).items()}
    return ExecutionGraph(GraphMetadata(layout=dict(layout or {}), source=source, extra=extra), roles)


def layout_pipeline_graph(layout, spec: PipelineSpec) -> ExecutionGraph:
    """`pipeline_graph` for a `prism_megatron.topology.Layout` (roles and metadata from it)."""
    if (layout.vpp or 1) != spec.vpp:
        raise ValueError(f"the layout has vpp={layout.vpp} but the pipeline spec vpp={spec.vpp}")
    return pipeline_graph({role.name: role.pp for role in layout.roles()}, layout.pp, spec, layout.kwargs())
