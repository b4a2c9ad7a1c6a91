"""The emulation against its own simulation: each iteration against the schedule it ran.

A rank's results give, per iteration, the emulated time and the simulated time of the replay
schedule that iteration ran (`EmulatePhase.summary`); the report compares them pairwise after
warm-up, says the median and the range of the differences, and keeps the closed loop's last
schedule as its own line.
"""

from __future__ import annotations

import dataclasses
import json
import os

import pytest

from prism_megatron.emulation.summary import agreement_lines
from prism_megatron.report import RankReport, RunReport, TargetJob, iterations_from_times, write_report
from prism_megatron.report.agreement import RankAgreement, agreements, describe
from prism_megatron.report.schema import SchemaError, validate
from prism_megatron.topology import Layout

LAYOUT = Layout(world_size=64, tp=2, pp=4)
PHASE_0 = {
    "name": "emulate",
    "num_warmup": 1,
    "iteration_times_s": [0.900, 0.102, 0.099, 0.105],
    "simulated_iteration_times_s": [0.080, 0.100, 0.100, 0.100],
    "closed_loop_final_s": 0.101,
}
PHASE_33 = {**PHASE_0, "iteration_times_s": [0.950, 0.100, 0.100, 0.098]}


def test_each_iteration_after_warm_up_is_compared_with_the_schedule_it_ran():
    agreement = RankAgreement.from_phase(0, PHASE_0)
    assert agreement.iterations == (1, 2, 3)  # iteration 0 is warm-up
    assert agreement.differences_pct == pytest.approx((2.0, -1.0, 5.0))
    assert agreement.median_pct == pytest.approx(2.0)
    assert agreement.spread_pct == pytest.approx((-1.0, 5.0))
    assert agreement.closed_loop_final_s == 0.101
    assert describe(agreement) == "+2.00 % (-1.00 .. +5.00 %, 3 iterations)"


def test_a_pass_without_simulated_times_or_without_iterations_after_warm_up_has_no_agreement():
    assert RankAgreement.from_phase(0, {"name": "instant", "iteration_times_s": [0.1, 0.1]}) is None
    assert RankAgreement.from_phase(0, {**PHASE_0, "iteration_times_s": [0.9]}) is None
    found = agreements({0: {"prism_phase": PHASE_0}, 33: {"prism_phase": PHASE_33}, 5: {}})
    assert [a.virtual_rank for a in found] == [0, 33]


def _report(**changes):
    iterations = iterations_from_times([0.95, 0.102, 0.1, 0.105], num_warmup=1)
    report = RunReport(
        target=TargetJob.from_layout(LAYOUT, micro_batch_size=1, global_batch_size=32, seq_length=128),
        real_ranks=(0, 33),
        iterations=iterations,
        iteration_time_s=0.102,
        ranks={r: RankReport(virtual_rank=r) for r in (0, 33)},
        agreement=agreements({0: {"prism_phase": PHASE_0}, 33: {"prism_phase": PHASE_33}}),
    )
    return dataclasses.replace(report, **changes)


def _written(report, tmp_path):
    """report.json (validated, and read back equal) and report.md of `report` written to a folder."""
    out = str(tmp_path / "run")
    write_report(report, out)
    with open(os.path.join(out, "report.json")) as f:
        doc = json.load(f)
    validate(doc)
    assert RunReport.from_json(doc) == report
    with open(os.path.join(out, "report.md")) as f:
        return doc, f.read()


def test_report_json_holds_the_per_iteration_comparison_and_reads_back_equal(tmp_path):
    report = _report()
    doc, md = _written(report, tmp_path)
    entry = doc["agreement"]["0"]
    assert entry["iterations"] == [1, 2, 3] and entry["simulated_s"] == [0.1, 0.1, 0.1]
    assert entry["median_difference_pct"] == pytest.approx(2.0)
    assert (entry["min_difference_pct"], entry["max_difference_pct"]) == pytest.approx((-1.0, 5.0))
    assert entry["closed_loop_final_s"] == 0.101
    assert "## Emulated against its own simulation" in md
    assert "| 0 | 3 | +2.00 % | -1.00 .. +5.00 % |" in md
    assert "| 33 | 3 | +0.00 % | -2.00 .. +0.00 % |" in md


def test_the_schema_refuses_an_agreement_of_a_rank_that_is_not_real_or_of_unequal_lists():
    doc = _report().to_json()
    doc["agreement"]["5"] = doc["agreement"].pop("33")
    with pytest.raises(SchemaError, match=r"\$\.agreement\.5: virtual rank 5 is not one of real_ranks"):
        validate(doc)
    doc = _report().to_json()
    doc["agreement"]["0"]["simulated_s"].pop()
    with pytest.raises(SchemaError, match=r"\$\.agreement\.0: one value per iteration compared"):
        validate(doc)


PHASE_REPLAYED = {**PHASE_0, "replayed_iteration_times_s": [None, 0.102, 0.1, 0.104]}


