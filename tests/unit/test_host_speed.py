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


def test_a_short_probe_takes_its_fastest_window_a_stall_counts_slow_and_a_partial_last_window_none():
    # Five windows: fewer than ten, so the fastest one is the fast state.
    assert speed.summarize(_samples([0.012, 0.010, 0.011, 0.010, 0.013]), 1.0)[
        "fast_unit_ms"
    ] == pytest.approx(10)
    # One unit of 2.5 s from 102.0: window 2 holds it and no unit starts in window 3, as slow.
    stalled = [*_samples([0.010, 0.010]), (102.0, 2.5), *[(104.5 + k * 0.01, 0.010) for k in range(160)]]
    summary = speed.summarize(stalled, window_s=1.0)
    assert summary["window_ratios"][2:5] == [250.0, 250.0, 1.0] and summary["longest_slow_s"] == 2.0
    # The probe ended 0.1 s into window 6: that window is left out, not judged on ten units.
    assert len(summary["window_ratios"]) == 6


def _run(*medians, real_ranks=(0, 1024)):
    agreement = {
        str(rank): {"median_difference_pct": m} for rank, m in zip(real_ranks, medians, strict=False)
    }
    return {"real_ranks": list(real_ranks), "agreement": agreement}


def test_the_demo_meets_issue_31_in_a_run_only_when_every_real_rank_s_median_is_within_1_percent():
    assert demo_run.agreement_met(_run(0.4, -0.99))
    assert not demo_run.agreement_met(_run(0.4, 1.2))
    assert not demo_run.agreement_met(_run(0.4))  # rank 1024 was not compared at all
    assert not demo_run.agreement_met({"real_ranks": [], "agreement": {}})  # nothing compared


def test_the_demo_is_judged_against_the_expected_time_apart_from_the_simulation():
    both = {
        "real_ranks": [0, 1024],
        "agreement": {
            "0": {"median_difference_pct": 1.6, "median_expected_difference_pct": 0.3},
            "1024": {"median_difference_pct": 0.2, "median_expected_difference_pct": -1.1},
        },
    }
    assert not demo_run.agreement_met(both) and not demo_run.agreement_met(both, "expected")
    both["agreement"]["1024"]["median_expected_difference_pct"] = -0.9
    assert demo_run.agreement_met(both, "expected") and not demo_run.agreement_met(both, "simulated")
    assert not demo_run.agreement_met(_run(0.4, 0.4), "expected")  # a run without the expected time
