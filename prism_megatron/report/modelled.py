"""What a run on a modelled GPU reports: its modelled iteration, throughput, MFU and time by kind.

A modelled run (`--prism-device model:<gpu>`) measures nothing: its ranks ran the real program on
fake tensors and the GPU model gave every op its time, so its iteration time is the simulation's
of the graph so captured. The report says so wherever a measured run says "measured": "modelled on
H100 by prism's GPU model". The numbers are made by the run (`emulation/modelled_run.py`); this
module holds and renders them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping
from typing import Any

KINDS = ("gemm", "attention", "memory", "launch", "exposed_communication", "pipeline_bubble")
"""The parts of a modelled iteration, in report order; they sum to the iteration time."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModelledReport:
    """The modelled iteration of the whole job."""

    gpu: str
    """The modelled GPU as --prism-device names it (h100, ...)."""
    gpu_name: str
    """Its display name (H100 SXM, ...)."""
    peak_tflops: float
    """Dense BF16 peak of one GPU (datasheet), 10^12 FLOP/s: MFU's denominator."""
    iteration_time_s: float
    """The simulated iteration of the graph captured on the modelled GPU."""
    tflops_per_gpu: float | None
    """Model FLOPs per iteration / (iteration time x world size), 10^12 per second."""
    mfu: float | None
    """tflops_per_gpu / peak_tflops."""
    tokens_per_s_per_gpu: float | None
    critical_role: str
    """The role whose time by kind is given: the one with the most compute."""
    time_by_kind_s: Mapping[str, float]
    """That role's iteration by kind (KINDS): its compute split as the GPU model charged it on the
    captured rank of its class, plus its exposed communication and pipeline bubble."""
    moe_routing: str | None = None
    """"balanced" for an MoE model: the token counts its dispatchers read are the balanced-routing
    stand-in (`patches/modelled_moe.py`), not data; None for a dense model."""
    attention_kernel: str | None = None
    """The fused attention kernel whose measured curve timed attention ("cuDNN fused attention",
    "FlashAttention-3"): the one a GPU run of the flags takes (--attention-backend; on auto,
    Transformer Engine's choice for the GPU). None from a run that did not record it."""
    memory_capacity_bytes: float | None = None
    """The memory the GPU reports (NVML, `gpu_model` constants); None from a run that did not record it."""
    over_capacity: Mapping[str, int] = dataclasses.field(default_factory=dict)
    """Captured roles whose modelled peak allocated memory exceeds `memory_capacity_bytes`: role ->
    peak bytes. The GPU's usable memory is less still (the CUDA context, the allocator's reserve)."""

    @property
    def method(self) -> str:
        return f"modelled on {self.gpu.upper()} by prism's GPU model"

    def to_json(self) -> dict[str, Any]:
        return {
            **dataclasses.asdict(self),
            "time_by_kind_s": dict(self.time_by_kind_s),
            "over_capacity": dict(self.over_capacity),
            "method": self.method,
        }

    @classmethod
    def from_json(cls, doc: Mapping[str, Any]) -> ModelledReport:
        return cls(**{k: v for k, v in doc.items() if k != "method"})

    def markdown(self) -> list[str]:
        """The report.md section."""
        total = self.iteration_time_s
        rows = [
            f"| iteration time | {total * 1e3:.2f} ms |",
            f"| model TFLOP/s per GPU | {_num(self.tflops_per_gpu, '.1f')} |",
            f"| MFU (of {self.peak_tflops:.0f} TFLOP/s dense BF16) | {_num(self.mfu, '.1%')} |",
            f"| tokens/s per GPU | {_num(self.tokens_per_s_per_gpu, '.0f')} |",
        ]
        kinds = [
            f"| {kind.replace('_', ' ')} | {self.time_by_kind_s.get(kind, 0.0) * 1e3:.2f} ms | "
            f"{self.time_by_kind_s.get(kind, 0.0) / total:.1%} |"
            for kind in KINDS
        ]
        return [
            f"## Modelled GPU: {self.gpu_name}",
            "",
            f"Every time in this report is **{self.method}**: nothing was measured. The ranks ran the real "
            "program at full size on fake tensors; each op's kernel time came from the GPU model, each "
            "collective's from the cluster's network model, and the iteration from the simulation.",
            "",
            "| | |",
            "|---|---|",
            *rows,
            "",
            *self._notes(),
            f"Time by kind of role `{self.critical_role}` (the most compute):",
            "",
            "| kind | time | share |",
            "|---|---|---|",
            *kinds,
        ]

    def _notes(self) -> list[str]:
        """The paragraphs that apply to this run: memory over the GPU's, the MoE routing stand-in,
        the attention kernel."""
        notes = []
        if self.over_capacity:
            notes += [f"**{self.memory_warning()}**", ""]
        if self.moe_routing is not None:
            notes += [
                f"MoE routing is **{self.moe_routing}** (a stand-in, fake tensors hold no routing): every "
                "expert receives tokens x topk / experts of the tokens routed to it, the all-to-all split "
                "sizes follow.",
                "",
            ]
        if self.attention_kernel is not None:
            notes += [
                f"Attention is timed as **{self.attention_kernel}** runs it: the kernel a GPU run of these "
                "flags takes (`--attention-backend`; on `auto`, Transformer Engine's choice for this GPU).",
                "",
            ]
        return notes

    def memory_warning(self) -> str | None:
        """One line naming the roles whose modelled peak exceeds the GPU's memory (None: none does)."""
        if not self.over_capacity or not self.memory_capacity_bytes:
            return None
        worst = sorted(self.over_capacity.items(), key=lambda item: -item[1])
        shown = ", ".join(f"{role} {peak / 2**30:.1f} GiB" for role, peak in worst[:4])
        more = f" and {len(worst) - 4} more" if len(worst) > 4 else ""
        peaks = "peaks" if len(worst) > 1 else "peak"
        return (
            f"out of memory on a real {self.gpu_name}: the modelled {peaks} of {shown}{more} "
            f"{'exceed' if len(worst) > 1 else 'exceeds'} the {self.memory_capacity_bytes / 2**30:.1f} GiB "
            "it reports (NVML; the CUDA context and the allocator take some of that)"
        )

    def summary_line(self) -> str:
        return (
            f"modelled iteration time: {self.iteration_time_s * 1e3:9.2f} ms  ({self.method}); "
            f"{_num(self.tflops_per_gpu, '.1f')} TFLOP/s per GPU, MFU {_num(self.mfu, '.1%')}, "
            f"{_num(self.tokens_per_s_per_gpu, '.0f')} tokens/s per GPU"
        )


def _num(value: float | None, spec: str) -> str:
    return "n/a" if value is None else format(value, spec)
