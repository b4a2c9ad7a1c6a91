"""`PrismConfig`: the one configuration object of a run, built once from the command line.

Sections are frozen keyword-only dataclasses with a docstring under each field; the `--prism-*` flags
are generated from those fields (name, type, default, choices, help), so the flag set and the config
cannot drift (a unit test freezes both). Validation lives in `__post_init__` and raises ValueError
naming the flag, the value, and what would be valid.

Pure: imports neither torch nor Megatron, so the command line can be parsed and checked anywhere.
"""

from __future__ import annotations

import argparse
import ast
import dataclasses
import functools
import inspect
import itertools
import math
import os
import textwrap
import time
import typing
from typing import Any

from prism_megatron.topology.grid import MAX_WORLD_SIZE

MODELLED_GPUS = ("a100", "b200", "h100", "h200")
"""The GPUs the GPU model knows (`prism_megatron.gpu_model.GPU_NAMES`; a unit test keeps the two equal)."""
MODELLED_PREFIX = "model:"
PRESET_OF_GPU = {gpu: f"dgx-{gpu}" for gpu in MODELLED_GPUS}
"""The cluster preset (`network/presets.py`) a modelled GPU runs in unless --prism-cluster says otherwise."""
DEVICES = ("auto", "cpu", "cuda", *(MODELLED_PREFIX + name for name in MODELLED_GPUS))
DATA_POLICIES = ("mirror",)  # what prism_megatron.backend offers
PHASES = ("auto", "capture", "emulate")
DEFAULT_OUT_ROOT = "prism-out"
FLAG_PREFIX = "--prism-"
CPU_SHARES_PER_MACHINE = 8
"""The default CPU rank gets this fraction of the machine's cores, as a GPU is one of eight."""
MAX_CPU_THREADS_PER_RANK = 1024
"""--prism-cpu-threads-per-rank's upper bound: more intra-op threads than any machine has cores
(torch's thread pools fail in native code, not with an error, far above it)."""
SLOWDOWN_FACTOR_RANGE = (1e-3, 1e3)
"""The factors a what-if may give a rank (--prism-straggler, simulate --straggler, --slow-nic,
--expert-imbalance): from 1000 times faster to 1000 times slower. Beyond that a rank is dead, not
slow, and durations in integer nanoseconds would overflow."""


def check_slowdown_factor(factor: float, flag: str, item: str) -> float:
    """`factor` when a finite number in `SLOWDOWN_FACTOR_RANGE`; ValueError naming the flag otherwise."""
    low, high = SLOWDOWN_FACTOR_RANGE
    if not (math.isfinite(factor) and low <= factor <= high):
        raise ValueError(
            f"{flag} {item!r}: the factor must be a number from {low:g} to {high:g} (2 is twice as slow), "
            f"got {factor:g}"
        )
    return factor


def _flag(name: str) -> dict[str, str]:
    """Field metadata: the flag name when it is not the field name (units stay out of flags)."""
    return {"flag": name}


