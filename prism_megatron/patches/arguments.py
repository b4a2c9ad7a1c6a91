"""Megatron-LM's argument hooks: `--prism-*` on its parser, the target world in `validate_args`.

Megatron-LM parses its flags in `parse_args`, which calls `add_megatron_arguments` (looked up as a
module global, so wrapping it adds prism's group whatever `extra_args_provider` the script passes),
then `validate_args` derives DP, VPP and the global batch from `args.world_size`. Under torchrun that
is the number of real processes; prism sets it to W and `args.rank` to the virtual rank this process
executes before the original runs, so every derivation is the target job's.

Also the single `get_args()` adapter: no other prism module calls Megatron-LM's `get_args()`.
"""

from __future__ import annotations

import argparse
import os

from prism_megatron.config import add_prism_arguments
from prism_megatron.megatron.job import target
from prism_megatron.patches.registry import Patch, variants
from prism_megatron.patches.run import Run
from prism_megatron.patches.versions import EVERY_VERIFIED, MEGATRON_CORE_0_16, MEGATRON_CORE_0_19


def megatron_lm_args() -> argparse.Namespace:
    """Megatron-LM's global args (the one place prism reads them)."""
    from megatron.training import get_args

    return get_args()


def parallel_sizes(args: argparse.Namespace) -> target.ParallelSizes:
    """The target job's parallel sizes from Megatron-LM's args, before `validate_args` runs: the
    target job's derivation (`megatron.job.target`) on a copy of them, so `validate_args` still
    derives everything itself on the args the script parsed."""
    return target.derive(target.copy_of_job_flags(args)).sizes


def _add_arguments(original):
    def add_megatron_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
        return add_prism_arguments(original(parser))

    return add_megatron_arguments


def _set_target_world(rt: Run, args: argparse.Namespace) -> None:
    """args.world_size = W and args.rank = this process's virtual rank; remember the sizes."""
    rt.sizes = parallel_sizes(args)
    if not rt.config.emulation.emulate:
        return
    real_ranks = rt.real_ranks()
    physical_rank = int(os.environ.get("RANK", "0"))
    rt.check_process_count(real_ranks)
    args.world_size = rt.config.emulation.world_size
    args.rank = real_ranks[physical_rank]


def _keep_data_flags_real(rt: Run, args: argparse.Namespace) -> None:
    """Rank 0 decides do_train/do_valid/do_test and broadcasts them; when it is virtual, decide here.

    Rank 0 sets each flag when its data loader exists and there are iterations to run; with mock or
    real data its loaders exist, so the flags follow the iteration counts (Megatron-LM's own rule).
    On a modelled GPU (`--prism-device model:<gpu>`) the flags are decided here too, even on a real
    rank 0: they travel in a three-element tensor, which fake tensors hold no value of (the read
    would be the stand-in 0: no training).
    """
    modelled = rt.config.emulation.modelled_gpu is not None
    if not rt.config.emulation.emulate or (rt.world_is_real(0) and not modelled):
        return
    args.do_train = bool(args.train_iters and args.train_iters > 0)
    evaluating = bool(getattr(args, "full_validation", False) or args.eval_iters > 0)
    args.do_valid = args.do_test = evaluating


MODELLED_STAND_INS: tuple[tuple[str, str, object, str], ...] = (
    (
        "transformer_impl",
        "--transformer-impl local",
        "local",
        "Transformer Engine's layers need CUDA; megatron-core's local spec builds the same parameters, and "
        "the modelled device charges its attention and norms as Transformer Engine's fused kernels",
    ),
    (
        "apply_rope_fusion",
        "--no-rope-fusion",
        False,
        "the fused RoPE kernel is Transformer Engine's; RoPE runs as torch ops, charged as the fused "
        "kernel (the flag as written decides)",
    ),
    (
        "gradient_accumulation_fusion",
        "--no-gradient-accumulation-fusion",
        False,
        "the fused weight-gradient accumulation is an apex / Transformer Engine CUDA extension; the "
        "CPU adds into the gradient buffer apart, charged as the fused GEMM's FP32 accumulation (the "
        "flag as written decides)",
    ),
    (
        "moe_grouped_gemm",
        "--moe-grouped-gemm off",
        False,
        "Transformer Engine's grouped experts need CUDA and the legacy GroupedMLP the grouped_gemm package; "
        "megatron-core's SequentialMLP holds the same per-expert weights and runs one GEMM per expert, each "
        "charged with its balanced token count (gpu_model/README.md), as the built-in entry builds it",
    ),
    (
        "moe_permute_fusion",
        "--moe-permute-fusion off",
        False,
        "the fused MoE permutation kernels are Transformer Engine's; the permutation runs as torch ops "
        "(index gathers and scatters), charged op by op",
    ),
    (
        "no_persist_layer_norm",
        "--no-persist-layer-norm",
        True,
        "the persistent norm kernel is apex's; the norm is charged as Transformer Engine's fused norm",
    ),
    (
        "cross_entropy_loss_fusion",
        "--cross-entropy-loss-fusion off",
        False,
        "Transformer Engine's cross-entropy needs CUDA and Megatron's native one torch.compile; the "
        "unfused ops run, charged as one kernel each way for --cross-entropy-fusion-impl te and op by op "
        "for native (megatron/run/modelled_fusions.py; the flags as written decide)",
    ),
)
"""What a modelled GPU runs in place of a flag whose kernels need Transformer Engine or apex (both
absent on the CPU): (args attribute, the flag that selects the stand-in, its value, why)."""