def test_each_iteration_is_also_compared_with_its_schedule_replayed_with_its_own_compute():
    agreement = RankAgreement.from_phase(0, PHASE_REPLAYED)
    assert agreement.replayed_s == (0.102, 0.1, 0.104)
    assert agreement.replayed_differences_pct == pytest.approx((0.0, -1.0, 100 * (0.105 / 0.104 - 1)))
    assert agreement.replayed_median_pct == pytest.approx(0.0)
    assert describe(agreement, "replayed") == "+0.00 % (-1.00 .. +0.96 %, 3 iterations)"
    # The schedule's own simulation stays the first comparison.
    assert describe(agreement) == "+2.00 % (-1.00 .. +5.00 %, 3 iterations)"
    # An iteration compared without a replay (it diverged from the graph): no replayed comparison.
    gap = RankAgreement.from_phase(0, {**PHASE_0, "replayed_iteration_times_s": [None, 0.102, None, 0.1]})
    assert gap.replayed_s is None and describe(gap, "replayed") == "-"
    assert RankAgreement.from_phase(0, PHASE_0).replayed_s is None  # a run before it was recorded


def test_report_json_and_md_hold_the_replayed_comparison_and_read_back_equal(tmp_path):
    report = _report(
        agreement=agreements({0: {"prism_phase": PHASE_REPLAYED}, 33: {"prism_phase": PHASE_33}})
    )
    doc, md = _written(report, tmp_path)
    entry = doc["agreement"]["0"]
    assert entry["replayed_s"] == [0.102, 0.1, 0.104]
    assert entry["median_replayed_difference_pct"] == pytest.approx(0.0)
    assert "replayed_s" not in doc["agreement"]["33"]
    assert "| 0 | 3 | +2.00 % | -1.00 .. +5.00 % | - | - | +0.00 % | -1.00 .. +0.96 % |" in md
    assert "| 33 | 3 | +0.00 % | -2.00 .. +0.00 % | - | - | - | - |" in md
    doc["agreement"]["0"]["replayed_s"].pop()
    with pytest.raises(SchemaError, match=r"\$\.agreement\.0: one value per iteration compared"):
        validate(doc)


PHASE_EXPECTED = {**PHASE_REPLAYED, "expected_iteration_times_s": [None, 0.100, 0.102, 0.105]}


def test_each_iteration_is_compared_with_the_expected_time_of_the_schedule_it_ran():
    agreement = RankAgreement.from_phase(0, PHASE_EXPECTED)
    assert agreement.expected_s == (0.100, 0.102, 0.105)
    assert agreement.expected_differences_pct == pytest.approx((2.0, 100 * (0.099 / 0.102 - 1), 0.0))
    assert agreement.expected_median_pct == pytest.approx(0.0)
    assert describe(agreement, "expected") == "+0.00 % (-2.94 .. +2.00 %, 3 iterations)"
    # The other comparisons stay as they were.
    assert describe(agreement) == "+2.00 % (-1.00 .. +5.00 %, 3 iterations)"
    assert describe(agreement, "replayed") == "+0.00 % (-1.00 .. +0.96 %, 3 iterations)"
    # Missing for a compared iteration, or from an older run: none, and '-'.
    gap = RankAgreement.from_phase(
        0, {**PHASE_EXPECTED, "expected_iteration_times_s": [None, 0.1, None, 0.1]}
    )
    assert gap.expected_s is None and describe(gap, "expected") == "-"
    assert RankAgreement.from_phase(0, PHASE_REPLAYED).expected_s is None
    with pytest.raises(ValueError, match=r"against must be one of .*'simulated', 'expected'.*got 'replay'"):
        describe(agreement, "replay")


def test_report_json_and_md_hold_the_expected_comparison_and_read_back_equal(tmp_path):
    report = _report(
        agreement=agreements({0: {"prism_phase": PHASE_EXPECTED}, 33: {"prism_phase": PHASE_33}})
    )
    doc, md = _written(report, tmp_path)
    entry = doc["agreement"]["0"]
    assert entry["expected_s"] == [0.100, 0.102, 0.105]
    assert (entry["min_expected_difference_pct"], entry["max_expected_difference_pct"]) == pytest.approx(
        (100 * (0.099 / 0.102 - 1), 2.0)
    )
    assert "expected_s" not in doc["agreement"]["33"]
    assert "| 0 | 3 | +2.00 % | -1.00 .. +5.00 % | +0.00 % | -2.94 .. +2.00 % | +0.00 % |" in md
    doc["agreement"]["0"]["expected_s"].pop()
    with pytest.raises(SchemaError, match=r"\$\.agreement\.0: one value per iteration compared"):
        validate(doc)
    doc = report.to_json()
    del doc["agreement"]["0"]["median_expected_difference_pct"]
    with pytest.raises(SchemaError, match=r"median_expected_difference_pct"):
        validate(doc)
    doc = report.to_json()
    del doc["agreement"]["0"]["expected_s"]  # its median without it
    with pytest.raises(SchemaError, match=r"expected_s"):
        validate(doc)


