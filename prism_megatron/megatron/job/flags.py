"""A parser for the Megatron-LM flags that decide what a rank holds in memory.

Megatron-LM (the training scripts, not megatron-core) is not a dependency, so its argument parser is not
available; yet `prism-megatron plan` must read a production flag list exactly as Megatron-LM would. This
parser does so for the flags that shape memory, with Megatron-LM's names, destinations and defaults:

* the target job's flags (layout, schedule, batch, model shape), declared once for every command
  (`prism_megatron.megatron.job.target`);
* every other field of megatron-core's `TransformerConfig` becomes a flag the way Megatron-LM's
  `ArgumentGroupFactory` makes it (Megatron-LM `megatron/training/argument_utils.py`): `--field-name`,
  a boolean whose default is False is a switch, one whose default is True is switched off by
  `--no-field-name` / `--disable-field-name`, and a field's `argparse_meta` metadata (alternative
  names, defaults) wins; fields Megatron-LM excludes or renames are skipped (`_EXCLUDED_FIELDS`);
* the flags Megatron-LM defines by hand (`_add_hand_written_flags`, with the defaults of
  `megatron/training/arguments.py` at tag core_v0.16.1).

`NO_MEMORY_EFFECT_FLAGS` names the common flags outside these sets (learning rate, data, logging ...)
that cannot change what a rank allocates; they are accepted and listed. Any other flag is refused,
naming it (and the known flag it is closest to), as `emulate` refuses a flag its entry does not
take: a misspelt `--tensor-model-parallel-sise 4` must not plan another job.
"""

from __future__ import annotations

import argparse
import dataclasses
import difflib
import enum
import typing
from typing import Any

from megatron.core.transformer import TransformerConfig

from prism_megatron.config import RaisingParser
from prism_megatron.megatron.job import target

_EXCLUDED_FIELDS = frozenset(
    {
        # Callables, dtypes and runtime objects (no command-line form).
        "timers",
        "finalize_model_grads_func",
        "grad_scale_func",
        "no_sync_func",
        "grad_sync_func",
        "param_sync_func",
        "_cpu_offloading_context",
        "init_method",
        "output_layer_init_method",
        "embedding_init_method",
        "activation_func",
        "params_dtype",
        "pipeline_dtype",
        "autocast_dtype",
        "quant_recipe",
        "enable_autocast",
        "variable_seq_lengths",
        "batch_p2p_comm",
        "batch_p2p_sync",
        "deallocate_pipeline_outputs",
        "virtual_pipeline_model_parallel_size",
        # Defined by hand below, or under another name (num_experts, decoder-first/last-pipeline-num-layers).
        "moe_layer_freq",
        "moe_router_load_balancing_type",
        "moe_aux_loss_coeff",
        "cp_comm_type",
        "num_moe_experts",
        "num_layers_in_first_pipeline_stage",
        "num_layers_in_last_pipeline_stage",
        "gated_linear_unit",
        "bias_activation_fusion",
        "fp8_param",
        "overlap_p2p_comm",
        "window_size",
        "window_attn_skip_freq",
        "no_rope_freq",
        "linear_attention_freq",
        "pipeline_model_parallel_layout",
        "cuda_graph_scope",
        # Megatron-LM defines these with defaults that differ from the dataclass; no memory effect.
        "gradient_accumulation_fusion",
        "attention_softmax_in_fp32",
        "masked_softmax_fusion",
        "persist_layer_norm",
        "bias_dropout_fusion",
        "apply_rope_fusion",
    }
)
"""TransformerConfig fields that Megatron-LM does not expose as `--field-name` (its `exclude` list in
`_add_network_size_args`, plus fields renamed or hand-defined)."""