MODELLED_STAND_INS_AFTER_CHECKS: tuple[tuple[str, str, object, str], ...] = (
    (
        "tp_comm_overlap",
        "--tp-comm-overlap off",
        False,
        "userbuffers are Transformer Engine's; the collectives run blocking on the CPU and are charged "
        "as TE overlaps them with their GEMMs (megatron/run/tp_overlap.py)",
    ),
)
"""Stand-ins applied after Megatron-LM's own `validate_args`, so that its checks of the flag as
written still run (--tp-comm-overlap needs --sequence-parallel), and before `initialize_megatron`
would build TE's userbuffers."""


AS_WRITTEN = "prism_as_written"
"""The args attribute holding, per stand-in, the value the flags gave ({attribute: value})."""


def _modelled_stand_ins(
    rt: Run,
    args: argparse.Namespace,
    stand_ins: tuple[tuple[str, str, object, str], ...] = MODELLED_STAND_INS,
) -> list[str]:
    """On a modelled GPU, the flags of `MODELLED_STAND_INS` that need them; returns one line each.
    The values as written are kept (`as_written`): what a GPU run fuses follows them, not the
    stand-in the CPU runs."""
    if rt.config.emulation.modelled_gpu is None:
        return []
    lines = []
    written = getattr(args, AS_WRITTEN, {})
    for attribute, flag, value, why in stand_ins:
        if getattr(args, attribute, value) != value:
            lines.append(f"{flag} (was {attribute}={getattr(args, attribute)}): {why}")
            written.setdefault(attribute, getattr(args, attribute))
            setattr(args, attribute, value)
    setattr(args, AS_WRITTEN, written)
    return lines


def as_written(args: argparse.Namespace) -> argparse.Namespace:
    """A copy of Megatron-LM's args with the modelled device's stand-ins undone: the job the flags
    describe (which fusions a GPU run has), for charging what a GPU runs."""
    copy = argparse.Namespace(**vars(args))
    for attribute, value in getattr(args, AS_WRITTEN, {}).items():
        setattr(copy, attribute, value)
    return copy


def _validate(original, *, run: Run):
    def validate_args(args, defaults={}):  # noqa: B006  (Megatron-LM's own signature)
        _set_target_world(run, args)
        for line in _modelled_stand_ins(run, args):
            print(f"prism: --prism-device {run.config.emulation.device} runs {line}", flush=True)
        result = original(args, defaults)
        for line in _modelled_stand_ins(run, args, MODELLED_STAND_INS_AFTER_CHECKS):
            print(f"prism: --prism-device {run.config.emulation.device} runs {line}", flush=True)
        _keep_data_flags_real(run, args)
        return result

    return validate_args


ARGUMENT_RECORDS: tuple[Patch, ...] = (
    Patch(
        name="megatron_lm.prism_arguments",
        target="megatron.training.arguments:add_megatron_arguments",
        make=_add_arguments,
        verified_on=EVERY_VERIFIED,
        reason="adds the --prism-* group to Megatron-LM's parser without editing the user's script; "
        "parse_args looks this function up at call time",
        signature="(parser: argparse.ArgumentParser)",
    ),
    *variants(
        name="megatron_lm.validate_args",
        target="megatron.training.arguments:validate_args",
        make=_validate,
        needs=("run",),
        reason="every derivation (DP, global batch, VPP) must see the target world size W and the "
        "virtual rank, not torchrun's; and do_train/do_valid/do_test come from a virtual rank 0",
        signature="(args, defaults={})",
        by_release={
            MEGATRON_CORE_0_16: {"importers": ("megatron.training.initialize",)},
            # The script calls arguments.parse_and_validate_args, which looks it up in its module.
            MEGATRON_CORE_0_19: {"importers": ()},
        },
    ),
)
"""The argument hooks (validate_args bound to the run, a `run.Run`)."""
