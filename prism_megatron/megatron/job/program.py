"""What each pipeline stage of a job computes, read from Megatron-LM's flags for role equivalence.

`topology.equivalence.role_classes` decides which roles run one program from a `JobModel`; this
module fills it from the flag list a run was given, with Megatron-LM's names and defaults, reading
the flags directly (`configs.flag_value`: the last value wins, as in argparse) so that it needs no
full parse and imports neither torch nor Megatron (only a `--moe-layer-freq` list expression is
evaluated by the job parser's own `layer_frequency`).

Flags that make a stage's layers or schedule depend on the stage in ways `JobModel` does not
describe are reported by name (`UNMODELLED_FLAGS`); with any of them every stage keeps its own
capture.
"""

from __future__ import annotations

from collections.abc import Sequence

from prism_megatron.megatron.job.configs import flag_value
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


def _int(argv: Sequence[str], flag: str) -> int | None:
    text = flag_value(list(argv), flag)
    if text is None:
        return None
    try:
        return int(text)
    except ValueError:
        raise ValueError(f"{flag} must be an integer, got {text!r}") from None


def _moe_layers(argv: Sequence[str]) -> int | tuple[int, ...] | None:
    """None for a dense model; else --moe-layer-freq (default 1: every layer), an int or a pattern."""
    if _int(argv, "--num-experts") is None:
        return None
    text = flag_value(list(argv), "--moe-layer-freq")
    if text is None:
        return 1
    if text.strip().lstrip("-").isdigit():
        return int(text)
    from prism_megatron.megatron.job.flags import layer_frequency

    frequency = layer_frequency(text)
    return tuple(frequency) if isinstance(frequency, list) else frequency


def job_model(argv: Sequence[str], *, num_microbatches: int | None) -> JobModel:
    """The `JobModel` of Megatron-LM flags `argv` (M, the microbatches per replica, computed by the caller).

    Raises:
        ValueError: an integer flag that is not an integer, or a --moe-layer-freq that is no pattern.
    """
    return JobModel(
        num_layers=_int(argv, "--num-layers"),
        first_stage_layers=_int(argv, "--decoder-first-pipeline-num-layers"),
        last_stage_layers=_int(argv, "--decoder-last-pipeline-num-layers"),
        embedding_in_split=_given(argv, "--account-for-embedding-in-pipeline-split"),
        loss_in_split=_given(argv, "--account-for-loss-in-pipeline-split"),
        moe_layers=_moe_layers(argv),
        mtp_num_layers=_int(argv, "--mtp-num-layers") or 0,
        num_microbatches=num_microbatches,
        unmodelled=tuple(flag for flag in UNMODELLED_FLAGS if _given(argv, flag)),
    )