def test_the_summary_prints_each_comparison_a_rank_has_and_only_those():
    lines = agreement_lines(agreements({0: {"prism_phase": PHASE_EXPECTED}, 33: {"prism_phase": PHASE_33}}))
    assert lines == [
        "real rank 0: emulated against the simulation of the schedule each iteration ran: "
        "+2.00 % (-1.00 .. +5.00 %, 3 iterations)",
        "real rank 0: emulated against that schedule's expected time (replayed with each iteration it was "
        "simulated from): +0.00 % (-2.94 .. +2.00 %, 3 iterations)",
        "real rank 0: emulated against that schedule replayed with the iteration's own measurements: "
        "+0.00 % (-1.00 .. +0.96 %, 3 iterations)",
        "real rank 33: emulated against the simulation of the schedule each iteration ran: "
        "+0.00 % (-2.00 .. +0.00 %, 3 iterations)",
    ]


PHASE_COMPUTE = {
    **PHASE_REPLAYED,
    "schedule_compute_s": [None, 0.050, 0.050, 0.040],
    "measured_compute_s": [None, 0.055, 0.045, 0.040],
}


def test_each_iteration_says_how_far_the_rank_s_compute_drifted_from_what_its_schedule_assumed():
    agreement = RankAgreement.from_phase(0, PHASE_COMPUTE)
    assert agreement.schedule_compute_s == (0.050, 0.050, 0.040)
    assert agreement.compute_drift_pct == pytest.approx((10.0, -10.0, 0.0))
    assert describe(agreement, "compute") == "+0.00 % (-10.00 .. +10.00 %, 3 iterations)"
    # Missing for a compared iteration (it diverged from the graph), or from an older run: none.
    gap = {**PHASE_COMPUTE, "measured_compute_s": [None, 0.055, None, 0.040]}
    assert RankAgreement.from_phase(0, gap).compute_drift_pct is None
    assert describe(RankAgreement.from_phase(0, PHASE_REPLAYED), "compute") == "-"
    # A schedule that assumed no compute at all gives no percentage rather than a division by zero,
    # and one list without the other gives neither.
    idle = {**PHASE_COMPUTE, "schedule_compute_s": [None, 0.0, 0.050, 0.040]}
    assert RankAgreement.from_phase(0, idle).compute_drift_pct is None
    alone = {**PHASE_REPLAYED, "measured_compute_s": [None, 0.055, 0.045, 0.040]}
    agreement = RankAgreement.from_phase(0, alone)
    assert agreement.measured_compute_s is None and agreement.schedule_compute_s is None


def test_the_rank_s_compute_in_the_emulation_is_set_against_the_capture_s():
    agreement = RankAgreement.from_phase(0, {**PHASE_COMPUTE, "captured_compute_s": 0.050})
    assert agreement.compute_against_capture_pct == pytest.approx(-10.0)  # median 0.045 against 0.050
    assert RankAgreement.from_phase(0, PHASE_COMPUTE).compute_against_capture_pct is None  # an older run


def test_report_json_and_md_hold_the_compute_drift_and_read_back_equal(tmp_path):
    phase = {**PHASE_COMPUTE, "captured_compute_s": 0.050}
    report = _report(agreement=agreements({0: {"prism_phase": phase}, 33: {"prism_phase": PHASE_33}}))
    doc, md = _written(report, tmp_path)
    entry = doc["agreement"]["0"]
    assert entry["measured_compute_s"] == [0.055, 0.045, 0.040]
    assert (entry["min_compute_drift_pct"], entry["max_compute_drift_pct"]) == pytest.approx((-10.0, 10.0))
    assert "schedule_compute_s" not in doc["agreement"]["33"]
    assert "| +0.00 % (-10.00 .. +10.00 %) |" in md
    assert "| real ranks' median compute in the emulation, against the capture's | 0: -10.0 % | - |" in md
    assert entry["captured_compute_s"] == 0.050
    doc["agreement"]["0"]["schedule_compute_s"].pop()
    with pytest.raises(SchemaError, match=r"\$\.agreement\.0: one value per iteration compared"):
        validate(doc)
    # A schedule of no compute, or the measured compute without the schedule's, is refused.
    doc = report.to_json()
    doc["agreement"]["0"]["schedule_compute_s"][0] = 0.0
    with pytest.raises(SchemaError, match=r"schedule_compute_s"):
        validate(doc)
    doc = report.to_json()
    del doc["agreement"]["0"]["schedule_compute_s"]
    with pytest.raises(SchemaError, match=r"schedule_compute_s"):
        validate(doc)
    # Read back, such an entry gives no drift rather than a division by zero.
    entry = {**report.to_json()["agreement"]["0"], "schedule_compute_s": [0.0, 0.05, 0.04]}
    assert RankAgreement.from_json(0, entry).compute_drift_pct is None
