"""What each pipeline stage of a job computes, from the target job's flags, for role equivalence.

`topology.equivalence.role_classes` decides which roles run one program from a `JobModel`; this
module fills it from the namespace the one reader of Megatron-LM's flags (`megatron.job.target`)
left, so layers, uneven stages, MoE layers and MTP are read as every other command reads them.

Flags that make a stage's layers or schedule depend on the stage in ways `JobModel` does not
describe are reported by name when the flag list holds them (`UNMODELLED_FLAGS`); with any of them
every stage keeps its own capture.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence

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


def _moe_layers(flags: argparse.Namespace) -> int | tuple[int, ...] | None:
    """None for a dense model; else --moe-layer-freq (every N-th layer, or a 0/1 pattern)."""
    if flags.num_experts is None:
        return None
    frequency = flags.moe_layer_freq
    return tuple(frequency) if isinstance(frequency, list) else frequency


def job_model(flags: argparse.Namespace, argv: Sequence[str]) -> JobModel:
    """The `JobModel` of a target job: `flags` as `megatron.job.target` parsed and derived them (its
    `num_microbatches` included), `argv` the flag list they came from (for the unmodelled flags)."""
    return JobModel(
        num_layers=flags.num_layers,
        first_stage_layers=flags.decoder_first_pipeline_num_layers,
        last_stage_layers=flags.decoder_last_pipeline_num_layers,
        embedding_in_split=flags.account_for_embedding_in_pipeline_split,
        loss_in_split=flags.account_for_loss_in_pipeline_split,
        moe_layers=_moe_layers(flags),
        mtp_num_layers=flags.mtp_num_layers or 0,
        num_microbatches=flags.num_microbatches,
        unmodelled=tuple(flag for flag in UNMODELLED_FLAGS if _given(argv, flag)),
    )
