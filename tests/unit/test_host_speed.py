"""The host-speed probe's arithmetic and the demo benchmark's agreement verdict, on made-up samples."""

from __future__ import annotations

import pytest

from benchmarks.demo import run as demo_run
from benchmarks.host import speed


def _samples(unit_s_per_window: list[float], per_window: int = 20, window_s: float = 1.0):
    samples = []
    for index, unit_s in enumerate(unit_s_per_window):
        for k in range(per_window):
            samples.append((100.0 + index * window_s + k * window_s / per_window, unit_s))
    return samples


def test_a_slow_phase_is_measured_against_the_core_s_fast_state_not_its_median():
    # Slow (15 ms) for 7 of 10 windows: against its own median the core would look steady.
    units = [0.010, 0.010, 0.010, 0.015, 0.015, 0.015, 0.015, 0.015, 0.015, 0.015]
    summary = speed.summarize(_samples(units), window_s=1.0)
    assert summary["median_unit_ms"] == pytest.approx(15.0)
    assert summary["fast_unit_ms"] == pytest.approx(10.0)
    assert summary["slow_share"] == pytest.approx(0.7)
    assert summary["longest_slow_s"] == pytest.approx(7.0)
    assert summary["max_ratio"] == pytest.approx(1.5)


def test_a_steady_core_has_no_slow_window_and_a_probe_refuses_nonsense():
    summary = speed.summarize(_samples([0.010] * 12), window_s=1.0)
    assert summary["slow_share"] == 0 and summary["longest_slow_s"] == 0 and summary["max_ratio"] == 1.0
    with pytest.raises(ValueError, match="no unit of work finished"):
        speed.summarize([], window_s=1.0)
    with pytest.raises(ValueError, match="must be > 0"):
        speed.probe(0)


def _run(*medians):
    agreement = {str(rank): {"median_difference_pct": m} for rank, m in zip((0, 1024), medians, strict=True)}
    return {"agreement": agreement}


def test_the_demo_meets_issue_31_in_a_run_only_when_every_real_rank_s_median_is_within_1_percent():
    assert demo_run.agreement_met(_run(0.4, -0.99))
    assert not demo_run.agreement_met(_run(0.4, 1.2))
    assert not demo_run.agreement_met({"agreement": {}})  # nothing compared is not agreement
