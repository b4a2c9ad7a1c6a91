"""One real process's prism lifecycle, in one place: `Runtime`, whose methods are its steps in order,
and `TrainingRecord`, what the process's training steps did.

    rt = Runtime.start(config)       # device shim, the rank's share of the CPU, the watchdog
    rt.bring_up()                    # the virtual world (or a plain one), the pass, `create_group`
    ... Megatron's initialize_model_parallel ...
    rt.before_model()                # pipeline p2p and control-flow fixes for virtual peers
    record = TrainingRecord(rt)      # each step: record.before_step(...), record.after_step(...)
    rt.finish_phase(out); rt.close()

Both entries go through it: the built-in training entry calls the steps itself; Megatron-LM's own
script reaches them through its hooks (`patches/training.py`, `patches/arguments.py`), which see the
run only as the protocol `patches.run.Run` (they sit below it and do not import it). Order matters
because Megatron modules capture process groups when they are built: shims and the `create_group`
wrapper go in before `initialize_model_parallel`, the p2p communicator and control-flow fixes before
the model.
"""

from __future__ import annotations

import dataclasses
import os
import time
from collections.abc import Mapping
from typing import Any

import torch
import torch.distributed as dist

import prism_megatron.topology as topology
from prism_megatron import files
from prism_megatron.config import PrismConfig
from prism_megatron.megatron.job import target
from prism_megatron.megatron.job.target import ParallelSizes
from prism_megatron.megatron.run import cpu_share
from prism_megatron.megatron.run.modelled_device import ModelledDevice
from prism_megatron.passes import memory, watchdog, world
from prism_megatron.passes import rank as rank_phase
from prism_megatron.patches import control_flow, cpu_shim, parallel_state, pipeline, pipeline_ops, registry
from prism_megatron.patches import modelled_device as modelled_patches
from prism_megatron.replay import timeline
from prism_megatron.replay.timeline import Mark


def num_real_processes() -> int:
    return int(os.environ.get("WORLD_SIZE", "1")) if "MASTER_ADDR" in os.environ else 1


