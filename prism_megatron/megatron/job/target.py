"""Megatron-LM's flags read into the target job: its layout, schedule, batch and model shape, once.

Every command that takes a job's flags reads them here, with Megatron-LM's names, destinations and
defaults (`megatron/training/arguments.py` at tag core_v0.16.1): `prism-megatron topology`, `plan`,
`emulate` (its run plan, before any process starts) and the built-in training entry. Each declares
these flags with `add_job_arguments` on its own parser (beside the flags only it reads) and derives
the job with `derive`, which does what Megatron-LM's `validate_args` does for them, on the namespace
as Megatron-LM leaves it, and returns the `TargetJob`. So a flag is spelt, defaulted and derived the
same everywhere:

* the virtual-pipeline size from `--num-layers-per-virtual-pipeline-stage` (with the embedding and
  loss counted as layers under `--account-for-embedding/loss-in-pipeline-split`) or
  `--num-virtual-stages-per-pipeline-rank` (prism also takes `--virtual-pipeline-model-parallel-size`
  for it, which Megatron-LM's own parser does not), derived in `stages.derive_schedule` only;
* uneven first and last stages (`--decoder-first/last-pipeline-num-layers`) under megatron-core's
  rule for them; `--pipeline-model-parallel-layout` is refused (not modelled);
* the data-parallel size, the global batch and the microbatches; the FFN size, KV channels, query
  groups (heads divisible by them, as megatron-core's attention requires), position embeddings and
  padded vocabulary of the model.

The job is plain data of `prism_megatron.target` (`TargetJob`, `ParallelSizes`, `Schedule`,
`ModelShape`), which the report and the plans read without this parser; `layout_of` there is the one
place a `Layout` is built from the job's sizes and `select_real_ranks` here the one place
`--prism-ranks` is read against it. Pure: imports neither torch nor Megatron, so `topology` answers
at once for any world size.
"""

from __future__ import annotations

import argparse
import ast
from collections.abc import Collection
from typing import Any

from prism_megatron import target as pure
from prism_megatron.megatron.job import stages
from prism_megatron.target import (
    ORDER_DEFAULT,
    ORDER_TP_PP_DP,
    ModelShape,
    ParallelSizes,
    Schedule,
    TargetJob,
    layout_of,
)
from prism_megatron.topology import Layout, select_ranks

_NULL_TOKENIZER = "NullTokenizer"


