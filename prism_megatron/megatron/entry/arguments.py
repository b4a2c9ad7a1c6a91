"""Arguments of the built-in training entry: Megatron-LM's flag names, for what the entry supports.

A user moving between this entry and Megatron-LM's `pretrain_gpt.py` keeps their flags: every flag of
the shipped production configurations (`launch/configs/*.args`) is accepted, with Megatron-LM's
defaults (`megatron/training/arguments.py`, tag core_v0.16.1) and its `validate_args` derivations.
Flags that only matter to a real training run's bookkeeping (checkpoints, evaluation, LR schedule,
kernel fusions that need Transformer Engine or apex) are accepted and ignored, so a production
command line parses; any other flag is an error that names it and points at `--script`.

Sequence and context parallelism run on the local layers of `prism_megatron.megatron.layers`, put in
the layer spec by `parallel_spec`. What the entry still cannot run is refused by `check_local_spec`,
after parsing, so that a configuration still parses and can be planned or shrunk.
"""

from __future__ import annotations

import argparse
import importlib.util
import math

from prism_megatron.config import add_prism_arguments
from prism_megatron.megatron.entry import training_log

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
    "--no-load-optim",
    "--no-load-rng",
)
IGNORED_VALUED = (
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
    g.add_argument("--kv-channels", type=int, default=None, help="default: hidden / heads")
    g.add_argument("--group-query-attention", action="store_true")
    g.add_argument("--num-query-groups", type=int, default=1)
    g.add_argument("--qk-layernorm", action="store_true")
    g.add_argument("--seq-length", type=int, required=True)
    g.add_argument("--max-position-embeddings", type=int, default=None, help="default: --seq-length")
    g.add_argument("--vocab-size", type=int, default=32000, help="mock-data vocabulary before padding")
    g.add_argument(
        "--tokenizer-type",
        default=None,
        help="NullTokenizer adds one EOD token to --vocab-size; others: none",
    )
    g.add_argument("--make-vocab-size-divisible-by", type=int, default=128)
    g.add_argument(
        "--position-embedding-type", choices=("learned_absolute", "rope"), default="learned_absolute"
    )
    g.add_argument("--rotary-base", type=int, default=10000)
    g.add_argument("--normalization", choices=("LayerNorm", "RMSNorm"), default="LayerNorm")
    g.add_argument("--swiglu", action="store_true")
    g.add_argument("--disable-bias-linear", action="store_true")
    g.add_argument("--untie-embeddings-and-output-weights", action="store_true")
    g.add_argument("--hidden-dropout", type=float, default=0.1)
    g.add_argument("--attention-dropout", type=float, default=0.1)
    g.add_argument("--init-method-std", type=float, default=0.02)
    g.add_argument("--mtp-num-layers", type=int, default=None, help="multi-token prediction depth")
    g.add_argument("--mtp-loss-scaling-factor", type=float, default=0.1)
    g.add_argument(
        "--transformer-impl", choices=("local",), default="local", help="only the local spec runs without TE"
    )
    g.add_argument("--bf16", action="store_true")
    g.add_argument("--fp16", action="store_true")


def _mla_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("multi-latent attention")
    g.add_argument("--multi-latent-attention", action="store_true")
    g.add_argument("--q-lora-rank", type=int, default=None, help="default: no query compression")
    g.add_argument("--kv-lora-rank", type=int, default=32)
    g.add_argument("--qk-head-dim", type=int, default=128)
    g.add_argument("--qk-pos-emb-head-dim", type=int, default=64)
    g.add_argument("--v-head-dim", type=int, default=128)
    g.add_argument("--rotary-scaling-factor", type=float, default=1.0, help="YaRN scaling of MLA's RoPE")
    g.add_argument("--mscale", type=float, default=1.0)
    g.add_argument("--mscale-all-dim", type=float, default=0.0)


def _parallel_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("parallelism")
    g.add_argument("--tensor-model-parallel-size", type=int, default=1)
    g.add_argument("--pipeline-model-parallel-size", type=int, default=1)
    g.add_argument("--decoder-first-pipeline-num-layers", type=int, default=None, help="default: even split")
    g.add_argument("--decoder-last-pipeline-num-layers", type=int, default=None, help="default: even split")
    g.add_argument("--virtual-pipeline-model-parallel-size", type=int, default=None)
    g.add_argument("--num-layers-per-virtual-pipeline-stage", type=int, default=None)
    g.add_argument("--context-parallel-size", type=int, default=1)
    g.add_argument(
        "--cp-comm-type",
        nargs="+",
        choices=("p2p", "a2a", "allgather", "a2a+p2p"),
        default=["p2p"],
        help="one for every layer, or one per layer",
    )
    g.add_argument("--hierarchical-context-parallel-sizes", nargs="+", type=int, default=None)
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
    g.add_argument(
        "--use-cpu-initialization",
        action="store_true",
        help="initialise every weight whole and split it (the same model for any TP size)",
    )
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


def _layer_frequency(text: str) -> int | list[int]:
    """`--moe-layer-freq`, read by the plan's parser of the same flag (imported only when given,
    since it loads megatron-core)."""
    from prism_megatron.megatron.job.flags import layer_frequency

    return layer_frequency(text)


def _moe_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("mixture of experts")
    g.add_argument("--num-experts", type=int, default=None)
    g.add_argument(
        "--moe-layer-freq",
        type=_layer_frequency,
        default=1,
        help="N (every N-th layer) or e.g. ([0]*3+[1]*58)",
    )
    g.add_argument("--moe-ffn-hidden-size", type=int, default=None, help="default: --ffn-hidden-size")
    g.add_argument("--moe-shared-expert-intermediate-size", type=int, default=None)
    g.add_argument("--moe-grouped-gemm", action="store_true", help="built as per-expert GEMMs (see model.py)")
    g.add_argument("--moe-token-dispatcher-type", choices=("allgather", "alltoall"), default="allgather")
    g.add_argument("--moe-router-topk", type=int, default=2)
    g.add_argument("--moe-router-score-function", choices=("softmax", "sigmoid"), default="softmax")
    g.add_argument("--moe-router-dtype", choices=("fp32", "fp64"), default=None)
    g.add_argument("--moe-router-enable-expert-bias", action="store_true")
    g.add_argument("--moe-router-topk-scaling-factor", type=float, default=None)
    g.add_argument("--moe-router-num-groups", type=int, default=None)
    g.add_argument("--moe-router-group-topk", type=int, default=None)
    g.add_argument(
        "--moe-router-load-balancing-type",
        choices=("aux_loss", "seq_aux_loss", "global_aux_loss", "sinkhorn", "none"),
        default="aux_loss",
    )
    g.add_argument("--moe-aux-loss-coeff", type=float, default=0.0)


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m prism_megatron.megatron.entry.pretrain",
        description="Built-in megatron-core GPT pretraining entry (mock data) with Megatron-LM flag names.",
        allow_abbrev=False,
    )
    _model_args(parser)
    _mla_args(parser)
    _parallel_args(parser)
    _training_args(parser)
    _moe_args(parser)
    training_log.add_arguments(parser)
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
    """Megatron-LM's `validate_args` for these flags, where it needs only the flags (ValueError names
    the flag)."""
    if args.bf16 and args.fp16:
        raise ValueError("--bf16 and --fp16 are exclusive; pass one")
    _derive_model(args)
    _derive_pipeline(args)
    _derive_moe(args)


