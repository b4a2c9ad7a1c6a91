"""The regression gate: two run folders of one job, before and after a change, metric by metric.

from prism_megatron.compare import compare_runs, Thresholds
result = compare_runs("prism-out/before", "prism-out/after", Thresholds(max_regression_pct=5))
result.verdict            # "same", "regression" or "improvement"
result.doc                # the JSON document (`render.to_json`)

It reads what the report package wrote (report.json, the op logs) and judges (`judge.py`: threshold
plus a rank test on the per-iteration samples, `stats.py`); it sits above `report` and below the
command.
"""

from __future__ import annotations

import dataclasses

from prism_megatron.compare.job import check_same_job
from prism_megatron.compare.judge import (
    IMPROVEMENT,
    REGRESSION,
    SAME,
    Judged,
    Thresholds,
    judge,
    overall,
)
from prism_megatron.compare.metrics import RunMetrics, load_run
from prism_megatron.compare.render import to_json


@dataclasses.dataclass(frozen=True)
class Comparison:
    run_a: RunMetrics
    run_b: RunMetrics
    judged: list[Judged]
    verdict: str
    doc: dict


def compare_runs(run_a: str, run_b: str, thresholds: Thresholds | None = None) -> Comparison:
    """Compare two run folders.

    Raises:
        ValueError: a folder is not a finished run, or the two are runs of different jobs (the
            message names every field that differs).
    """
    thresholds = thresholds or Thresholds()
    metrics_a, metrics_b = load_run(run_a), load_run(run_b)
    check_same_job(metrics_a.report, metrics_b.report)
    judged = judge(metrics_a, metrics_b, thresholds)
    verdict = overall(judged, thresholds.gate_breakdown)
    return Comparison(
        metrics_a, metrics_b, judged, verdict, to_json(metrics_a, metrics_b, judged, verdict, thresholds)
    )


__all__ = [
    "IMPROVEMENT",
    "REGRESSION",
    "SAME",
    "Comparison",
    "Thresholds",
    "compare_runs",
]
