"""Megatron-LM's "last rank" duties on the last real rank: its log line, TensorBoard and W&B writers.

Why: Megatron-LM prints the iteration line (`print_rank_last`) and creates its TensorBoard and W&B
writers (`global_vars._set_tensorboard_writer` / `_set_wandb_writer`, `args.rank == world_size - 1`)
on rank W-1 only. Under emulation `args.rank` is the virtual rank and W-1 is usually virtual, so a
run of Megatron-LM's own script would print no iteration line and write no event file. These records
give those duties to the last real rank (the highest virtual rank run for real), which is the same
rank when W-1 is real. In the capture pass no writers are made: its iterations are the slice's
recording, not the run a user reads in TensorBoard.

No extension point: the rank test is inlined in Megatron-LM's functions (`is_last_rank` reads
torch.distributed's rank; the writer setters read `args.rank`).
"""

from __future__ import annotations

from prism_megatron.patches.registry import Patch, variants
from prism_megatron.patches.run import Run
from prism_megatron.patches.versions import EVERY_VERIFIED, MEGATRON_CORE_0_16, MEGATRON_CORE_0_19


def last_real_rank(rt: Run) -> int | None:
    """The highest virtual rank a real process runs; None without emulation (Megatron's rule holds)."""
    if not rt.config.emulation.emulate or rt.sizes is None:
        return None
    return max(rt.real_ranks())


def _is_last_rank(original, *, run: Run):
    def is_last_rank():
        last = last_real_rank(run)
        return original() if last is None else run.virtual_rank == last

    return is_last_rank


def _writer_setter(original, *, run: Run):
    """Run Megatron's setter as if this were rank W-1 on the last real rank, as no rank elsewhere."""

    def set_writer(args):
        last = last_real_rank(run)
        if last is None:
            return original(args)
        saved = args.rank
        in_capture = run.config.emulation.phase == "capture"
        args.rank = args.world_size - 1 if saved == last and not in_capture else -1
        try:
            return original(args)
        finally:
            args.rank = saved

    return set_writer


def writer_records() -> tuple[Patch, ...]:
    """The records (bound to a run, as `run`: a `run.Run`)."""
    return (
        *variants(
            name="megatron_lm.last_rank_is_last_real_rank",
            make=_is_last_rank,
            needs=("run",),
            reason="print_rank_last (the iteration line) and the last-rank duties of training.py run on "
            "rank W-1, usually virtual under emulation; the last real rank takes them",
            signature="()",
            by_release={
                MEGATRON_CORE_0_16: {
                    "target": "megatron.training.utils:is_last_rank",
                    "importers": (
                        "megatron.training",
                        "megatron.training.training",
                        "megatron.training.checkpointing",
                    ),
                },
                # core_v0.19.0 made megatron.training.utils a package: the function lives in its
                # common_utils (print_rank_last calls it there) and the package re-exports it.
                MEGATRON_CORE_0_19: {
                    "target": "megatron.training.utils.common_utils:is_last_rank",
                    "importers": (
                        "megatron.training",
                        "megatron.training.utils",
                        "megatron.training.training",
                        "megatron.training.checkpointing",
                    ),
                },
            },
        ),
        Patch(
            name="megatron_lm.tensorboard_writer_on_last_real_rank",
            target="megatron.training.global_vars:_set_tensorboard_writer",
            make=_writer_setter,
            needs=("run",),
            verified_on=EVERY_VERIFIED,
            reason="the TensorBoard writer is made where args.rank == world_size - 1, usually a virtual rank",
            signature="(args)",
        ),
        Patch(
            name="megatron_lm.wandb_writer_on_last_real_rank",
            target="megatron.training.global_vars:_set_wandb_writer",
            make=_writer_setter,
            needs=("run",),
            verified_on=EVERY_VERIFIED,
            reason="the W&B run is made where args.rank == world_size - 1, usually a virtual rank",
            signature="(args)",
        ),
    )