@dataclasses.dataclass
class Runtime:
    """What one real process set up, and how to take it down again; its methods are the lifecycle's
    steps (it meets `patches.run.Run`, the protocol its patches are bound to)."""

    config: PrismConfig
    device: str
    sizes: ParallelSizes | None = None
    """The target job's parallel sizes, once the entry's arguments are known."""
    world: world.VirtualWorld | None = None
    group_log: parallel_state.GroupLog = dataclasses.field(default_factory=parallel_state.GroupLog)
    applied: list[registry.AppliedPatches] = dataclasses.field(default_factory=list)
    p2p_class: Any = None
    phase: rank_phase.InstantPhase | None = None
    """The pass this process runs (capture, emulate or instant); set at bring-up."""
    cpu: cpu_share.CpuShare | None = None
    """On the cpu device, this rank's share of the machine (threads, cores)."""

    @classmethod
    def start(cls, config: PrismConfig) -> Runtime:
        """Apply what must precede everything on the CPU device: the device shim, and this rank's share
        of the machine (`cpu_share`: before any process group, so gloo's threads inherit it).

        The run folder is fixed here (`OutputConfig.resolved_out`), the same in every process of a
        job. An emulating process starts its watchdog here, before the script runs (`passes.watchdog`).
        """
        out = config.output.resolved_out(os.environ, time.time())
        config = dataclasses.replace(config, output=dataclasses.replace(config.output, out=out))
        if config.emulation.emulate:
            watchdog.start(
                out_dir=out,
                timeout_s=config.emulation.timeout_s,
                phase=rank_phase.phase_name(config),
                ranks_spec=config.emulation.ranks,
            )
        device = config.emulation.resolved_device(torch.cuda.is_available())
        rt = cls(config=config, device=device)
        if device == "cpu":
            rt.cpu = cpu_share.take(config.emulation)
            rt.apply(cpu_shim.MEGATRON_CORE_SHIMS)
        if config.emulation.modelled_gpu is not None:
            rt.apply(modelled_patches.ALL_RECORDS)
        return rt

    @property
    def virtual_rank(self) -> int:
        return self.world.virtual_rank if self.world else dist.get_rank()

    def target_layout(self) -> topology.Layout:
        """The target job's topology: the entry's parallel sizes in --prism-world-size ranks."""
        assert self.sizes is not None, "the parallel sizes are set before asking about the layout"
        return target.layout_of(self.sizes, self.config.emulation.world_size)

    def real_ranks(self) -> tuple[int, ...]:
        """The virtual ranks real processes run (--prism-ranks; default: one rank per role)."""
        return target.select_real_ranks(self.target_layout(), self.config.emulation.ranks)

    def world_is_real(self, virtual_rank: int) -> bool:
        """Whether a virtual rank is run by a real process (every rank is, without emulation)."""
        if not self.config.emulation.emulate:
            return True
        return virtual_rank in self.real_ranks()

    def check_process_count(self, real_ranks: tuple[int, ...]) -> None:
        """One process per real rank was launched (ValueError naming --prism-ranks otherwise)."""
        if len(real_ranks) != num_real_processes():
            raise ValueError(
                f"--prism-ranks selects {len(real_ranks)} real ranks {list(real_ranks)} but "
                f"{num_real_processes()} processes were launched; launch one process per real rank "
                "(--nproc-per-node)"
            )

    def apply(self, records: tuple, **context: Any) -> None:
        """Bind the records to this run (`context`: what they need, see `registry.bind`) and apply them."""
        self.applied.append(
            registry.apply(
                registry.bind(records, **context), allow_untested=self.config.patches.allow_untested_megatron
            )
        )

    def patch_calls(self) -> dict[str, int]:
        """Calls per applied patch (0: applied but never used), in application order."""
        calls: dict[str, int] = {}
        for applied in self.applied:
            calls.update(applied.used())
        return calls

    def bring_up(self) -> None:
        """Initialise torch.distributed (the virtual world when emulating) and wrap `create_group`."""
        config = self.config
        if self.device == "cuda":
            torch.cuda.set_device(int(os.environ.get("LOCAL_RANK", "0")))
        if config.emulation.emulate:
            layout = self.target_layout()
            real_ranks = self.real_ranks()
            self.check_process_count(real_ranks)
            store, physical_rank, _ = world.rendezvous_store(config.emulation.timeout_s)
            self.world = world.init_virtual_world(
                world_size=config.emulation.world_size,
                real_ranks=real_ranks,
                physical_rank=physical_rank,
                store=store,
                device=self.device,
                data_policy=config.emulation.data_policy,
                timeout_s=config.emulation.timeout_s,
                roles=[layout.role_of(r) for r in range(layout.world_size)],
                poll_real_waits=self.cpu is not None and self.cpu.own_cores,
            )
            virtual_backend = self.world.backend
            self.phase = rank_phase.make_phase(
                config,
                virtual_rank=self.world.virtual_rank,
                layout=layout,
                real_ranks=real_ranks,
                store=store,
            )
        else:
            backend = "nccl" if self.device == "cuda" else "gloo"
            world.init_real_world(backend=backend, timeout_s=config.emulation.timeout_s)
            virtual_backend = None
            self.phase = rank_phase.make_phase(
                config, virtual_rank=dist.get_rank(), layout=None, real_ranks=()
            )
        self.apply((parallel_state.CREATE_GROUP,), virtual_backend=virtual_backend, group_log=self.group_log)

    def before_model(self) -> None:
        """After `initialize_model_parallel`: pipeline p2p and control-flow fixes for virtual peers."""
        if self.world is None:
            return
        (p2p_record,) = registry.bind((pipeline.P2P_COMMUNICATOR,), world=self.world)
        if self.phase is not None and self.phase.records_p2p_calls:
            p2p_record = dataclasses.replace(p2p_record, make=_reporting_calls(p2p_record.make, self.phase))
        self.apply((p2p_record, *control_flow.CORE_FIXES), world=self.world)
        self.p2p_class = _installed_p2p_class()

    def iteration_begins(self) -> None:
        """A training step starts (the pass marks, records and times it). Pipeline transfers left
        unwaited since the last step (an evaluation's) are settled before it records."""
        if self.world is not None:
            pipeline_ops.settle_unwaited()
        if self.phase is not None:
            self.phase.iteration_begins()

    def iteration_ends(self) -> None:
        """The training step returned (the emulate pass folds it into the next schedule here); every
        pipeline transfer of the step is settled first (`pipeline_ops.settle_unwaited`)."""
        if self.world is not None:
            pipeline_ops.settle_unwaited()
        if self.phase is not None:
            self.phase.iteration_ends()

    def finish_phase(self, out: dict[str, Any]) -> None:
        """After training: the pass's files (capture file, op log) and its summary in the results."""
        if self.world is not None:
            pipeline_ops.settle_unwaited()  # and so release the tensors they hold
        if self.phase is not None:
            out["prism_phase"] = self.phase.summary()
            self.phase.finish()

    def close(self) -> None:
        """Undo everything in reverse order (safe to call twice)."""
        watchdog.stop()
        for applied in reversed(self.applied):
            applied.revert()
        self.applied.clear()
        if self.cpu is not None:
            self.cpu.restore()
            self.cpu = None
        if self.world is not None:
            self.world.close()
            self.world = None
        elif dist.is_initialized():
            dist.destroy_process_group()


