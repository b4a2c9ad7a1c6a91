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

from prism_megatron import files
from prism_megatron.config import PrismConfig, RaisingParser, parse_prism_flags
from prism_megatron.emulation import preflight
from prism_megatron.emulation.capture_slice import with_slice
from prism_megatron.emulation.preflight import BUILTIN
from prism_megatron.megatron.job import target
from prism_megatron.target import TargetJob
from prism_megatron.topology import Layout, RoleClass

MODELLED_DISPATCHERS = ("alltoall", "allgather")
"""MoE token dispatchers a modelled GPU routes balanced (`patches/modelled_moe.py`)."""


def megatron_flags(megatron_args: Sequence[str], script: str = BUILTIN) -> argparse.Namespace:
    """The target job's flags as Megatron-LM names them (`megatron.job.target`; the script parses the
    rest), and `--train-iters`; not yet derived. The built-in entry's own defaults apply under it
    (its mock data's vocabulary when --vocab-size is not given)."""
    parser = RaisingParser(add_help=False, error_prefix="Megatron flags: ")
    target.add_job_arguments(parser)
    parser.add_argument("--train-iters", type=int, default=None)
    parser.add_argument("--moe-token-dispatcher-type", default="allgather")  # Megatron-LM's default
    if script == BUILTIN:
        from prism_megatron.megatron.entry import MOCK_VOCAB_SIZE  # not its parser: no megatron-core

        parser.set_defaults(vocab_size=MOCK_VOCAB_SIZE)
    return parser.parse_known_args(list(megatron_args))[0]


@dataclasses.dataclass(frozen=True)
class RunPlan:
    """One run of `prism-megatron emulate`: what is emulated, by whom, in which passes, where."""

    config: PrismConfig
    megatron_args: tuple[str, ...]
    """The user's flags after `--` (Megatron's and --prism-*), passed on to every launch."""
    script: str
    job: TargetJob
    """The target job the flags describe (layout sizes, schedule, batch, model shape), as
    `megatron.job.target.derive` reads it."""
    train_iters: int | None
    """--train-iters: the iterations each pass runs (None: the script's default)."""
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
        return self.job.schedule.num_microbatches

    def graph_facts(self) -> dict[str, object]:
        """The facts of the job a captured graph records beside its layout (metadata.extra)."""
        from prism_megatron.passes.rank import NUM_WARMUP  # the capture pass's; it imports the replay
        from prism_megatron.sim.contention import DEVICE_KEY

        return {
            "script": self.script,
            "num_layers": self.job.model.num_layers,
            "hidden_size": self.job.model.hidden_size,
            "seq_length": self.job.model.seq_length,
            "micro_batch_size": self.job.micro_batch_size,
            "num_microbatches": self.num_microbatches,
            "capture_iters": self.config.capture.capture_iters,
            "num_warmup": NUM_WARMUP,
            # a modelled GPU's spans ran alone: the simulation charges what overlapping NCCL costs them
            DEVICE_KEY: self.config.emulation.device,
        }


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
    flags = megatron_flags(megatron_args, script)
    _check_counts(flags)
    job = target.derive(flags, world_size=config.emulation.world_size)
    layout = job.layout()
    real = target.select_real_ranks(layout, config.emulation.ranks)
    if config.emulation.modelled_gpu is not None:
        _check_modelled(config, flags)
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
        files.check_run_folder(out_dir, overwrite=config.output.overwrite)  # again under the lock
    if config.capture.graph is not None and not os.path.exists(config.capture.graph):
        raise ValueError(f"--prism-graph {config.capture.graph}: no such graph directory")
    plan = RunPlan(
        config=config,
        megatron_args=tuple(megatron_args),
        script=script,
        job=job,
        train_iters=flags.train_iters,
        layout=layout,
        real_ranks=real,
        slice_ranks=(),
        nproc=nproc,
        out_dir=out_dir,
    )
    plan = with_slice(plan, megatron_args)
    graph = preflight.check(
        cluster=config.cluster.cluster,
        script=script,
        out_dir=None if existing_run else out_dir,
        graph_path=config.capture.graph,
        layout=layout,
        facts=plan.graph_facts(),
    )
    return dataclasses.replace(plan, reused_graph=graph) if graph is not None else plan


def _check_modelled(config: PrismConfig, flags: argparse.Namespace) -> None:
    """What a modelled GPU cannot run yet, the built-in entry and a Megatron-LM script alike."""
    dispatcher = getattr(flags, "moe_token_dispatcher_type", "allgather")
    if getattr(flags, "num_experts", None) and dispatcher not in MODELLED_DISPATCHERS:
        raise ValueError(
            f"--moe-token-dispatcher-type {dispatcher} on --prism-device {config.emulation.device}: its fused "
            "all-to-all kernels (DeepEP, HybridEP) need a GPU and have no balanced-routing stand-in; use "
            f"{' or '.join(MODELLED_DISPATCHERS)}"
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
    from prism_megatron.passes.rank import NUM_WARMUP  # the passes' warm-up; it imports the replay

    if flags.train_iters is not None and flags.train_iters <= NUM_WARMUP:
        # Such a run would end "ok" with no emulated iteration time at all.
        raise ValueError(
            f"--train-iters {flags.train_iters} leaves no iteration to measure: the first {NUM_WARMUP} "
            f"is warm-up; give at least {NUM_WARMUP + 1}"
        )
