"""Arguments of the built-in training entry: Megatron-LM's flag names, for what the entry supports.

A user moving between this entry and Megatron-LM's `pretrain_gpt.py` keeps their flags: every flag of
the shipped production configurations (`launch/configs/*.args`) is accepted, with Megatron-LM's
defaults (`megatron/training/arguments.py`, tag core_v0.16.1) and its `validate_args` derivations.
The target job's flags (layout, schedule, batch, model shape) and their derivations are the ones
every command shares (`prism_megatron.megatron.job.target`); this module adds the entry's own.
Flags that only matter to a real training run's bookkeeping (checkpoints, evaluation, LR schedule,
the masked-softmax and persistent-norm kernels) are accepted and ignored, so a production command
line parses; any other flag is an error that names it and points at `--script`. The kernel-fusion
switches (`FUSION_SWITCHES`, `--cross-entropy-loss-fusion` and its `--cross-entropy-fusion-impl`) do
not change what the CPU program computes (it runs unfused); on a modelled GPU they choose fused or
unfused charging.

Sequence and context parallelism run on the local layers of `prism_megatron.megatron.layers`, put in
the layer spec by `parallel_spec`. What the entry still cannot run is refused by `check_local_spec`,
after parsing, so that a configuration still parses and can be planned or shrunk.
"""

from __future__ import annotations

import argparse
import importlib.util
import math

from prism_megatron.config import RaisingParser, add_prism_arguments
from prism_megatron.megatron.entry import MOCK_VOCAB_SIZE, training_log
from prism_megatron.megatron.job import flags, target

LOCAL_POSITION_EMBEDDINGS = ("learned_absolute", "rope")
"""The position embeddings of the entry's GPT (Megatron-LM declares more, `job.flags`)."""
MLA_FLAGS = ("--q-lora-rank", "--kv-lora-rank", "--qk-head-dim", "--qk-pos-emb-head-dim", "--v-head-dim",
             "--rotary-scaling-factor", "--mscale", "--mscale-all-dim")  # fmt: skip
"""Multi-latent attention's flags beyond the switch (Megatron-LM's declarations, `job.flags`)."""
REQUIRED = (
    "num_layers",
    "hidden_size",
    "num_attention_heads",
    "seq_length",
    "micro_batch_size",
    "train_iters",
)

# Accepted for command-line compatibility; they do not change what the emulated step computes.
IGNORED_SWITCHES = (
    "--no-masked-softmax-fusion",
    "--no-persist-layer-norm",
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
    "--data-cache-path",
)


ATTENTION_BACKENDS = ("flash", "fused", "unfused", "local", "auto")
"""megatron-core's `AttnBackend` names, as Megatron-LM's --attention-backend takes them."""


def _model_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("model")
    g.add_argument("--qk-layernorm", action="store_true")
    flags.add_megatron_lm_flags(g.add_argument, ("--position-embedding-type", "--rotary-base"))
    g.add_argument("--normalization", choices=("LayerNorm", "RMSNorm"), default="LayerNorm")
    g.add_argument("--disable-bias-linear", action="store_true")
    g.add_argument("--hidden-dropout", type=float, default=0.1)
    g.add_argument("--attention-dropout", type=float, default=0.1)
    g.add_argument("--init-method-std", type=float, default=0.02)
    g.add_argument("--mtp-loss-scaling-factor", type=float, default=0.1)
    g.add_argument(
        "--transformer-impl", choices=("local",), default="local", help="only the local spec runs without TE"
    )
    g.add_argument(
        "--attention-backend",
        choices=ATTENTION_BACKENDS,
        default="auto",
        help="as Megatron-LM: on cpu and cuda the local spec's attention materialises its scores whatever "
        "the choice; on --prism-device model:<gpu>, unfused and local keep that kernel (its GEMMs and "
        "softmax timed and its scores held as a GPU would), the others run as one fused kernel, timed as "
        "FlashAttention-3 (flash) or cuDNN's fused attention (fused; auto on Hopper and later, as "
        "Transformer Engine picks)",
    )
    g.add_argument("--bf16", action="store_true")
    g.add_argument("--fp16", action="store_true")


