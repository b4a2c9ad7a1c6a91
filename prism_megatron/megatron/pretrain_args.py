"""Arguments of the built-in training entry: Megatron-LM's flag names, for what the entry supports.

A user moving between this entry and Megatron-LM's `pretrain_gpt.py` keeps their flags. Flags that
only matter to a real training run's bookkeeping (checkpoints, evaluation, LR schedule, tokenizer,
kernel fusions that need Transformer Engine or apex) are accepted and ignored, so a production
command line parses; any other flag is an error that names it and points at `--script`.
"""

from __future__ import annotations

import argparse

from prism_megatron.config import add_prism_arguments

# Accepted for command-line compatibility; they do not change what the emulated step computes.
IGNORED_SWITCHES = (
    "--no-gradient-accumulation-fusion",
    "--no-masked-softmax-fusion",
    "--no-bias-gelu-fusion",
    "--no-bias-swiglu-fusion",
    "--no-bias-dropout-fusion",
    "--no-persist-layer-norm",
    "--no-rope-fusion",
    "--disable-gloo-process-groups",
    "--use-cpu-initialization",
    "--no-load-optim",
    "--no-load-rng",
)
IGNORED_VALUED = (
    "--tokenizer-type",
    "--split",
    "--eval-iters",
    "--eval-interval",
    "--save",
    "--load",
    "--save-interval",
    "--lr-decay-style",
    "--lr-warmup-iters",
    "--lr-warmup-fraction",
    "--lr-decay-iters",
    "--distributed-backend",
    "--distributed-timeout-minutes",
    "--attention-backend",
    "--data-cache-path",
)


def _model_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model")
    g.add_argument("--num-layers", type=int, required=True)
    g.add_argument("--hidden-size", type=int, required=True)
    g.add_argument(
        "--ffn-hidden-size",
        type=int,
        default=None,
        help="default: 4 * hidden (SwiGLU: 8/3 * hidden, rounded)",
    )
    g.add_argument("--num-attention-heads", type=int, required=True)
    g.add_argument("--group-query-attention", action="store_true")
    g.add_argument("--num-query-groups", type=int, default=1)
    g.add_argument("--seq-length", type=int, required=True)
    g.add_argument("--max-position-embeddings", type=int, default=None, help="default: --seq-length")
    g.add_argument("--vocab-size", type=int, default=32000, help="mock-data vocabulary before padding")
    g.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    g.add_argument(
        "--position-embedding-type", choices=("learned_absolute", "rope"), default="learned_absolute"
    )
    g.add_argument("--normalization", choices=("LayerNorm", "RMSNorm"), default="LayerNorm")
    g.add_argument("--swiglu", action="store_true")
    g.add_argument("--disable-bias-linear", action="store_true")
    g.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    g.add_argument("--hidden-dropout", type=float, default=0.1)
    g.add_argument("--attention-dropout", type=float, default=0.1)
    g.add_argument("--init-method-std", type=float, default=0.02)
    g.add_argument(
        "--transformer-impl", choices=("local",), default="local", help="only the local spec runs without TE"
    )
    g.add_argument("--bf16", action="store_true")
    g.add_argument("--fp16", action="store_true")


def _parallel_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("parallelism")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    g.add_argument("--virtual-pipeline-model-parallel-size", type=int, default=None)
    g.add_argument("--num-layers-per-virtual-pipeline-stage", type=int, default=None)
    g.add_argument("--context-parallel-size", type=int, default=1)
    g.add_argument("--expert-model-parallel-size", type=int, default=1)
    g.add_argument("--expert-tensor-parallel-size", type=int, default=None)
    g.add_argument("--sequence-parallel", action="store_true")
    g.add_argument("--use-tp-pp-dp-mapping", action="store_true")
    g.add_argument("--no-overlap-p2p-communication", action="store_false", dest="overlap_p2p_communication")
    g.add_argument("--microbatch-group-size-per-virtual-pipeline-stage", type=int, default=None)
    g.add_argument(
        "--variable-seq-lengths", action="store_true", help="pipeline stages exchange shapes first"
    )


def _training_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("training")
    g.add_argument("--micro-batch-size", type=int, required=True)
    g.add_argument("--global-batch-size", type=int, default=None, help="default: micro batch * DP")
    g.add_argument("--train-iters", type=int, required=True)
    g.add_argument(
        "--mock-data", action="store_true", help="the only data this entry has; accepted for compatibility"
    )
    g.add_argument("--seed", type=int, default=1234)
    g.add_argument("--lr", type=float, default=1.0e-4)
    g.add_argument("--min-lr", type=float, default=0.0)
    g.add_argument("--weight-decay", type=float, default=0.01)
    g.add_argument("--adam-beta1", type=float, default=0.9)
    g.add_argument("--adam-beta2", type=float, default=0.999)
    g.add_argument("--clip-grad", type=float, default=1.0)
    g.add_argument("--use-distributed-optimizer", action="store_true")
    g.add_argument("--overlap-grad-reduce", action="store_true")
    g.add_argument("--overlap-param-gather", action="store_true")
    g.add_argument("--no-align-grad-reduce", action="store_false", dest="align_grad_reduce")
    g.add_argument("--align-param-gather", action="store_true")
    g.add_argument("--ddp-bucket-size", type=int, default=None)
    g.add_argument("--accumulate-allreduce-grads-in-fp32", action="store_true")
    g.add_argument("--recompute-granularity", choices=("full", "selective"), default=None)
    g.add_argument("--recompute-method", choices=("uniform", "block"), default=None)
    g.add_argument("--recompute-num-layers", type=int, default=None)
    g.add_argument("--log-interval", type=int, default=1)


