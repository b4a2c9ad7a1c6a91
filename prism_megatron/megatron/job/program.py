"""What each pipeline stage of a job computes, from the target job's flags, for role equivalence.

`topology.equivalence.role_classes` decides which roles run one program from a `JobModel`; this
module fills it from the `TargetJob` the one reader of Megatron-LM's flags (`megatron.job.target`)
made, so layers, uneven stages, MoE layers and MTP are read as every other command reads them.

Flags that make a stage's layers or schedule depend on the stage in ways `JobModel` does not
describe are reported by name when the flag list holds them (`UNMODELLED_FLAGS`); with any of them
every stage keeps its own capture.
"""

from __future__ import annotations

from collections.abc import Sequence

from prism_megatron.target import TargetJob
from prism_megatron.topology.equivalence import JobModel

UNMODELLED_FLAGS = (
    "--pipeline-model-parallel-layout",
    "--hybrid-override-pattern",
    "--heterogeneous-layers-config-path",
    "--heterogeneous-layers-config-encoded-json",
    "--window-attn-skip-freq",
    "--no-rope-freq",
    "--linear-attention-freq",
    "--num-microbatches-with-partial-activation-checkpoints",
    "--overlap-moe-expert-parallel-comm",
)
"""Flags whose effect differs per stage (layers of an explicit or hybrid layout, per-layer
attention patterns) or per warm-up position (partial activation checkpoints, the combined 1F1B of
overlapped expert communication)."""


def _given(argv: Sequence[str], flag: str) -> bool:
    return any(word == flag or word.startswith(flag + "=") for word in argv)


def job_model(job: TargetJob, argv: Sequence[str]) -> JobModel:
    """The `JobModel` of a target job (with a world size: its microbatches are known), `argv` the
    flag list it came from (for the unmodelled flags)."""
    model, schedule = job.model, job.schedule
    return JobModel(
        num_layers=model.num_layers,
        first_stage_layers=schedule.first_stage_layers,
        last_stage_layers=schedule.last_stage_layers,
        embedding_in_split=schedule.embedding_in_split,
        loss_in_split=schedule.loss_in_split,
        moe_layers=None if model.num_experts is None else model.moe_layer_freq,  # None: a dense model
        mtp_num_layers=model.mtp_num_layers or 0,
        num_microbatches=schedule.num_microbatches,
        overlap_p2p_comm=schedule.overlap_p2p_comm,
        microbatch_group_size=schedule.microbatch_group_size,
        unmodelled=tuple(flag for flag in UNMODELLED_FLAGS if _given(argv, flag)),
    )