NO_MEMORY_EFFECT_FLAGS = frozenset(
    {
        "--lr",
        "--min-lr",
        "--lr-decay-style",
        "--lr-decay-iters",
        "--lr-decay-samples",
        "--lr-warmup-iters",
        "--lr-warmup-samples",
        "--lr-warmup-fraction",
        "--weight-decay",
        "--adam-beta1",
        "--adam-beta2",
        "--adam-eps",
        "--clip-grad",
        "--init-method-std",
        "--seed",
        "--train-iters",
        "--train-samples",
        "--exit-interval",
        "--exit-duration-in-mins",
        "--rampup-batch-size",
        "--loss-scale",
        "--initial-loss-scale",
        "--min-loss-scale",
        "--loss-scale-window",
        "--hysteresis",
        "--mock-data",
        "--data-path",
        "--split",
        "--data-cache-path",
        "--num-workers",
        "--no-create-attention-mask-in-dataloader",
        "--no-mmap-bin-files",
        "--tokenizer-model",
        "--vocab-file",
        "--merge-file",
        "--log-interval",
        "--log-throughput",
        "--eval-interval",
        "--eval-iters",
        "--save-interval",
        "--save",
        "--load",
        "--tensorboard-dir",
        "--ckpt-format",
        "--distributed-timeout-minutes",
        "--distributed-backend",
        "--manual-gc",
        "--no-rope-fusion",
        "--no-masked-softmax-fusion",
        "--no-bias-gelu-fusion",
        "--no-bias-swiglu-fusion",
        "--no-bias-dropout-fusion",
        "--no-gradient-accumulation-fusion",
        "--cross-entropy-loss-fusion",
        "--use-mcore-models",
        "--tp-comm-overlap",
        "--moe-router-pre-softmax",
        "--moe-permute-fusion",
        "--no-load-optim",
        "--no-load-rng",
        "--use-flash-attn",
        "--no-align-grad-reduce",
        "--no-align-param-gather",
    }
)
"""Megatron-LM flags that cannot change what a rank allocates for parameters, gradients, optimizer
state or activations; the plan accepts them silently."""


def _scalar_kwargs(tp: Any) -> dict[str, Any] | None:
    """argparse `type`/`choices` for one annotation, or None when argparse cannot express it."""
    origin, targs = typing.get_origin(tp), typing.get_args(tp)
    if isinstance(tp, type) and issubclass(tp, enum.Enum):
        return {"type": lambda name, cls=tp: cls[name], "choices": list(tp)}
    if origin is None:
        return {"type": tp} if tp in (bool, int, float, str) else None
    if origin is typing.Union and len(targs) == 2 and targs[1] is type(None):
        return _scalar_kwargs(targs[0])
    if origin is list and len(targs) == 1:
        inner = _scalar_kwargs(targs[0])
        return None if inner is None or inner["type"] is bool else {**inner, "nargs": "+"}
    if origin is typing.Literal and len({type(c) for c in targs}) == 1:
        return {"type": type(targs[0]), "choices": targs}
    return None


def _field_argument(field: dataclasses.Field) -> tuple[list[str], dict[str, Any]] | None:
    """The flag names and argparse keywords Megatron-LM derives from one TransformerConfig field."""
    default = field.default_factory() if field.default is dataclasses.MISSING else field.default
    meta = dict(field.metadata.get("argparse_meta", {}))
    kwargs = _scalar_kwargs(field.type)
    if kwargs is None and "type" not in meta:
        return None
    kwargs = {**(kwargs or {}), "dest": field.name, "default": default}
    names = ["--" + field.name.replace("_", "-")]
    if kwargs.get("type") is bool and "nargs" not in kwargs:
        kwargs.pop("type")
        kwargs.pop("choices", None)
        kwargs["action"] = "store_true" if not default else "store_false"
        if default:
            names = ["--no-" + field.name.replace("_", "-"), "--disable-" + field.name.replace("_", "-")]
    names = meta.pop("arg_names", names)
    kwargs.update(meta)
    return names, kwargs


_SWITCH = {"action": "store_true"}
MEGATRON_LM_FLAGS: dict[str, dict[str, Any]] = {
    # model and data
    "--position-embedding-type": {"default": "learned_absolute",
                                  "choices": ("learned_absolute", "rope", "mrope", "relative", "none")},
    "--rotary-base": {"type": int, "default": 10000},
    "--rotary-percent": {"type": float, "default": 1.0},
    "--use-rope-scaling": _SWITCH,
    "--no-position-embedding": {"action": "store_false", "dest": "add_position_embedding"},
    "--squared-relu": _SWITCH,
    "--quick-geglu": _SWITCH,
    "--moe-router-load-balancing-type": {"nargs": "+", "default": "aux_loss",
                                         "choices": ("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none")},
    "--moe-aux-loss-coeff": {"type": float, "nargs": "+", "default": 0.0},
    # multi-latent attention
    "--q-lora-rank": {"type": int, "default": None},
    "--kv-lora-rank": {"type": int, "default": 32},
    "--qk-head-dim": {"type": int, "default": 128},
    "--qk-pos-emb-head-dim": {"type": int, "default": 64},
    "--v-head-dim": {"type": int, "default": 128},
    "--rotary-scaling-factor": {"type": float, "default": 1.0},
    "--mscale": {"type": float, "default": 1.0},
    "--mscale-all-dim": {"type": float, "default": 0.0},
    # parallelism, gradients and optimizer
    "--cp-comm-type": {"nargs": "+", "default": ["p2p"]},
    "--recompute-activations": _SWITCH,
    "--use-distributed-optimizer": _SWITCH,
    "--overlap-grad-reduce": _SWITCH,
    "--overlap-param-gather": _SWITCH,
    "--overlap-param-gather-with-optimizer-step": _SWITCH,
    "--ddp-pad-buckets-for-high-nccl-busbw": _SWITCH,
    "--ddp-average-in-collective": _SWITCH,
    "--accumulate-allreduce-grads-in-fp32": _SWITCH,
    "--grad-reduce-in-bf16": _SWITCH,
    "--use-precision-aware-optimizer": _SWITCH,
    "--no-persist-layer-norm": _SWITCH,
    "--fp8-param-gather": _SWITCH,
    "--ddp-bucket-size": {"type": int, "default": None},
    "--ddp-num-buckets": {"type": int, "default": None},
    "--num-distributed-optimizer-instances": {"type": int, "default": 1},
    "--optimizer": {"default": "adam", "choices": ("adam", "sgd", "muon", "dist_muon")},
}  # fmt: skip
"""Megatron-LM's flags that are not TransformerConfig fields, as `megatron/training/arguments.py`
(tag core_v0.16.1) declares them: the one declaration of each, for the plan's parser and the built-in
entry's (`add_megatron_lm_flags`)."""