def _moe_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("mixture of experts")
    g.add_argument("--num-experts", type=int, default=None)
    g.add_argument("--moe-router-topk", type=int, default=2)
    g.add_argument("--moe-ffn-hidden-size", type=int, default=None)
    g.add_argument("--moe-token-dispatcher-type", choices=("allgather", "alltoall"), default="allgather")
    g.add_argument("--moe-aux-loss-coeff", type=float, default=0.0)
    g.add_argument("--moe-router-load-balancing-type", default="aux_loss")


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m prism_megatron.megatron.pretrain",
        description="Built-in megatron-core GPT pretraining entry (mock data) with Megatron-LM flag names.",
        allow_abbrev=False,
    )
    _model_args(parser)
    _parallel_args(parser)
    _training_args(parser)
    _moe_args(parser)
    ignored = parser.add_argument_group("accepted and ignored (bookkeeping of a real run)")
    for flag in IGNORED_SWITCHES:
        ignored.add_argument(flag, action="store_true", help=argparse.SUPPRESS)
    for flag in IGNORED_VALUED:
        ignored.add_argument(flag, help=argparse.SUPPRESS)
    add_prism_arguments(parser)
    return parser


def parse(argv: list[str]) -> argparse.Namespace:
    """Parse and derive what Megatron-LM's validate_args derives that does not need the world size."""
    parser = build_parser()
    args, unknown = parser.parse_known_args(argv)
    if unknown:
        raise ValueError(
            f"the built-in entry does not support {' '.join(unknown)}; run Megatron-LM's pretrain_gpt.py "
            "with --script for its full flag set"
        )
    derive(args)
    return args


def derive(args: argparse.Namespace) -> None:
    """Defaults and checks that depend only on the flags (ValueError names the flag)."""
    if args.bf16 and args.fp16:
        raise ValueError("--bf16 and --fp16 are exclusive; pass one")
    if args.max_position_embeddings is None:
        args.max_position_embeddings = args.seq_length
    if args.ffn_hidden_size is None:
        args.ffn_hidden_size = (
            int(args.hidden_size * 4 * 2 / 3 / 64) * 64 if args.swiglu else 4 * args.hidden_size
        )
    if args.expert_tensor_parallel_size is None:
        args.expert_tensor_parallel_size = args.tensor_model_parallel_size
    if args.context_parallel_size > 1:
        raise ValueError(
            "--context-parallel-size > 1 needs Transformer Engine attention; the built-in entry runs the local spec"
        )
    pp = args.pipeline_model_parallel_size
    if args.num_layers % pp:
        raise ValueError(
            f"--num-layers {args.num_layers} must be divisible by --pipeline-model-parallel-size {pp}"
        )
    if args.num_layers_per_virtual_pipeline_stage is not None:
        per_stage = args.num_layers // pp
        if per_stage % args.num_layers_per_virtual_pipeline_stage:
            raise ValueError(
                f"layers per pipeline stage ({per_stage}) must be divisible by "
                f"--num-layers-per-virtual-pipeline-stage {args.num_layers_per_virtual_pipeline_stage}"
            )
        args.virtual_pipeline_model_parallel_size = per_stage // args.num_layers_per_virtual_pipeline_stage
    if args.virtual_pipeline_model_parallel_size == 1:
        args.virtual_pipeline_model_parallel_size = None
    if args.virtual_pipeline_model_parallel_size is None:
        args.overlap_p2p_communication = False
        args.align_param_gather = False
    elif pp < 2 or (pp < 3 and not args.overlap_p2p_communication):
        raise ValueError(
            "the interleaved schedule needs --pipeline-model-parallel-size >= 2 (>= 3 with --no-overlap-p2p-communication)"
        )
    if args.num_experts and args.tensor_model_parallel_size > 1:
        raise ValueError(
            "MoE with --tensor-model-parallel-size > 1 needs sequence parallelism, which the local spec lacks"
        )


def derive_world(args: argparse.Namespace, world_size: int) -> None:
    """What depends on the world size: DP and the global batch (Megatron-LM's rules)."""
    model_parallel = (
        args.tensor_model_parallel_size * args.pipeline_model_parallel_size * args.context_parallel_size
    )
    if world_size % model_parallel:
        raise ValueError(f"world size {world_size} is not divisible by TP*PP*CP = {model_parallel}")
    args.data_parallel_size = world_size // model_parallel
    if args.global_batch_size is None:
        args.global_batch_size = args.micro_batch_size * args.data_parallel_size
    if args.global_batch_size % (args.micro_batch_size * args.data_parallel_size):
        raise ValueError(
            f"--global-batch-size {args.global_batch_size} must be a multiple of --micro-batch-size * DP "
            f"= {args.micro_batch_size} * {args.data_parallel_size}"
        )