def _derive_model(args: argparse.Namespace) -> None:
    if args.max_position_embeddings is None:
        args.max_position_embeddings = args.seq_length
    if args.ffn_hidden_size is None:
        args.ffn_hidden_size = (
            int(args.hidden_size * 4 * 2 / 3 / 64) * 64 if args.swiglu else 4 * args.hidden_size
        )
    if args.kv_channels is None:
        if args.hidden_size % args.num_attention_heads:
            raise ValueError(
                f"--hidden-size {args.hidden_size} is not divisible by --num-attention-heads "
                f"{args.num_attention_heads}; pass --kv-channels"
            )
        args.kv_channels = args.hidden_size // args.num_attention_heads
    if args.tensor_model_parallel_size == 1:
        args.sequence_parallel = False  # Megatron-LM: "Disabling sequence parallelism because TP is 1"
    if args.expert_tensor_parallel_size is None:
        args.expert_tensor_parallel_size = args.tensor_model_parallel_size
    _derive_context_parallel(args)
    if args.multi_latent_attention and args.group_query_attention:
        raise ValueError("--multi-latent-attention and --group-query-attention are exclusive; pass one")
    if args.mtp_num_layers and args.position_embedding_type != "rope":
        raise ValueError(
            f"--mtp-num-layers needs --position-embedding-type rope, got {args.position_embedding_type}"
        )


def _derive_context_parallel(args: argparse.Namespace) -> None:
    """Megatron-LM's rules for --cp-comm-type and --hierarchical-context-parallel-sizes."""
    sizes = args.hierarchical_context_parallel_sizes
    if sizes is not None and math.prod(sizes) != args.context_parallel_size:
        raise ValueError(
            f"--hierarchical-context-parallel-sizes {' '.join(map(str, sizes))} must multiply to "
            f"--context-parallel-size {args.context_parallel_size}"
        )
    if "a2a+p2p" in args.cp_comm_type and sizes is None:
        raise ValueError("--cp-comm-type a2a+p2p needs --hierarchical-context-parallel-sizes")
    if len(args.cp_comm_type) not in (1, args.num_layers):
        raise ValueError(
            f"--cp-comm-type takes one type or one per layer ({args.num_layers}), got {len(args.cp_comm_type)}"
        )


