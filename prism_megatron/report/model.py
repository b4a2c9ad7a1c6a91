"""What a run report holds: plain frozen dataclasses that the orchestrator fills and the writer renders.

The report renders what the run measured and what the simulator predicted; it computes nothing of
its own beyond unit changes (ns to s) and the median the issue defines `iteration_time_s` as. The
pieces come from where they are made:

* `RankReport.from_pieces`: a real rank's peak memory (`prism_megatron.passes.memory.MemoryReport`
  or its `as_dict()`, as the per-rank results file holds it) and its simulated breakdown
  (`prism_megatron.sim.rank_breakdown`);
* `RoleReport.from_breakdown`: one row of `prism_megatron.sim.breakdown`;
* `iterations_from_times`: the per-iteration times a real rank measured.

`RunReport.to_json()` gives the report.json document (see `schema.py`); `RunReport.from_json` reads
one back after validating it. Construction does not validate: `write_report` validates the document
before writing anything, so a malformed report never reaches disk.
"""

from __future__ import annotations

import dataclasses
import datetime
import importlib.metadata
import statistics
from collections.abc import Mapping, Sequence
from typing import TYPE_CHECKING, Any

import prism_megatron
from prism_megatron.report import schema
from prism_megatron.report.agreement import RankAgreement
from prism_megatron.report.modelled import ModelledReport
from prism_megatron.target import TargetJob
from prism_megatron.topology import Layout

if TYPE_CHECKING:
    from prism_megatron.sim import RoleBreakdown

_NS_PER_S = 1e9

MEGATRON_NAMES = {
    "iteration_time_s": "elapsed time per iteration (ms) [log line]; iteration-time [TensorBoard]",
    "iterations[].time_s": "elapsed time per iteration (ms) [log line]; iteration-time [TensorBoard]",
    "tflops_per_gpu": "throughput per GPU (TFLOP/s/GPU) [log line]; throughput [TensorBoard]",
    "model_flops_per_iteration": "num_floating_point_operations(args, global batch size)",
    "tokens_per_s_per_gpu": "(not logged by Megatron-LM: global batch size x seq length / elapsed time / GPUs)",
    "target.global_batch_size": "global batch size [log line]; batch-size [TensorBoard]",
    "ranks.*.peak_memory_allocated_bytes": "max allocated (MB) [memory report]; mem-max-allocated-bytes [TensorBoard]",
    "ranks.*.peak_memory_reserved_bytes": "max reserved (MB) [memory report]",
}
"""Our key in report.json -> the name Megatron-LM prints or logs for the same number (report.json
carries it as `megatron_names`; report.md shows it beside ours)."""


def target_to_json(job: TargetJob) -> dict[str, Any]:
    """report.json's `target`: the job's layout sizes, rank order and batch (`dp` spelled out)."""
    sizes = job.sizes
    return {
        "world_size": job.world_size,
        "tp": sizes.tp,
        "pp": sizes.pp,
        "cp": sizes.cp,
        "ep": sizes.ep,
        "etp": sizes.etp or sizes.tp,  # spelled out, so a report reads back equal to what was written
        "vpp": sizes.vpp,
        "micro_batch_size": job.micro_batch_size,
        "global_batch_size": job.global_batch_size,
        "seq_length": job.model.seq_length,
        "order": sizes.order,
        "dp": job.layout().dp,
    }


def target_from_json(doc: Mapping[str, Any]) -> TargetJob:
    """The job report.json's `target` describes (what `target_to_json` wrote; the rest unknown)."""
    layout = Layout(
        world_size=doc["world_size"], tp=doc["tp"], pp=doc["pp"], cp=doc["cp"], ep=doc["ep"], etp=doc["etp"],
        vpp=doc["vpp"], order=doc["order"],
    )  # fmt: skip
    return TargetJob.from_layout(
        layout,
        micro_batch_size=doc["micro_batch_size"],
        global_batch_size=doc["global_batch_size"],
        seq_length=doc["seq_length"],
    )