def add_job_arguments(parser: argparse.ArgumentParser, *, required: Collection[str] = ()) -> None:
    """Declare the target job's flags on `parser` (Megatron-LM's names, destinations, defaults).

    Args:
        required: destinations the caller needs (e.g. "num_layers"); argparse then refuses their absence.
    """
    group = parser.add_argument_group("target job (Megatron-LM flags)")

    def add(*names: str, **kwargs) -> None:
        dest = kwargs.get("dest") or names[0].removeprefix("--").replace("-", "_")
        if dest in required:
            kwargs["required"] = True
        group.add_argument(*names, **kwargs)

    for flag in ("--tensor-model-parallel-size", "--pipeline-model-parallel-size", "--context-parallel-size",
                 "--expert-model-parallel-size"):  # fmt: skip
        add(flag, type=int, default=1)
    add("--expert-tensor-parallel-size", type=int, default=None, help="default: --tensor-model-parallel-size")
    add(
        "--use-tp-pp-dp-mapping",
        action="store_true",
        help=f"rank order {ORDER_TP_PP_DP} instead of {ORDER_DEFAULT}",
    )
    add("--sequence-parallel", action="store_true")
    add("--num-layers-per-virtual-pipeline-stage", type=int, default=None)
    add("--num-virtual-stages-per-pipeline-rank", "--virtual-pipeline-model-parallel-size", type=int,
        default=None, dest="num_virtual_stages_per_pipeline_rank",
        help="model chunks per pipeline rank (interleaved schedule)")  # fmt: skip
    add("--pipeline-model-parallel-layout", default=None, help="not modelled by prism: refused")
    for flag in ("--decoder-first-pipeline-num-layers", "--decoder-last-pipeline-num-layers"):
        add(flag, type=int, default=None, help="default: an even split")
    add("--account-for-embedding-in-pipeline-split", action="store_true")
    add("--account-for-loss-in-pipeline-split", action="store_true")
    add("--no-overlap-p2p-communication", action="store_false", dest="overlap_p2p_comm")
    add("--microbatch-group-size-per-virtual-pipeline-stage", type=int, default=None,
        dest="microbatch_group_size_per_vp_stage")  # fmt: skip
    for flag in ("--micro-batch-size", "--global-batch-size", "--num-layers", "--hidden-size",
                 "--ffn-hidden-size", "--num-attention-heads", "--kv-channels", "--seq-length",
                 "--max-position-embeddings", "--vocab-size", "--padded-vocab-size", "--num-experts",
                 "--moe-ffn-hidden-size"):  # fmt: skip
        add(flag, type=int, default=None)
    add("--group-query-attention", action="store_true")
    add("--num-query-groups", type=int, default=1)
    add("--make-vocab-size-divisible-by", type=int, default=128)
    add("--tokenizer-type", default=None, help=f"{_NULL_TOKENIZER} counts one EOD token beyond --vocab-size")
    add("--swiglu", action="store_true")
    add("--untie-embeddings-and-output-weights", action="store_true")
    add("--moe-router-topk", type=int, default=2)
    add("--moe-shared-expert-intermediate-size", type=int, default=None)
    add(
        "--moe-layer-freq",
        type=layer_frequency,
        default=1,
        help="N (every N-th layer) or e.g. ([0]*3+[1]*58)",
    )
    add("--mtp-num-layers", type=int, default=None, help="multi-token prediction depth (on the last stage)")


def layer_frequency(text: str) -> int | list[int]:
    """Megatron-LM's `--moe-layer-freq`: an int N (every N-th layer is MoE) or a list expression.

    Megatron-LM evaluates the expression with `eval`; this accepts only what such patterns need
    (integer lists, `+` and `*`), e.g. `([0]*3+[1]*58)`.
    """
    text = text.strip()
    if text.lstrip("-").isdigit():
        return int(text)

    def value(node: ast.AST) -> Any:
        if isinstance(node, ast.Constant) and isinstance(node.value, int):
            return node.value
        if isinstance(node, ast.List):
            return [value(item) for item in node.elts]
        if isinstance(node, ast.BinOp) and isinstance(node.op, ast.Add | ast.Mult):
            left, right = value(node.left), value(node.right)
            return left + right if isinstance(node.op, ast.Add) else left * right
        raise ValueError(f"--moe-layer-freq: {text!r} is not an int or a list expression like ([0]*3+[1]*58)")

    result = value(ast.parse(text, mode="eval").body)
    if not isinstance(result, list) or not all(isinstance(x, int) for x in result):
        raise ValueError(f"--moe-layer-freq: {text!r} must give a list of 0/1 integers")
    return result