def _mla_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("multi-latent attention")
    g.add_argument("--multi-latent-attention", action="store_true")
    flags.add_megatron_lm_flags(g.add_argument, MLA_FLAGS)


def _parallel_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("parallelism")
    flags.add_megatron_lm_flags(g.add_argument, ("--cp-comm-type",))  # the layers check the values
    g.add_argument("--hierarchical-context-parallel-sizes", nargs="+", type=int, default=None)
    g.add_argument(
        "--variable-seq-lengths", action="store_true", help="pipeline stages exchange shapes first"
    )
    g.add_argument(
        "--tp-comm-overlap",
        action="store_true",
        help="Transformer Engine's userbuffers overlap of the sequence-parallel all-gathers and "
        "reduce-scatters with their GEMMs: modelled on --prism-device model:<gpu>; on cpu and cuda the "
        "local layers have no userbuffers and the flag changes nothing (a note says so)",
    )


def _training_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("training")
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
    flags.add_megatron_lm_flags(
        g.add_argument,
        ("--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather", "--ddp-bucket-size",
         "--accumulate-allreduce-grads-in-fp32"),
    )  # fmt: skip
    g.add_argument("--no-align-grad-reduce", action="store_false", dest="align_grad_reduce")
    g.add_argument("--no-align-param-gather", action="store_false", dest="align_param_gather")
    g.add_argument("--recompute-granularity", choices=("full", "selective"), default=None)
    g.add_argument("--recompute-method", choices=("uniform", "block"), default=None)
    g.add_argument("--recompute-num-layers", type=int, default=None)
    g.add_argument("--log-interval", type=int, default=1)


FUSION_SWITCHES = (
    ("--no-gradient-accumulation-fusion", "gradient_accumulation_fusion"),
    ("--no-bias-gelu-fusion", "bias_gelu_fusion"),
    ("--no-bias-swiglu-fusion", "bias_swiglu_fusion"),
    ("--no-bias-dropout-fusion", "bias_dropout_fusion"),
    ("--no-rope-fusion", "apply_rope_fusion"),
)
"""Megatron-LM's kernel-fusion switches (on by default) and their dests. The entry's CPU program runs
unfused either way (no Transformer Engine or apex); on a modelled GPU each fusion that is on is
charged as the fused kernel (`megatron.run.modelled_fusions`)."""


def _fusion_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("kernel fusions (charged as fused kernels on --prism-device model:<gpu>)")
    for flag, dest in FUSION_SWITCHES:
        g.add_argument(flag, action="store_false", dest=dest)
    g.add_argument("--cross-entropy-loss-fusion", action="store_true")
    g.add_argument(
        "--cross-entropy-fusion-impl",
        choices=("native", "te"),
        default="native",
        help="with --cross-entropy-loss-fusion: Megatron's @jit_fuser functions (native, charged op by op "
        "on a modelled GPU) or Transformer Engine's kernel (te, charged as one kernel each way)",
    )


def _moe_args(parser: argparse.ArgumentParser) -> None:
    g = parser.add_argument_group("mixture of experts")
    g.add_argument("--moe-grouped-gemm", action="store_true", help="built as per-expert GEMMs (see model.py)")
    g.add_argument("--moe-token-dispatcher-type", choices=("allgather", "alltoall"), default="allgather")
    g.add_argument("--moe-router-score-function", choices=("softmax", "sigmoid"), default="softmax")
    g.add_argument("--moe-router-dtype", choices=("fp32", "fp64"), default=None)
    g.add_argument("--moe-router-enable-expert-bias", action="store_true")
    g.add_argument("--moe-router-topk-scaling-factor", type=float, default=None)
    g.add_argument("--moe-router-num-groups", type=int, default=None)
    g.add_argument("--moe-router-group-topk", type=int, default=None)
    flags.add_megatron_lm_flags(g.add_argument, ("--moe-router-load-balancing-type", "--moe-aux-loss-coeff"))