def add_megatron_lm_flags(add: Any, names: Any = None) -> None:
    """Declare Megatron-LM's hand-written flags with `add` (a parser's or group's `add_argument`):
    those of `names`, or all of `MEGATRON_LM_FLAGS`."""
    for name in MEGATRON_LM_FLAGS if names is None else names:
        add(name, **MEGATRON_LM_FLAGS[name])


def _add_hand_written_flags(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM flags that are not TransformerConfig fields, and the plan's --prism-* flags."""
    add_megatron_lm_flags(
        parser.add_argument_group("Megatron-LM flags beyond the transformer's").add_argument
    )
    group = parser.add_argument_group("prism")
    group.add_argument("--prism-world-size", type=int, default=None, dest="world_size")
    group.add_argument("--prism-allow-untested-megatron", action="store_true", dest="allow_untested_megatron")


def build_parser() -> argparse.ArgumentParser:
    """The parser of memory-relevant Megatron-LM flags (plus `--prism-world-size`): the target job's
    flags, then the TransformerConfig fields they do not already name, then the hand-written rest."""
    parser = RaisingParser(prog="megatron-flags", add_help=False, error_prefix="Megatron-LM flags: ")
    target.add_job_arguments(parser)
    declared_dests = {action.dest for action in parser._actions}
    group = parser.add_argument_group("transformer configuration")
    for field in dataclasses.fields(TransformerConfig):
        if field.name in _EXCLUDED_FIELDS or not field.init:
            continue
        argument = _field_argument(field)
        if argument is None:
            continue
        names, kwargs = argument
        if kwargs["dest"] in declared_dests or any(n in parser._option_string_actions for n in names):
            continue
        group.add_argument(*names, **kwargs)
    _add_hand_written_flags(parser)
    return parser


@dataclasses.dataclass(frozen=True)
class ParsedFlags:
    """Megatron-LM flags as Megatron-LM's parser would leave them (before `validate_args`)."""

    namespace: argparse.Namespace
    ignored: tuple[str, ...]
    """Flags known to have no effect on memory (`NO_MEMORY_EFFECT_FLAGS`) that were given."""


def parse_flags(argv: list[str]) -> ParsedFlags:
    """Parse a Megatron-LM flag list; values of the flags in `NO_MEMORY_EFFECT_FLAGS` are skipped.

    Raises:
        ValueError: a flag the plan does not know (named, with the known flag closest to it), or a
            modelled flag with a value of the wrong type or outside its choices.
    """
    parser = build_parser()
    namespace, rest = parser.parse_known_args(argv)
    flags = [word.split("=", 1)[0] for word in rest if word.startswith("--")]
    unknown = [f for f in flags if f not in NO_MEMORY_EFFECT_FLAGS]
    if unknown:
        raise ValueError(_unknown_message(unknown, parser))
    return ParsedFlags(namespace=namespace, ignored=tuple(flags))


def _unknown_message(unknown: list[str], parser: argparse.ArgumentParser) -> str:
    known = [*parser._option_string_actions, *NO_MEMORY_EFFECT_FLAGS]
    closest = difflib.get_close_matches(unknown[0], known, n=1)
    hint = f" (did you mean {closest[0]}?)" if closest else ""
    return (
        f"{' '.join(unknown)}: not a Megatron-LM flag the plan knows{hint}; it is misspelt, or a flag that "
        "the plan does not model (run the job with prism-megatron emulate --script to use it)"
    )