class TrainingRecord:
    """What one process's training steps did, whichever entry ran them: each step begun and ended on
    the `Runtime` (so the pass marks it), its loss, grad norm and what else the entry measured, and
    the memory account over the steps (from the first step on: the model and optimizer are built).

    `modelled`: the modelled GPU the steps run on, when the record keeps its iterations (a Megatron-LM
    script's; the built-in entry keeps them itself): from the first step its norms are charged as
    fused kernels, and each step's modelled time is kept by kind."""

    def __init__(self, rt: Runtime, modelled: ModelledDevice | None = None) -> None:
        self.rt = rt
        self.modelled = modelled
        self.iterations: list[dict[str, Any]] = []
        self.model: list | None = None
        self.optimizer: Any = None
        self.tracker: memory.LiveStorageTracker | None = None
        self.history_baseline_bytes: int | None = None
        """Bytes requested when --prism-memory-history began recording on CUDA (None: not recording)."""

    def before_step(self, model: list, optimizer: Any) -> None:
        """A step starts; at the first, memory accounting starts (the CPU's live-storage tracker with
        the model labelled, or the CUDA allocator's peaks reset)."""
        self.rt.iteration_begins()
        if self.model is None:
            self._first_step(model, optimizer)
        if self.modelled is not None:
            self.modelled.iteration_begins()

    def _first_step(self, model: list, optimizer: Any) -> None:
        self.model, self.optimizer = model, optimizer
        if self.modelled is not None:
            self._charge_as_a_gpu_runs(model, optimizer)
        if self.rt.device == "cpu":
            # On a modelled GPU every tensor is fake: its storage is counted as the GPU would allocate it.
            fake = self.rt.config.emulation.modelled_gpu is not None
            self.tracker = memory.LiveStorageTracker(fake_storage=fake).__enter__()
            self.tracker.label_model(model)
            if self.rt.config.output.memory_history:
                self.tracker.start_history()
        elif torch.cuda.is_available():
            torch.cuda.reset_peak_memory_stats()
            if self.rt.config.output.memory_history:
                self.history_baseline_bytes = memory.start_history()

    def _charge_as_a_gpu_runs(self, model: list, optimizer: Any) -> None:
        """A Megatron-LM script on a modelled GPU: its norms, Megatron's fusions and, with
        --tp-comm-overlap, TE's userbuffers overlap are charged as a GPU run of the flags as written has
        them (the CPU runs the stand-ins of `patches.arguments.MODELLED_STAND_INS`)."""
        from prism_megatron.megatron.run import modelled_fusions
        from prism_megatron.patches.arguments import as_written, megatron_lm_args

        modelled_fusions.charge_as_a_gpu_runs(self.modelled, model, optimizer, as_written(megatron_lm_args()))

    def after_step(
        self, step: Mapping[str, Any], *, marks: tuple[Mark, Mark] | None = None
    ) -> dict[str, Any]:
        """The step returned: `step` holds at least its `loss` and `grad_norm`; with the step's device
        marks (start, end) its `time_s` is added. Returns the step as recorded."""
        if self.modelled is not None:
            self.modelled.iteration_ends()
        self.rt.iteration_ends()
        recorded = dict(step)
        if marks is not None:
            start_ns, end_ns = timeline.resolve(list(marks))
            recorded["time_s"] = (end_ns - start_ns) / 1e9
        self.iterations.append(recorded)
        if self.tracker is not None:
            self.tracker.label_optimizer(self.optimizer)  # its state exists after the first step
        return recorded

    def finish(self) -> memory.MemoryReport | None:
        """The memory report of the steps (None when no step ran)."""
        if self.tracker is not None:
            self.tracker.__exit__(None, None, None)
            return self.tracker.report(self._history_path() if self.rt.config.output.memory_history else None)
        if self.model is not None and torch.cuda.is_available():
            return memory.cuda_report(self.model, self.optimizer, self._peak_allocations())
        return None

    def _peak_allocations(self) -> dict[str, Any] | None:
        """--prism-memory-history: the history written to the run folder; what was live at its peak."""
        if self.history_baseline_bytes is None:
            return None
        path = self._history_path()
        return {
            "history": path,
            **memory.peak_allocations(memory.dump_history(path), self.history_baseline_bytes),
        }

    def _history_path(self) -> str:
        return files.memory_history_path(self.rt.config.output.out, self.rt.virtual_rank)


def _reporting_calls(make, phase: rank_phase.InstantPhase):
    """The bound communicator, reporting the span of each call to the pass (the p2p ops one call
    posts are one batch in the execution graph; the op log alone cannot tell where a call ends)."""

    def make_reporting(original):
        bound = make(original)

        def _communicate(self, *args, **kwargs):
            enter = timeline.mark()  # on the device timeline, as the ops the call posts
            try:
                return bound._communicate(self, *args, **kwargs)
            finally:
                phase.p2p_call(enter, timeline.mark())

        return type(bound.__name__, (bound,), {"_communicate": _communicate})

    return make_reporting


def _installed_p2p_class() -> Any:
    from megatron.core.pipeline_parallel import schedules

    return schedules.P2PCommunicator
