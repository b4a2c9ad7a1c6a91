"""The run report: report.json (with its schema), report.md, the Perfetto timeline and the plots.

from prism_megatron.report import RunReport, RankReport, RoleReport, TargetJob, write_report
report = RunReport(target=TargetJob(...), real_ranks=(5,), ranks={5: RankReport.from_pieces(...)}, ...)
write_report(report, out_dir, sim_result=result, measured_ops={5: events})   # or OpLog per rank

The package renders what a run measured and what the simulator predicted; it recomputes nothing.
Names are imported on first use, so `prism_megatron.report.trace` stays cheap for the simulator
(the writer pulls in matplotlib).
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "Failure": "model",
    "IterationRecord": "model",
    "RankReport": "model",
    "RoleReport": "model",
    "RunReport": "model",
    "TargetJob": "model",
    "iterations_from_times": "model",
    "median_iteration_time_s": "model",
    "SCHEMA_VERSION": "schema",
    "SchemaError": "schema",
    "validate": "schema",
    "ModelShape": "flops",
    "model_flops_per_iteration": "flops",
    "tflops_per_gpu": "flops",
    "tokens_per_s_per_gpu": "flops",
    "MEGATRON_NAMES": "model",
    "ComputeSpan": "oplog",
    "OpLog": "oplog",
    "save_op_log": "oplog",
    "load_report": "writer",
    "rerender": "writer",
    "write_report": "writer",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    return getattr(importlib.import_module(f"{__name__}.{_EXPORTS[name]}"), name)
