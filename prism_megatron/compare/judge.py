"""The regression gate's verdicts: per metric, is run B worse than run A beyond the noise and the threshold?

A metric of B is a **regression** when both hold:

1. it grew by more than the threshold (`--max-regression` for times, `--max-memory-regression` for
   memory), as a percentage of its scale in run A (the iteration time for a time part, the peak
   for a memory category, else the metric itself; see `metrics.Metric.scale_key`), and
2. the growth is not noise: where both runs have per-iteration samples, the Mann-Whitney U test
   (`stats.py`) rejects "no shift" at level `alpha`. A metric with one value per run (memory,
   simulated times) has no noise to test, and the threshold alone decides.

The mirror image is an **improvement**; anything else is **same** (a change beyond the threshold
that the test cannot tell from noise is "same", with the p-value shown). When the sample sizes
cannot reach `alpha` at all (3 iterations against 3: the smallest p is 0.1), the test is skipped and
the threshold decides, and the output says so. Metrics present in one run only are listed, never
judged. Higher is worse for every metric compared (times, bytes) but the throughput.

The run's verdict (`overall`) rests on the headline metrics (iteration time, throughput, peak
memory: `metrics.Metric.headline`); the breakdown metrics get their own verdicts, which the output
names, and decide the run's only with `Thresholds.gate_breakdown` (`--gate-breakdown`).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from prism_megatron.compare import stats
from prism_megatron.compare.metrics import MEMORY, Metric, RunMetrics

SAME = "same"
REGRESSION = "regression"
IMPROVEMENT = "improvement"
ONLY_A = "only in A"
ONLY_B = "only in B"


@dataclasses.dataclass(frozen=True, kw_only=True)
class Thresholds:
    """When a change counts."""

    max_regression_pct: float = 5.0
    """Time metrics: the largest growth, in % of the scale, that is not a regression."""
    max_memory_regression_pct: float = 1.0
    """Memory metrics: the same for bytes."""
    alpha: float = 0.05
    """Significance level of the rank test."""
    gate_breakdown: bool = False
    """Let a breakdown metric's regression (a bubble, a role's simulated compute ...) fail the gate too."""

    def __post_init__(self) -> None:
        for name in ("max_regression_pct", "max_memory_regression_pct"):
            value = getattr(self, name)
            if not value >= 0:
                flag = "--" + name.removesuffix("_pct").replace("_", "-")
                raise ValueError(f"{flag} must be a percentage >= 0, got {value!r}")
        if not 0 < self.alpha < 1:
            raise ValueError(f"--alpha must be in (0, 1), got {self.alpha!r}")

    def for_kind(self, kind: str) -> float:
        return self.max_memory_regression_pct if kind == MEMORY else self.max_regression_pct


@dataclasses.dataclass(frozen=True)
class Judged:
    """One metric of both runs and the verdict."""

    key: str
    label: str
    kind: str
    a: float | None
    b: float | None
    difference: float | None
    change_pct: float | None
    """(b - a) as a % of the scale (see the module docstring); None when a run lacks the metric."""
    scale: str
    """What the change is a percentage of: "itself", "iteration time", ..."""
    p_value: float | None
    """The rank test's p-value; None when not tested."""
    test: str
    """How the verdict was reached: "rank test", "one value per run", "too few samples (...)"."""
    verdict: str
    megatron_name: str | None
    num_samples: tuple[int, int]
    headline: bool = False
    """Whether the run's verdict rests on it (else a breakdown metric, gated only when asked)."""


def judge(run_a: RunMetrics, run_b: RunMetrics, thresholds: Thresholds) -> list[Judged]:
    """Every metric of either run, in run A's order then B's extras."""
    keys = list(dict.fromkeys([*run_a.metrics, *run_b.metrics]))
    return [_judge_one(key, run_a.metrics, run_b.metrics, thresholds) for key in keys]


def _judge_one(
    key: str, metrics_a: Mapping[str, Metric], metrics_b: Mapping[str, Metric], t: Thresholds
) -> Judged:
    a, b = metrics_a.get(key), metrics_b.get(key)
    some = a or b
    assert some is not None
    if a is None or b is None:
        return Judged(
            key=key,
            label=some.label,
            kind=some.kind,
            a=a.value if a else None,
            b=b.value if b else None,
            difference=None,
            change_pct=None,
            scale="",
            p_value=None,
            test="not judged",
            verdict=ONLY_B if a is None else ONLY_A,
            megatron_name=some.megatron_name,
            num_samples=(len(a.samples) if a else 0, len(b.samples) if b else 0),
            headline=some.headline,
        )
    scale_metric = metrics_a.get(a.scale_key) if a.scale_key else a
    scale_value = scale_metric.value if scale_metric is not None else a.value
    difference = b.value - a.value
    change_pct = (
        100.0 * difference / scale_value if scale_value else (0.0 if difference == 0 else float("inf"))
    )
    threshold = t.for_kind(a.kind)
    p_value, test, noise = None, "one value per run", False
    if len(a.samples) >= 1 and len(b.samples) >= 1:
        reachable = stats.smallest_p(len(a.samples), len(b.samples))
        if reachable > t.alpha:
            test = f"too few samples ({len(a.samples)} and {len(b.samples)}) for the rank test"
        else:
            p_value = stats.mann_whitney(a.samples, b.samples).p_value
            test = "rank test"
            noise = p_value >= t.alpha
    worse_pct = -change_pct if a.higher_is_better else change_pct
    verdict = SAME
    if not noise and worse_pct > threshold:
        verdict = REGRESSION
    elif not noise and worse_pct < -threshold:
        verdict = IMPROVEMENT
    return Judged(
        key=key,
        label=a.label,
        kind=a.kind,
        a=a.value,
        b=b.value,
        difference=difference,
        change_pct=change_pct,
        scale="itself" if scale_metric is a or scale_metric is None else scale_metric.label,
        p_value=p_value,
        test=test,
        verdict=verdict,
        megatron_name=a.megatron_name,
        num_samples=(len(a.samples), len(b.samples)),
        headline=a.headline,
    )


def gated(judged: list[Judged], gate_breakdown: bool = False) -> list[Judged]:
    """The metrics the run's verdict rests on: the headline ones, or all with `gate_breakdown`."""
    return [j for j in judged if j.headline or gate_breakdown]


def overall(judged: list[Judged], gate_breakdown: bool = False) -> str:
    """Over the gated metrics: REGRESSION if any regressed, else IMPROVEMENT if any improved, else SAME."""
    verdicts = {j.verdict for j in gated(judged, gate_breakdown)}
    if REGRESSION in verdicts:
        return REGRESSION
    return IMPROVEMENT if IMPROVEMENT in verdicts else SAME