@dataclasses.dataclass(frozen=True)
class IterationRecord:
    """One training iteration as the run measured it."""

    index: int
    time_s: float
    warmup: bool = False
    """A warm-up iteration: shown, but left out of `iteration_time_s`."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class Failure:
    """Why a run failed, as far as it is known."""

    message: str
    dead_rank: int | None = None
    """The virtual rank whose process died or stopped answering, when one did."""
    last_op: str | None = None
    """The last op in flight (the flight recorder's line), when known."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankReport:
    """One real rank: measured peak memory and its simulated time breakdown."""

    virtual_rank: int
    role: str | None = None
    peak_memory_allocated_bytes: int | None = None
    peak_memory_reserved_bytes: int | None = None
    """The caching allocator's reserved peak (CUDA); None where nothing reserves (CPU)."""
    compute_s: float | None = None
    exposed_comm_s: float | None = None
    bubble_s: float | None = None
    memory_by_category: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Bytes per category at the moment of the peak (parameters, gradients, optimizer_state, activations)."""
    memory_method: str | None = None
    """How memory was measured: 'live-storage' (CPU) or 'cuda-allocator'."""
    cpu_threads: int | None = None
    """On the cpu device: the rank's intra-op threads (--prism-cpu-threads-per-rank)."""
    cpu_cores: tuple[int, ...] | None = None
    """On the cpu device: the cores the rank ran on."""

    @classmethod
    def from_pieces(
        cls,
        virtual_rank: int,
        *,
        memory: Any = None,
        breakdown: RoleBreakdown | None = None,
        peak_memory_reserved_bytes: int | None = None,
        role: str | None = None,
        cpu_share: Mapping[str, Any] | None = None,
    ) -> RankReport:
        """Build from a memory report (a `MemoryReport` or its dict), a `RoleBreakdown` and the rank's
        share of the machine on the cpu device (`megatron.run.cpu_share.CpuShare.as_dict`)."""
        if memory is not None and not isinstance(memory, Mapping):
            memory = memory.as_dict()
        times = {}
        if breakdown is not None:
            assert breakdown.virtual_rank == virtual_rank, (breakdown.virtual_rank, virtual_rank)
            times = {
                "compute_s": breakdown.compute_ns / _NS_PER_S,
                "exposed_comm_s": breakdown.exposed_comm_ns / _NS_PER_S,
                "bubble_s": breakdown.bubble_ns / _NS_PER_S,
            }
        return cls(
            virtual_rank=virtual_rank,
            role=role if role is not None else (breakdown.role if breakdown is not None else None),
            peak_memory_allocated_bytes=memory["peak_bytes"] if memory else None,
            peak_memory_reserved_bytes=(
                peak_memory_reserved_bytes
                if peak_memory_reserved_bytes is not None
                else (memory.get("reserved_peak_bytes") if memory else None)
            ),
            memory_by_category=dict(memory["at_peak_bytes"]) if memory else {},
            memory_method=memory.get("method") if memory else None,
            cpu_threads=cpu_share["threads"] if cpu_share else None,
            cpu_cores=tuple(cpu_share["cores"]) if cpu_share else None,
            **times,
        )

    @classmethod
    def from_json(cls, virtual_rank: int, entry: Mapping[str, Any]) -> RankReport:
        """One entry of report.json's `ranks` (what `to_json` wrote)."""
        cores = entry.get("cpu_cores")
        return cls(
            virtual_rank=virtual_rank, **{**entry, "cpu_cores": tuple(cores) if cores is not None else None}
        )

    def to_json(self) -> dict[str, Any]:
        out = dataclasses.asdict(self)
        del out["virtual_rank"]
        out["memory_by_category"] = dict(self.memory_by_category)
        out["cpu_cores"] = list(self.cpu_cores) if self.cpu_cores is not None else None
        return out


@dataclasses.dataclass(frozen=True, kw_only=True)
class RoleReport:
    """One role of the job as the simulator predicted it (see `prism_megatron.sim.breakdown`)."""

    role: str
    virtual_rank: int
    """The representative whose timeline was measured."""
    count: int
    """How many virtual ranks share the role."""
    compute_s: float
    exposed_comm_s: float
    bubble_s: float

    @classmethod
    def from_breakdown(cls, row: RoleBreakdown) -> RoleReport:
        return cls(
            role=row.role,
            virtual_rank=row.virtual_rank,
            count=row.num_ranks,
            compute_s=row.compute_ns / _NS_PER_S,
            exposed_comm_s=row.exposed_comm_ns / _NS_PER_S,
            bubble_s=row.bubble_ns / _NS_PER_S,
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class CaptureSummary:
    """How the execution graph was captured: how many roles ran for how many in the job, how long."""

    num_roles: int
    """Roles of the target job."""
    captured_ranks: Mapping[str, int]
    """Role -> the virtual rank whose capture it has (the captured roles only)."""
    classes: Mapping[str, tuple[str, ...]]
    """Representative role -> the roles of its class (roles that run the same program)."""
    all_roles: bool = False
    """--prism-capture-all-roles: every role was its own class."""
    num_passes: int | None = None
    """Capture passes this command made; None when the graph came from --prism-graph or from passes
    launched by hand (captured before this report)."""
    capture_s: float | None = None
    """Wall seconds of those passes, from the first launch to the last exit; None when not made here."""

    @property
    def num_captured_roles(self) -> int:
        return len(self.captured_ranks)

    def to_json(self) -> dict[str, Any]:
        return {
            "num_roles": self.num_roles,
            "num_captured_roles": self.num_captured_roles,
            "captured_ranks": dict(self.captured_ranks),
            "classes": {rep: list(members) for rep, members in self.classes.items()},
            "all_roles": self.all_roles,
            "num_passes": self.num_passes,
            "capture_s": self.capture_s,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> CaptureSummary:
        return cls(
            num_roles=doc["num_roles"],
            captured_ranks=dict(doc["captured_ranks"]),
            classes={rep: tuple(members) for rep, members in doc["classes"].items()},
            all_roles=doc["all_roles"],
            num_passes=doc["num_passes"],
            capture_s=doc["capture_s"],
        )

    def describe(self) -> str:
        """One line: "3 of 10 roles captured (3 programs) in 2 passes, 95.2 s"."""
        programs = f"{len(self.classes)} program{'s' if len(self.classes) != 1 else ''}"
        line = f"{self.num_captured_roles} of {self.num_roles} roles captured ({programs})"
        if self.num_passes is None:
            return line + " before this report (--prism-graph, or passes launched by hand)"
        line += f" in {self.num_passes} pass{'es' if self.num_passes != 1 else ''}"
        return line + ("" if self.capture_s is None else f", {self.capture_s:.1f} s")


def current_versions() -> dict[str, str | None]:
    """Versions of prism-megatron, megatron-core and torch (None for one not installed)."""

    def version(distribution: str) -> str | None:
        try:
            return importlib.metadata.version(distribution)
        except importlib.metadata.PackageNotFoundError:
            return None

    return {
        "prism_megatron": prism_megatron.__version__,
        "megatron_core": version("megatron-core"),
        "torch": version("torch"),
    }


def _now() -> str:
    return datetime.datetime.now(datetime.UTC).isoformat(timespec="seconds")


@dataclasses.dataclass(frozen=True, kw_only=True)
class RunReport:
    """Everything report.json holds (see `schema.py` for the document and its checks)."""

    target: TargetJob
    """The target job (`prism_megatron.target`); report.json keeps its layout and batch."""
    real_ranks: tuple[int, ...]
    status: str = "ok"
    """'ok', 'failed' (then `failure` says why) or 'running' (written while the run goes on)."""
    iterations: tuple[IterationRecord, ...] = ()
    iteration_time_s: float | None = None
    """Median of the iterations after warm-up (`median_iteration_time_s`)."""
    ranks: Mapping[int, RankReport] = dataclasses.field(default_factory=dict)
    roles: tuple[RoleReport, ...] = ()
    simulated_iteration_time_s: float | None = None
    tflops_per_gpu: float | None = None
    """Model FLOPs per iteration / (iteration_time_s x world_size), in 10^12 per second."""
    tokens_per_s_per_gpu: float | None = None
    """global_batch_size x seq_length / (iteration_time_s x world_size)."""
    model_flops_per_iteration: float | None = None
    failure: Failure | None = None
    prism: Mapping[str, Any] = dataclasses.field(default_factory=dict)
    """The run's --prism-* settings, by section (`dataclasses.asdict(PrismConfig)`)."""
    shims_used: Mapping[str, int] | None = None
    patches: Mapping[str, int] | None = None
    """Calls per Megatron patch during the run."""
    capture: CaptureSummary | None = None
    """How the graph was captured (None while the run has not obtained it)."""
    agreement: tuple[RankAgreement, ...] = ()
    """Per real rank, each emulated iteration against the simulation of the schedule it ran."""
    modelled: ModelledReport | None = None
    """On a modelled GPU (--prism-device model:<gpu>): the modelled iteration; None on a real device."""
    versions: Mapping[str, str | None] = dataclasses.field(default_factory=current_versions)
    created: str = dataclasses.field(default_factory=_now)
    """When the report was made (ISO 8601, UTC)."""

    def to_json(self) -> dict[str, Any]:
        """The report.json document."""
        doc: dict[str, Any] = {
            "schema_version": schema.SCHEMA_VERSION,
            "status": self.status,
            "failure": dataclasses.asdict(self.failure) if self.failure else None,
            "target": target_to_json(self.target),
            "real_ranks": list(self.real_ranks),
            "iterations": [dataclasses.asdict(it) for it in self.iterations],
            "iteration_time_s": self.iteration_time_s,
            "ranks": {str(r): self.ranks[r].to_json() for r in sorted(self.ranks)},
            "roles": {
                row.role: {k: v for k, v in dataclasses.asdict(row).items() if k != "role"}
                for row in self.roles
            },
            "simulated_iteration_time_s": self.simulated_iteration_time_s,
            "model_flops_per_iteration": self.model_flops_per_iteration,
            "tflops_per_gpu": self.tflops_per_gpu,
            "tokens_per_s_per_gpu": self.tokens_per_s_per_gpu,
            "megatron_names": dict(MEGATRON_NAMES),
            "prism": dict(self.prism),
            "shims_used": dict(self.shims_used) if self.shims_used is not None else None,
            "patches": dict(self.patches) if self.patches is not None else None,
            "capture": self.capture.to_json() if self.capture is not None else None,
            "agreement": {str(a.virtual_rank): a.to_json() for a in self.agreement},
            "modelled": self.modelled.to_json() if self.modelled is not None else None,
            "versions": dict(self.versions),
            "created": self.created,
        }
        return doc

    @classmethod
    def from_json(cls, doc: Any, source: str = "report.json") -> RunReport:
        """Read a report.json document; SchemaError when it does not follow the schema."""
        schema.validate(doc, source)
        return cls(
            target=target_from_json(doc["target"]),
            real_ranks=tuple(doc["real_ranks"]),
            status=doc["status"],
            iterations=tuple(IterationRecord(**it) for it in doc["iterations"]),
            iteration_time_s=doc["iteration_time_s"],
            ranks={int(k): RankReport.from_json(int(k), v) for k, v in doc["ranks"].items()},
            roles=tuple(RoleReport(role=k, **v) for k, v in (doc.get("roles") or {}).items()),
            simulated_iteration_time_s=doc["simulated_iteration_time_s"],
            tflops_per_gpu=doc["tflops_per_gpu"],
            tokens_per_s_per_gpu=doc.get("tokens_per_s_per_gpu"),
            model_flops_per_iteration=doc.get("model_flops_per_iteration"),
            failure=Failure(**doc["failure"]) if doc.get("failure") else None,
            prism=doc.get("prism") or {},
            shims_used=doc.get("shims_used"),
            patches=doc.get("patches"),
            capture=CaptureSummary.from_json(doc["capture"]) if doc.get("capture") else None,
            agreement=tuple(
                RankAgreement.from_json(int(k), v) for k, v in (doc.get("agreement") or {}).items()
            ),
            modelled=ModelledReport.from_json(doc["modelled"]) if doc.get("modelled") else None,
            versions=doc["versions"],
            created=doc.get("created", ""),
        )


def iterations_from_times(times_s: Sequence[float], *, num_warmup: int) -> tuple[IterationRecord, ...]:
    """Number the measured iteration times from 0; the first `num_warmup` are warm-up."""
    if num_warmup < 0:
        raise ValueError(f"num_warmup must be >= 0, got {num_warmup}")
    return tuple(IterationRecord(i, float(t), warmup=i < num_warmup) for i, t in enumerate(times_s))


def median_iteration_time_s(iterations: Sequence[IterationRecord]) -> float | None:
    """The median time of the iterations after warm-up; None when there are none."""
    times = [it.time_s for it in iterations if not it.warmup]
    return statistics.median(times) if times else None