def copy_of_job_flags(args: argparse.Namespace) -> argparse.Namespace:
    """The target job's flags copied out of another parser's namespace (Megatron-LM's own, before its
    `validate_args`), with this module's defaults for any that parser does not have."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    add_job_arguments(parser)
    defaults = vars(parser.parse_args([]))
    return argparse.Namespace(**{dest: getattr(args, dest, default) for dest, default in defaults.items()})


def select_real_ranks(layout: Layout, spec: str | None) -> tuple[int, ...]:
    """The virtual ranks real processes run, sorted: `--prism-ranks` (default: one rank per role)."""
    try:
        ranks = layout.default_slice() if spec is None else select_ranks(layout, spec)
    except ValueError as exc:
        raise ValueError(f"--prism-ranks {spec}: {exc}") from None
    return tuple(sorted(ranks))


def derive(args: argparse.Namespace, *, world_size: int | None = None) -> TargetJob:
    """Megatron-LM's `validate_args` for the job's flags, in place on `args`, and the job they give.

    Sets what Megatron-LM sets (expert TP, sequence parallelism off at TP 1, the virtual-pipeline size
    as `virtual_pipeline_model_parallel_size`, the FFN size, KV channels, position embeddings, MoE FFN
    size; with a world size also `data_parallel_size`, the global batch and `num_microbatches`).

    Raises:
        ValueError: a combination Megatron-LM or megatron-core refuses; the message names the flags.
    """
    if args.pipeline_model_parallel_layout is not None:
        raise ValueError(
            "--pipeline-model-parallel-layout is not modelled by prism; lay the stages out with "
            "--decoder-first/last-pipeline-num-layers and --num-virtual-stages-per-pipeline-rank"
        )
    if args.expert_tensor_parallel_size is None:
        args.expert_tensor_parallel_size = args.tensor_model_parallel_size
    if args.tensor_model_parallel_size == 1:
        args.sequence_parallel = False  # arguments.py: "Disabling sequence parallelism because TP is 1"
    stages.derive_schedule(args)
    _derive_model(args)
    args.padded_vocab_size = padded_vocab_size(args)
    if world_size is not None:
        derive_world(args, world_size)
    return target_job(args, world_size=world_size)


def derive_world(args: argparse.Namespace, world_size: int) -> None:
    """What depends on the world size: the data-parallel size, the global batch, the microbatches."""
    layout = layout_of(parallel_sizes(args), world_size)  # refuses sizes that do not divide W
    args.data_parallel_size = layout.dp
    mbs = args.micro_batch_size
    if mbs is None:
        args.num_microbatches = None
        return
    if mbs < 1:
        raise ValueError(f"--micro-batch-size must be >= 1, got {mbs}")
    if args.global_batch_size is None:
        args.global_batch_size = mbs * layout.dp
    if args.global_batch_size < 1 or args.global_batch_size % (mbs * layout.dp):
        raise ValueError(
            f"--global-batch-size {args.global_batch_size} must be a multiple of --micro-batch-size x DP "
            f"= {mbs} x {layout.dp}"
        )
    args.num_microbatches = args.global_batch_size // (mbs * layout.dp)


def parallel_sizes(args: argparse.Namespace) -> ParallelSizes:
    """The parallel sizes of flags `derive` has derived."""
    return ParallelSizes(
        tp=args.tensor_model_parallel_size,
        pp=args.pipeline_model_parallel_size,
        vpp=args.virtual_pipeline_model_parallel_size,
        cp=args.context_parallel_size,
        ep=args.expert_model_parallel_size,
        etp=args.expert_tensor_parallel_size,
        order=ORDER_TP_PP_DP if args.use_tp_pp_dp_mapping else ORDER_DEFAULT,
        untie_embeddings=args.untie_embeddings_and_output_weights,
        mtp=args.mtp_num_layers is not None,  # megatron-core's get_mtp_ranks: set, even 0
    )


def target_job(args: argparse.Namespace, *, world_size: int | None) -> TargetJob:
    """The job of flags `derive` has derived (read only)."""
    heads = args.num_attention_heads
    return TargetJob(
        world_size=world_size,
        sizes=parallel_sizes(args),
        schedule=Schedule(
            vpp=args.virtual_pipeline_model_parallel_size,
            layers_per_stage=stages.layers_per_stage(args),
            overlap_p2p_comm=args.overlap_p2p_comm,
            microbatch_group_size=args.microbatch_group_size_per_vp_stage,
            num_microbatches=getattr(args, "num_microbatches", None),
            first_stage_layers=args.decoder_first_pipeline_num_layers,
            last_stage_layers=args.decoder_last_pipeline_num_layers,
            embedding_in_split=args.account_for_embedding_in_pipeline_split,
            loss_in_split=args.account_for_loss_in_pipeline_split,
        ),
        micro_batch_size=args.micro_batch_size,
        global_batch_size=args.global_batch_size,
        data_parallel_size=getattr(args, "data_parallel_size", None),
        model=ModelShape(
            num_layers=args.num_layers,
            hidden_size=args.hidden_size,
            ffn_hidden_size=args.ffn_hidden_size,
            num_attention_heads=heads,
            num_query_groups=args.num_query_groups if args.group_query_attention else heads,
            kv_channels=args.kv_channels,
            seq_length=args.seq_length,
            max_position_embeddings=args.max_position_embeddings,
            padded_vocab_size=padded_vocab_size(args),
            swiglu=args.swiglu,
            num_experts=args.num_experts,
            moe_ffn_hidden_size=args.moe_ffn_hidden_size,
            moe_router_topk=args.moe_router_topk,
            moe_layer_freq=tuple(freq) if isinstance(freq := args.moe_layer_freq, list) else freq,
            moe_shared_expert_intermediate_size=args.moe_shared_expert_intermediate_size,
            mtp_num_layers=args.mtp_num_layers,
        ),
    )


def padded_vocab_size(args: argparse.Namespace) -> int | None:
    """The embedding rows Megatron-LM builds for these flags (`prism_megatron.target.padded_vocab_size`)."""
    return pure.padded_vocab_size(
        args.vocab_size,
        tp=args.tensor_model_parallel_size,
        divisible_by=args.make_vocab_size_divisible_by,
        null_tokenizer=args.tokenizer_type == _NULL_TOKENIZER,
        padded=args.padded_vocab_size,
    )


def _derive_model(args: argparse.Namespace) -> None:
    """Megatron-LM's model defaults, and the divisibility its attention and experts need."""
    h, heads = args.hidden_size, args.num_attention_heads
    if args.max_position_embeddings is None:
        args.max_position_embeddings = args.seq_length
    if args.ffn_hidden_size is None and h is not None:
        args.ffn_hidden_size = int((4 * h * 2 / 3) / 64) * 64 if args.swiglu else 4 * h
    if args.kv_channels is None and h is not None and heads:
        if h % heads:
            raise ValueError(
                f"--hidden-size {h} is not divisible by --num-attention-heads {heads}; pass --kv-channels"
            )
        args.kv_channels = h // heads
    if args.group_query_attention and heads is not None:
        groups = args.num_query_groups
        if groups is None or groups < 1 or heads % groups:
            raise ValueError(
                f"--num-attention-heads {heads} must be divisible by --num-query-groups {groups} "
                "(each key/value head serves a whole number of query heads)"
            )
    if (
        args.seq_length is not None
        and args.context_parallel_size > 1
        and args.seq_length % (2 * args.context_parallel_size)
    ):
        raise ValueError(
            f"--seq-length {args.seq_length} must be a multiple of 2 x --context-parallel-size "
            f"{args.context_parallel_size} (each rank holds two chunks of the sequence)"
        )
    if args.num_experts == 0:
        args.num_experts = None
    ep = args.expert_model_parallel_size
    # Only where a model is described: `topology` lays out expert parallelism without one.
    if ep > 1 and args.num_experts is None and h is not None:
        raise ValueError(f"--expert-model-parallel-size {ep} needs --num-experts")
    if args.num_experts is not None:
        if args.num_experts % ep:
            raise ValueError(
                f"--num-experts {args.num_experts} must be divisible by --expert-model-parallel-size {ep}"
            )
        if args.moe_ffn_hidden_size is None:
            args.moe_ffn_hidden_size = args.ffn_hidden_size
        frequency = args.moe_layer_freq
        if isinstance(frequency, list) and args.num_layers is not None and len(frequency) != args.num_layers:
            raise ValueError(
                f"--moe-layer-freq lists {len(frequency)} layers; --num-layers is {args.num_layers}"
            )