def build_parser() -> argparse.ArgumentParser:
    """The entry's parser; a mistake raises ValueError (one line: the launcher prints it, exit 2)."""
    parser = RaisingParser(
        prog="python -m prism_megatron.megatron.entry.pretrain",
        description="Built-in megatron-core GPT pretraining entry (mock data) with Megatron-LM flag names.",
    )
    target.add_job_arguments(parser, required=REQUIRED)
    parser.set_defaults(vocab_size=MOCK_VOCAB_SIZE)
    _model_args(parser)
    _mla_args(parser)
    _parallel_args(parser)
    _training_args(parser)
    _moe_args(parser)
    _fusion_args(parser)
    training_log.add_arguments(parser)
    ignored = parser.add_argument_group("accepted and ignored (bookkeeping of a real run)")
    # Under a name of their own, so that no config built from the args copies them (`core_config`).
    for flag in IGNORED_SWITCHES:
        ignored.add_argument(flag, action="store_true", dest=_ignored(flag), help=argparse.SUPPRESS)
    for flag in IGNORED_VALUED:
        ignored.add_argument(flag, dest=_ignored(flag), help=argparse.SUPPRESS)
    add_prism_arguments(parser)
    return parser


def _ignored(flag: str) -> str:
    return "ignored_" + flag.removeprefix("--").replace("-", "_")


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
    the flag): the target job's (`target.derive`), then the entry's own."""
    if args.bf16 and args.fp16:
        raise ValueError("--bf16 and --fp16 are exclusive; pass one")
    target.derive(args)
    if args.bf16:  # arguments.py: "bfloat16 requires gradient accumulation and all-reduce in fp32"
        args.accumulate_allreduce_grads_in_fp32 = True
    if args.position_embedding_type not in LOCAL_POSITION_EMBEDDINGS:
        raise ValueError(
            f"--position-embedding-type {args.position_embedding_type}: the built-in entry builds "
            f"{' or '.join(LOCAL_POSITION_EMBEDDINGS)}; run Megatron-LM's pretrain_gpt.py with --script for it"
        )
    if args.virtual_pipeline_model_parallel_size is None:
        args.align_param_gather = False  # arguments.py: not without the interleaved schedule
    _derive_context_parallel(args)
    _check_tp_comm_overlap(args)
    if args.multi_latent_attention and args.group_query_attention:
        raise ValueError("--multi-latent-attention and --group-query-attention are exclusive; pass one")
    if args.mtp_num_layers and args.position_embedding_type != "rope":
        raise ValueError(
            f"--mtp-num-layers needs --position-embedding-type rope, got {args.position_embedding_type}"
        )
    _derive_moe(args)


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


TP_COMM_OVERLAP_NOTE = (
    "note: --tp-comm-overlap is modelled only on --prism-device model:<gpu>; on a cpu or cuda device the "
    "built-in entry's local layers have no Transformer Engine userbuffers, so the tensor-parallel "
    "all-gathers and reduce-scatters stay on the compute stream as megatron-core issues them (the flag "
    "changes nothing there)"
)
"""What a run of the flag on a real device says (the entry's first real rank, and `emulate`)."""


def _check_tp_comm_overlap(args: argparse.Namespace) -> None:
    """Megatron-LM's rule: TP communication/GEMM overlap needs sequence parallelism, which TP 1 turns
    off (`validate_args`, after `target.derive` has done so)."""
    if args.tp_comm_overlap and not args.sequence_parallel:
        tp = args.tensor_model_parallel_size
        why = "--tensor-model-parallel-size 1 turns sequence parallelism off" if tp == 1 else "it is not set"
        raise ValueError(
            "--tp-comm-overlap needs --sequence-parallel and --tensor-model-parallel-size > 1 (tensor-"
            f"parallel communication overlaps its GEMMs only with sequence parallelism; {why})"
        )


def _derive_moe(args: argparse.Namespace) -> None:
    if args.num_experts is None:
        return
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
    """What depends on the world size: DP and the global batch (Megatron-LM's rules, `target`)."""
    target.derive_world(args, world_size)
