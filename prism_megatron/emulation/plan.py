"""The plan of one emulation run, made before any process starts: job, ranks, passes, run folder.

Everything a user can get wrong on the command line is checked here, so a mistake costs one line
and exit status 2 instead of a failed launch minutes later.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import time
from collections.abc import Sequence

from prism_megatron.config import PrismConfig, parse_prism_flags
from prism_megatron.emulation.capture_slice import with_slice
from prism_megatron.megatron.job import target
from prism_megatron.topology import Layout, RoleClass

BUILTIN = "builtin"


def megatron_flags(megatron_args: Sequence[str]) -> argparse.Namespace:
    """The target job's flags as Megatron-LM names them (`megatron.job.target`; the script parses the
    rest), and `--train-iters`; not yet derived."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    target.add_job_arguments(parser)
    parser.add_argument("--train-iters", type=int, default=None)

    def one_line(message: str):  # argparse would print its usage (25 lines) first
        raise ValueError(f"Megatron flags: {message}")

    parser.error = one_line  # type: ignore[method-assign]
    return parser.parse_known_args(list(megatron_args))[0]


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """One run of `prism-megatron emulate`: what is emulated, by whom, in which passes, where."""

    config: PrismConfig
    megatron_args: tuple[str, ...]
    """The user's flags after `--` (Megatron's and --prism-*), passed on to every launch."""
    script: str
    flags: argparse.Namespace
    """The target job's flags after Megatron-LM's derivations (`megatron.job.target.derive`)."""
    layout: Layout
    real_ranks: tuple[int, ...]
    """Ranks the emulation runs for real (--prism-ranks), one process each."""
    slice_ranks: tuple[int, ...]
    """Ranks the capture runs: one per class of roles that run the same program (`capture_slice`)."""
    nproc: int
    """Real processes at once on this machine: the size of each capture pass."""
    out_dir: str
    role_classes: tuple[RoleClass, ...] = ()
    """The job's roles in classes that run the same program (every role its own with
    --prism-capture-all-roles)."""
    reused_graph: object | None = dataclasses.field(default=None, repr=False, compare=False)
    """The graph --prism-graph names, as the checks before the run loaded it (an `ExecutionGraph`;
    built from a capture folder, or read), so the run does not load or build it a second time."""

    @property
    def capture_batches(self) -> list[tuple[int, ...]]:
        """The slice in passes of `nproc` ranks (fewer devices than roles: several passes)."""
        ranks = self.slice_ranks
        return [ranks[i : i + self.nproc] for i in range(0, len(ranks), self.nproc)]

    @property
    def modelled(self) -> bool:
        """The device is a modelled GPU (--prism-device model:<gpu>): capture, simulate and report,
        no emulation pass (the simulated iteration is the modelled one)."""
        return self.config.emulation.modelled_gpu is not None

    @property
    def reuses_graph(self) -> bool:
        return self.config.capture.graph is not None

    def path(self, *parts: str) -> str:
        return os.path.join(self.out_dir, *parts)

    @property
    def num_microbatches(self) -> int | None:
        return self.flags.num_microbatches

    @property
    def job(self) -> target.TargetJob:
        """The target job the flags describe (layout sizes, schedule, batch, model shape)."""
        return target.target_job(self.flags, world_size=self.layout.world_size)


def plan_run(
    megatron_args: Sequence[str],
    *,
    script: str = BUILTIN,
    nproc: int | None = None,
    now_s: float | None = None,
    existing_run: bool = False,
) -> RunPlan:
    """Check the command line and plan the run (no process starts, nothing is written); the checks
    that need the plan (cluster, script, run folder, a reused graph) are `preflight.check`'s.

    `existing_run`: plan the report of a run folder that already holds the passes' outputs.

    Raises:
        ValueError: a flag, value or combination that cannot run; the message names it.
    """
    config = parse_prism_flags(list(megatron_args))
    if not config.emulation.emulate:
        raise ValueError("--prism-emulate is needed to emulate a job (with --prism-world-size)")
    if config.emulation.phase != "auto":
        raise ValueError(
            f"--prism-phase {config.emulation.phase} is for processes started by hand; "
            "prism-megatron emulate runs every pass itself"
        )
    flags = megatron_flags(megatron_args)
    _check_counts(flags)
    layout = target.derive(flags, world_size=config.emulation.world_size).layout()
    real = target.select_real_ranks(layout, config.emulation.ranks)
    if config.emulation.modelled_gpu is not None:
        _check_modelled(config, script, flags)
        # On a modelled GPU every capture process is alone (its peers, all virtual, answer from the
        # replay engine): fake tensors hold no data for a real peer to exchange.
        nproc = 1
    nproc = len(real) if nproc is None else nproc
    if nproc < len(real) and config.emulation.modelled_gpu is None:
        raise ValueError(
            f"--nproc-per-node {nproc} is fewer than the {len(real)} real ranks --prism-ranks selects "
            f"({', '.join(map(str, real[:8]))}); the emulation runs one process per real rank"
        )
    out_dir = config.output.resolved_out({}, time.time() if now_s is None else now_s)
    if existing_run and not os.path.isdir(out_dir):
        raise ValueError(f"--prism-out {out_dir} is not a run folder; give the one the passes wrote to")
    if not existing_run:
        check_out_dir(out_dir, overwrite=config.output.overwrite)
    if config.capture.graph is not None and not os.path.exists(config.capture.graph):
        raise ValueError(f"--prism-graph {config.capture.graph}: no such graph directory")
    plan = RunPlan(
        config=config,
        megatron_args=tuple(megatron_args),
        script=script,
        flags=flags,
        layout=layout,
        real_ranks=real,
        slice_ranks=(),
        nproc=nproc,
        out_dir=out_dir,
    )
    plan = with_slice(plan)
    from prism_megatron.emulation import preflight  # it reads the plan

    graph = preflight.check(plan, existing_run=existing_run)
    return dataclasses.replace(plan, reused_graph=graph) if graph is not None else plan


def _check_modelled(config: PrismConfig, script: str, flags: argparse.Namespace) -> None:
    if script != BUILTIN:
        raise ValueError(
            f"--prism-device {config.emulation.device} runs the built-in entry; --script {script} on a "
            "modelled GPU is not supported yet (use --prism-device cpu or cuda for a Megatron-LM script)"
        )
    if getattr(flags, "num_experts", None):
        raise ValueError(
            f"--num-experts {flags.num_experts} on --prism-device {config.emulation.device}: MoE routing reads "
            "token counts out of tensors, which a modelled GPU has no stand-in for yet; use a dense model"
        )
    if config.capture.graph is not None:
        raise ValueError(
            f"--prism-device {config.emulation.device} captures its own graph; drop --prism-graph (a "
            "modelled run has no emulation pass to replay one in)"
        )


def _check_counts(flags: argparse.Namespace) -> None:
    for flag in ("micro_batch_size", "train_iters", "num_layers"):
        value = getattr(flags, flag)
        if value is not None and value < 1:
            raise ValueError(f"--{flag.replace('_', '-')} must be >= 1, got {value}")


def check_out_dir(out_dir: str, *, overwrite: bool) -> None:
    """Refuse an existing non-empty run folder unless --prism-overwrite (a file is refused always)."""
    if os.path.isfile(out_dir):
        raise ValueError(f"--prism-out {out_dir} is a file; name a directory")
    if os.path.isdir(out_dir) and os.listdir(out_dir) and not overwrite:
        raise ValueError(
            f"--prism-out {out_dir} already holds a run; pass --prism-overwrite or another --prism-out"
        )