def _derive_pipeline(args: argparse.Namespace) -> None:
    pp = args.pipeline_model_parallel_size
    uneven = (
        args.decoder_first_pipeline_num_layers is not None
        or args.decoder_last_pipeline_num_layers is not None
    )
    if args.num_layers_per_virtual_pipeline_stage is not None:
        if uneven:
            raise ValueError(
                "--num-layers-per-virtual-pipeline-stage cannot be combined with "
                "--decoder-first/last-pipeline-num-layers; pass --virtual-pipeline-model-parallel-size"
            )
        if args.num_layers % pp:
            raise ValueError(
                f"--num-layers {args.num_layers} must be divisible by --pipeline-model-parallel-size {pp}"
            )
        per_stage = args.num_layers // pp
        if per_stage % args.num_layers_per_virtual_pipeline_stage:
            raise ValueError(
                f"layers per pipeline stage ({per_stage}) must be divisible by "
                f"--num-layers-per-virtual-pipeline-stage {args.num_layers_per_virtual_pipeline_stage}"
            )
        args.virtual_pipeline_model_parallel_size = per_stage // args.num_layers_per_virtual_pipeline_stage
    if args.virtual_pipeline_model_parallel_size == 1:
        args.virtual_pipeline_model_parallel_size = None
    if uneven:
        _check_uneven_stages(args)
    elif args.num_layers % pp:
        raise ValueError(
            f"--num-layers {args.num_layers} must be divisible by --pipeline-model-parallel-size {pp}"
        )
    if args.virtual_pipeline_model_parallel_size is None:
        args.overlap_p2p_communication = False
        args.align_param_gather = False
    elif pp < 2 or (pp < 3 and not args.overlap_p2p_communication):
        raise ValueError(
            "the interleaved schedule needs --pipeline-model-parallel-size >= 2 (>= 3 with --no-overlap-p2p-communication)"
        )


def _check_uneven_stages(args: argparse.Namespace) -> None:
    """megatron-core's rule for uneven first and last stages (`TransformerConfig.__post_init__`): the
    layers left between them split evenly over the middle stages, and every count over the chunks."""
    vpp = args.virtual_pipeline_model_parallel_size or 1
    middle_layers, middle_stages = args.num_layers, args.pipeline_model_parallel_size
    for flag, layers in (
        ("--decoder-first-pipeline-num-layers", args.decoder_first_pipeline_num_layers),
        ("--decoder-last-pipeline-num-layers", args.decoder_last_pipeline_num_layers),
    ):
        if layers is None:
            continue
        if layers <= 0 or layers % vpp:
            raise ValueError(
                f"{flag} {layers} must be a positive multiple of the {vpp} model chunks per stage"
            )
        middle_layers -= layers
        middle_stages -= 1
    per_middle_stage = middle_layers // middle_stages if middle_stages > 0 else 0
    if (
        middle_stages < 0
        or middle_layers < 0
        or bool(middle_layers) != bool(middle_stages)
        or (middle_stages and (middle_layers % middle_stages or per_middle_stage % vpp))
    ):
        raise ValueError(
            f"--num-layers {args.num_layers} minus --decoder-first/last-pipeline-num-layers leaves "
            f"{middle_layers} layers for {middle_stages} middle stages of --pipeline-model-parallel-size "
            f"{args.pipeline_model_parallel_size}; they must split evenly (into whole model chunks)"
        )


def _derive_moe(args: argparse.Namespace) -> None:
    if args.num_experts == 0:
        args.num_experts = None
    ep = args.expert_model_parallel_size
    if args.num_experts is None:
        if ep > 1:
            raise ValueError(f"--expert-model-parallel-size {ep} needs --num-experts")
        return
    if args.num_experts % ep:
        raise ValueError(
            f"--num-experts {args.num_experts} must be divisible by --expert-model-parallel-size {ep}"
        )
    if args.moe_ffn_hidden_size is None:
        args.moe_ffn_hidden_size = args.ffn_hidden_size
    if isinstance(args.moe_layer_freq, list) and len(args.moe_layer_freq) != args.num_layers:
        raise ValueError(
            f"--moe-layer-freq lists {len(args.moe_layer_freq)} layers; --num-layers is {args.num_layers}"
        )
    if args.tensor_model_parallel_size > 1 and not args.sequence_parallel:
        raise ValueError(
            "MoE with --tensor-model-parallel-size > 1 needs --sequence-parallel (megatron-core refuses to "
            "train it without)"
        )


def check_local_spec(args: argparse.Namespace) -> None:
    """Refuse, naming the flag, what the built-in entry's local layers cannot run.

    Kept apart from `derive` so that every production configuration still parses (for planning and
    shrinking) while a run of it fails before any process group exists.
    """
    if args.hierarchical_context_parallel_sizes and importlib.util.find_spec("einops") is None:
        raise ValueError(
            "--hierarchical-context-parallel-sizes needs the einops package (megatron-core builds the "
            "hierarchical groups with it); pip install einops"
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