@dataclasses.dataclass(frozen=True, kw_only=True)
class EmulationConfig:
    """What is emulated and where the real ranks run."""

    emulate: bool = False
    """Run as real ranks of a larger virtual job (without it the program runs unchanged)."""
    world_size: int | None = None
    """W, the number of GPUs of the target job; required with --prism-emulate."""
    ranks: str | None = None
    """Which virtual ranks are real, one process each: '5,1029', 'pp=0,7;tp=0;dp=0', 'slice' (default: one rank per role)."""
    device: str = dataclasses.field(default="auto", metadata={"choices": DEVICES})
    """Device of the real ranks; auto picks cuda when available, else cpu (with the CPU device shim); model:<gpu> runs the program at full size on fake tensors on the CPU, every op timed by prism's GPU model of that GPU."""
    cpu_threads_per_rank: int | None = None
    """On the cpu device: intra-op threads of each real rank, and as many cores of its own when the process may use more; the same share in every pass (default: the machine's cores / 8, at least 1; at most 1024)."""
    data_policy: str = dataclasses.field(default="mirror", metadata={"choices": DATA_POLICIES})
    """What virtual peers contribute to collectives: mirror (what the real rank of their role, or this rank, contributes)."""
    timeout_s: float = dataclasses.field(default=300.0, metadata=_flag("timeout"))
    """Seconds a real rank may wait for a peer, or make no progress at all (no op, no iteration), before the run fails naming the op or where the rank was."""
    straggler: str | None = dataclasses.field(default=None, metadata={"repeatable": True})
    """Slow virtual ranks, as RANK:FACTOR[,RANK:FACTOR] (factor > 1 stretches their compute; repeatable)."""
    phase: str = dataclasses.field(default="auto", metadata={"choices": PHASES})
    """Pass this process runs: capture (record ops for the graph), emulate (replay --prism-graph), auto (emulate with --prism-graph, else peers answer at once); prism-megatron emulate sets it."""

    def __post_init__(self) -> None:
        if self.device not in DEVICES:
            raise ValueError(f"--prism-device {self.device}: valid devices are {', '.join(DEVICES)}")
        if self.phase != "auto" and not self.emulate:
            raise ValueError(f"--prism-phase {self.phase} needs --prism-emulate")
        if self.emulate and self.world_size is None:
            raise ValueError("--prism-emulate needs --prism-world-size (the target job's number of GPUs)")
        if self.world_size is not None and self.world_size < 1:
            raise ValueError(f"--prism-world-size must be >= 1, got {self.world_size}")
        if self.world_size is not None and self.world_size > MAX_WORLD_SIZE:
            raise ValueError(
                f"--prism-world-size {self.world_size} is above the largest supported world, "
                f"{MAX_WORLD_SIZE} ranks (2^20)"
            )
        if not (math.isfinite(self.timeout_s) and self.timeout_s > 0):
            raise ValueError(f"--prism-timeout must be a positive number of seconds, got {self.timeout_s}")
        threads = self.cpu_threads_per_rank
        if threads is not None and not 1 <= threads <= MAX_CPU_THREADS_PER_RANK:
            raise ValueError(
                f"--prism-cpu-threads-per-rank must be from 1 to {MAX_CPU_THREADS_PER_RANK}, got {threads}"
            )
        if self.ranks is not None and not self.ranks.strip():
            raise ValueError("--prism-ranks must not be empty; omit it for one rank per role")
        self.stragglers()

    def stragglers(self) -> dict[int, float]:
        """--prism-straggler parsed: virtual rank -> compute slowdown factor."""
        if not self.straggler:
            return {}
        parsed: dict[int, float] = {}
        for item in self.straggler.split(","):
            rank_text, sep, factor_text = item.partition(":")
            try:
                virtual_rank, factor = int(rank_text), float(factor_text)
            except ValueError:
                virtual_rank, factor = -1, math.nan
            if not sep or virtual_rank < 0 or math.isnan(factor):
                raise ValueError(f"--prism-straggler item {item!r} must read RANK:FACTOR, e.g. 5:1.3")
            check_slowdown_factor(factor, "--prism-straggler", item)
            if self.world_size is not None and virtual_rank >= self.world_size:
                raise ValueError(
                    f"--prism-straggler rank {virtual_rank} is outside --prism-world-size {self.world_size}"
                )
            if virtual_rank in parsed:
                raise ValueError(
                    f"--prism-straggler rank {virtual_rank} is given twice ({virtual_rank}:{parsed[virtual_rank]:g} "
                    f"and {item}); give each rank once"
                )
            parsed[virtual_rank] = factor
        return parsed

    def resolved_cpu_threads(self, num_cores: int) -> int:
        """--prism-cpu-threads-per-rank, else an eighth of the machine's cores (at least 1): a CPU
        rank's device is a fixed share of the machine, as a GPU is one of its node's eight, and the
        share does not depend on how many processes a pass starts."""
        if self.cpu_threads_per_rank is not None:
            return self.cpu_threads_per_rank
        return max(1, num_cores // CPU_SHARES_PER_MACHINE)

    def resolved_device(self, cuda_available: bool) -> str:
        """Where the process computes: cuda or cpu (a modelled GPU's fake tensors live on the CPU)."""
        if self.modelled_gpu is not None:
            return "cpu"
        return ("cuda" if cuda_available else "cpu") if self.device == "auto" else self.device

    @property
    def modelled_gpu(self) -> str | None:
        """The GPU of --prism-device model:<gpu>, else None."""
        return self.device.removeprefix(MODELLED_PREFIX) if self.device.startswith(MODELLED_PREFIX) else None


@dataclasses.dataclass(frozen=True, kw_only=True)
class CaptureConfig:
    """The slicing pass that records the execution graph."""

    capture_iters: int = 4
    """Iterations the slice runs to record the graph, at least 2 (the first is warm-up; each span is the median of the rest)."""
    graph: str | None = None
    """Reuse a captured execution graph (a directory holding graph.json, such as a run's graph/) instead of capturing."""
    capture_all_roles: bool = False
    """Capture every role, each for its own graph (default: one role per class of roles that run the same program, its spans given to the whole class)."""

    def __post_init__(self) -> None:
        if self.capture_iters < 2:  # one would give the graph the warm-up's spans, silently
            raise ValueError(
                f"--prism-capture-iters must be >= 2 (the first is warm-up; the spans are the median of "
                f"the rest), got {self.capture_iters}"
            )
        if self.graph is not None and not self.graph.strip():
            raise ValueError("--prism-graph must name a graph directory")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClusterConfig:
    """The network of the target cluster."""

    cluster: str = "default"
    """Cluster preset name, path to a cluster spec (links, bandwidths, latencies), or a file of costs measured where the job runs (kind: measured)."""

    def __post_init__(self) -> None:
        if not self.cluster.strip():
            raise ValueError("--prism-cluster must name a preset or a spec file")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OutputConfig:
    """Where results go."""

    out: str | None = None
    """Run folder for report.json, report.md, timeline.json, graph/ and per-rank results (default: a new prism-out/<YYYYmmdd-HHMMSS>)."""
    overwrite: bool = False
    """Replace the run an existing --prism-out holds (only a folder with a report.json of ours; the user's other files stay, links are not followed)."""
    memory_history: bool = False
    """Record each real rank's memory history over its training steps (on a GPU the caching allocator's, on the CPU and a modelled GPU the live-storage account's), write it to memory/rank-<r>.pickle (open it at pytorch.org/memory_viz) and list the allocations live at the peak, by the lines that made them, in the rank's results. Costs each allocation a Python stack walk."""

    def __post_init__(self) -> None:
        if self.out is not None and not self.out.strip():
            raise ValueError("--prism-out must name a directory")

    def resolved_out(self, environ: typing.Mapping[str, str], now_s: float) -> str:
        """--prism-out, else a folder under prism-out/ named by the job: torchrun's run id or
        SLURM's job id when set (the same in every process of the job), else the local time."""
        if self.out is not None:
            return self.out
        job = environ.get("TORCHELASTIC_RUN_ID") or environ.get("SLURM_JOB_ID")
        name = f"job-{job}" if job else time.strftime("%Y%m%d-%H%M%S", time.localtime(now_s))
        return os.path.join(DEFAULT_OUT_ROOT, name)


@dataclasses.dataclass(frozen=True, kw_only=True)
class PatchConfig:
    """How prism treats the installed Megatron."""

    allow_untested_megatron: bool = False
    """Apply patches on a megatron-core version they were not verified on, at your own risk."""
    list_patches: bool = False
    """Print the table of every patch prism can apply, and exit."""


SECTIONS: dict[str, type] = {
    "emulation": EmulationConfig,
    "capture": CaptureConfig,
    "cluster": ClusterConfig,
    "output": OutputConfig,
    "patches": PatchConfig,
}


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrismConfig:
    """Every prism setting of a run, by section."""

    emulation: EmulationConfig = dataclasses.field(default_factory=EmulationConfig)
    capture: CaptureConfig = dataclasses.field(default_factory=CaptureConfig)
    cluster: ClusterConfig = dataclasses.field(default_factory=ClusterConfig)
    output: OutputConfig = dataclasses.field(default_factory=OutputConfig)
    patches: PatchConfig = dataclasses.field(default_factory=PatchConfig)

    def __post_init__(self) -> None:
        gpu = self.emulation.modelled_gpu
        if gpu is not None and self.cluster.cluster == "default":
            # A modelled GPU runs in the system built of it, unless --prism-cluster names another.
            object.__setattr__(self, "cluster", ClusterConfig(cluster=PRESET_OF_GPU[gpu]))
        if self.emulation.phase == "emulate" and self.capture.graph is None:
            raise ValueError(
                "--prism-phase emulate needs --prism-graph (a graph folder, or a folder of capture files)"
            )

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> PrismConfig:
        """Build from a namespace parsed by a parser that `add_prism_arguments` extended."""
        sections = {}
        for section, section_cls in SECTIONS.items():
            values = {
                f.name: getattr(args, dest(f))
                for f in dataclasses.fields(section_cls)
                if hasattr(args, dest(f))
            }
            sections[section] = section_cls(**values)
        return cls(**sections)


def flag_name(field: dataclasses.Field) -> str:
    return FLAG_PREFIX + field.metadata.get("flag", field.name.replace("_", "-"))


def dest(field: dataclasses.Field) -> str:
    return "prism_" + field.name


@functools.cache
def field_docs(section_cls: type) -> dict[str, str]:
    """The docstring under each field, read from the class source (the single source of help text)."""
    tree = ast.parse(textwrap.dedent(inspect.getsource(section_cls)))
    body = tree.body[0].body
    docs = {}
    for node, following in itertools.pairwise(body):
        is_field = isinstance(node, ast.AnnAssign) and isinstance(node.target, ast.Name)
        if is_field and isinstance(following, ast.Expr) and isinstance(following.value, ast.Constant):
            docs[node.target.id] = " ".join(str(following.value.value).split())
    return docs


def _argparse_type(section_cls: type, field: dataclasses.Field) -> type | None:
    hint = typing.get_type_hints(section_cls)[field.name]
    args = [a for a in typing.get_args(hint) if a is not type(None)]
    return args[0] if args else hint


class _JoinedAction(argparse.Action):
    """A repeatable flag whose values join with commas (`--prism-straggler 5:2 --prism-straggler 9:1.5`
    is `5:2,9:1.5`), so a repeat adds to the list instead of silently replacing it."""

    def __call__(self, parser, namespace, values, option_string=None):
        previous = getattr(namespace, self.dest, None)
        setattr(namespace, self.dest, f"{previous},{values}" if previous else values)


def add_prism_arguments(parser: argparse.ArgumentParser) -> argparse.ArgumentParser:
    """Add the `--prism-*` flags, one per config field, in an argument group named 'prism'."""
    group = parser.add_argument_group("prism", "PrismLLM emulation (prism-megatron)")
    for section_cls in SECTIONS.values():
        docs = field_docs(section_cls)
        for field in dataclasses.fields(section_cls):
            kind = _argparse_type(section_cls, field)
            default = field.default
            help_text = f"{docs.get(field.name, '')} (default: {default})"
            if kind is bool:
                group.add_argument(flag_name(field), dest=dest(field), action="store_true", help=help_text)
            elif field.metadata.get("repeatable"):
                group.add_argument(
                    flag_name(field), dest=dest(field), action=_JoinedAction, default=default, help=help_text
                )
            else:
                choices = field.metadata.get("choices")
                group.add_argument(
                    flag_name(field),
                    dest=dest(field),
                    type=kind,
                    default=default,
                    choices=choices,
                    help=help_text,
                )
    return parser


def flag_table() -> list[tuple[str, Any, str]]:
    """(flag, default, help) for every flag, in order (for the README and the frozen-flag test)."""
    rows = []
    for section_cls in SECTIONS.values():
        docs = field_docs(section_cls)
        for field in dataclasses.fields(section_cls):
            rows.append((flag_name(field), field.default, docs.get(field.name, "")))
    return rows


class RaisingParser(argparse.ArgumentParser):
    """An argparse parser whose user errors raise ValueError with argparse's one-line message (after
    `error_prefix`) instead of printing the whole usage and exiting: every parser of flags that a
    library call reads (--prism-*, Megatron's) is one, so a caller decides how a mistake reaches the
    user (the commands and the launcher: one line, exit status 2). Abbreviations are refused, as
    Megatron-LM refuses them."""

    def __init__(self, *args: Any, error_prefix: str = "", **kwargs: Any) -> None:
        kwargs.setdefault("allow_abbrev", False)
        super().__init__(*args, **kwargs)
        self.error_prefix = error_prefix

    def error(self, message: str) -> typing.NoReturn:  # argparse's hook
        raise ValueError(f"{self.error_prefix}{message}")


def parse_prism_flags(argv: list[str]) -> PrismConfig:
    """The PrismConfig of the `--prism-*` flags among other flags (a script's or Megatron's)."""
    parser = RaisingParser(add_help=False)
    add_prism_arguments(parser)
    known, _ = parser.parse_known_args(argv)
    return PrismConfig.from_args(known)
