"""The fidelity suite's tools that need no suite run: the concurrency calibration's fit (two-peer
batches included), the diagnosis's split of a real iteration's drift and its cases, and the host
bursts' measurement (a few forked processes)."""

from __future__ import annotations

import os

import pytest

from benchmarks.fidelity import calibrate, concurrency, diagnose
from prism_megatron.replay import OpKind


def test_the_concurrency_fit_keeps_the_two_peer_batches_measured_alone():
    one = {
        "SEND/2/512@1": [100e3, 110e3],
        "SEND/2/512@2": [150e3],
        "BATCH/2/512@1": [120e3, 140e3],
        "BATCH/4/512@1": [300e3],
    }
    other = {"SEND/2/512@1": [90e3], "BATCH/2/512@1": [130e3], "BATCH/4/4096@1": [250e3]}
    cost = concurrency.fit([one, other], name="test")
    assert cost.tables[(OpKind.SEND, 2)] == ((512, 100e3),)
    assert cost.concurrency[(OpKind.SEND, 2)] == ((1.0, 1.0), (2.0, 1.5))
    assert cost.batches[2] == ((512, 130e3),)  # median over members and repetitions
    assert cost.batches[4] == ((512, 300e3), (4096, 300e3))  # monotone: more bytes never cost less
    assert cost.batch_cost(2, 512) == 130e3 and cost.batch_cost(4, 4096) == 300e3
    # and the file keeps them: a cost file read back costs the batches the same
    assert cost.to_dict()["batches_us"] == {"2": [[512, 130.0]], "4": [[512, 300.0], [4096, 300.0]]}


def test_without_batch_samples_the_concurrency_fit_has_no_batch_table():
    cost = concurrency.fit([{"SEND/2/512@1": [100e3]}], name="test")
    assert cost.batches == {} and cost.batch_cost(2, 512) is None


def test_the_concurrency_plan_rejects_a_ring_without_two_peers():
    with pytest.raises(ValueError, match="ring_size"):
        concurrency.ConcurrencyPlan(ring_size=2)
    assert concurrency.ConcurrencyPlan(ring_size=0).ring_size == 0
    # the batches are measured from the job pattern's common deadline, as every other op here
    assert concurrency.ConcurrencyPlan().timing.pattern == "job"
    assert calibrate.BATCH_OPS == (2, 4)


def test_the_split_of_a_drift_adds_up_to_the_last_step_s_end_difference():
    real = [(5.0, 6.0, "exchange"), (10.0, 13.0, "exchange"), (20.0, 21.0, "all-reduce")]
    simulated = [(4.0, 5.0, "S"), (8.0, 9.0, "R"), (14.0, 16.0, "AR")]
    parts = diagnose.split(real, simulated)
    assert parts["steps_matched"] == 3
    assert parts["before"] == pytest.approx(1.0)  # the first compute ran 1 ms longer
    assert parts["compute"] == pytest.approx((4.0 - 3.0) + (7.0 - 5.0))
    assert parts["steps"] == pytest.approx((1 - 1) + (3 - 1) + (1 - 2))
    assert parts["before"] + parts["compute"] + parts["steps"] == pytest.approx(
        real[-1][1] - simulated[-1][1]
    )


def test_the_split_matches_only_the_steps_both_have():
    assert diagnose.split([], [(0.0, 1.0, "S")]) == {
        "steps_matched": 0,
        "before": 0.0,
        "compute": 0.0,
        "steps": 0.0,
    }
    parts = diagnose.split([(1.0, 2.0, "exchange")], [(0.0, 1.0, "S"), (3.0, 4.0, "R")])
    assert parts == {"steps_matched": 1, "before": 1.0, "compute": 0, "steps": 0.0}


def test_real_steps_are_the_iteration_s_windows_in_order_from_its_start():
    trace = {
        "starts_ns": [0, 100_000_000],
        "ends_ns": [100_000_000, 200_000_000],
        "exchanges_ns": [[110_000_000, 111_000_000], [50_000_000, 51_000_000]],
        "all_reduces_ns": [[190_000_000, 195_000_000]],
    }
    assert diagnose.real_steps(trace, 1) == [(10.0, 11.0, "exchange"), (90.0, 95.0, "all-reduce")]
    assert diagnose.real_steps(trace, 0) == [(50.0, 51.0, "exchange")]


def test_late_sleeps_count_only_the_iteration_s_sleeps_and_what_they_overslept():
    sleeps = [(5_000_000, 16_000_000, 10_000_000), (20_000_000, 30_500_000, 10_000_000), (120_000_000, 140_000_000, 20_000_000)]  # fmt: skip
    assert diagnose.late_sleeps_ms(sleeps, 0, 100_000_000) == (2, pytest.approx(1.5))
    assert diagnose.late_sleeps_ms(sleeps, 100_000_000, 200_000_000) == (1, 0.0)
    assert diagnose.late_sleeps_ms([], 0, 1) == (0, 0)


def test_an_iteration_s_split_and_a_rank_s_summary_of_medians():
    ms = 1_000_000
    trace = {
        "starts_ns": [0, 100 * ms, 200 * ms],
        "ends_ns": [100 * ms, 200 * ms, 312 * ms],
        "exchanges_ns": [[10 * ms, 12 * ms], [111 * ms, 112 * ms], [214 * ms, 215 * ms]],
        "all_reduces_ns": [[90 * ms, 95 * ms], [190 * ms, 196 * ms], [300 * ms, 305 * ms]],
        "sleeps_ns": [(1 * ms, 10 * ms, 9 * ms), (101 * ms, 111 * ms, 9 * ms), (201 * ms, 214 * ms, 9 * ms)],
    }
    simulated = [(10.0, 11.0, "S"), (90.0, 94.0, "AR")]
    first = diagnose.iteration_split(trace, 0, simulated, 98.0)
    assert first["real"] == pytest.approx(100.0) and first["drift"] == pytest.approx(2.0)
    assert (first["before"], first["sleeps"], first["late"]) == (0.0, 1, 0.0)
    # exchange 10-12 against 10-11, all-reduce 90-95 against 90-94, real iteration 100 against 98 ms
    assert (first["compute"], first["steps"], first["after"]) == pytest.approx((-1.0, 2.0, 1.0))
    late = diagnose.iteration_split(trace, 2, simulated, 98.0)
    assert late["drift"] == pytest.approx(14.0) and late["late"] == pytest.approx(4.0)
    assert late["before"] == pytest.approx(4.0)  # the iteration's first sleep overslept by 4 ms
    assert (late["compute"], late["steps"], late["after"]) == pytest.approx((6.0, 1.0, 3.0))
    summary = diagnose.median_split(trace, range(3), simulated, 98.0)
    assert summary["drift"] == pytest.approx(2.0)  # drifts 2, 2 and 14 ms
    assert summary["late"] == pytest.approx(1.0)  # 0, 1 and 4 ms late
    assert summary["compute"] == pytest.approx(-1.0)  # -1, -1 and 6 ms: each key its own median
    two = diagnose.median_split(trace, range(1, 3), simulated, 98.0)  # an even count: the middle two
    assert (two["drift"], two["late"], two["before"]) == pytest.approx((8.0, 2.5, 2.5))
    with pytest.raises(ValueError, match="no timed iterations"):
        diagnose.median_split(trace, range(0), simulated, 98.0)


def test_a_diagnosis_takes_the_mechanism_suite_s_cases_and_refuses_an_unknown_cost_pattern():
    from benchmarks.fidelity import mechanism

    cases = diagnose._cases()
    assert {c.name for c in mechanism.mechanism_cases()} <= set(cases)
    assert "pp8-vpp2-dp2" in cases
    assert (
        diagnose.default_pattern("mech-pp4-dp4") == "alone" and diagnose.default_pattern("pp4-dp4") == "job"
    )
    with pytest.raises(ValueError, match="--costs must be one of job, alone"):
        diagnose.diagnose("mech-pp4-dp4", None, None, "concurrent")
    with pytest.raises(ValueError, match="no case 'nope'"):
        diagnose.diagnose("nope", None, None, "alone")


def test_host_bursts_started_together_on_few_cores_queue_for_them():
    from benchmarks.fidelity import host_bursts

    count = host_bursts.burst_count(0.2)
    assert count > 0
    alone_ms = min(host_bursts.burst_alone_ms(count) for _ in range(3))  # a lower bound: the quietest
    one = host_bursts.measure(1, count, rounds=3)
    four = host_bursts.measure(4, count, rounds=3)
    assert one["processes"] == 1 and four["processes"] == 4
    assert one["mean_completion_ms"] >= 0.75 * alone_ms  # a burst takes its time
    assert one["mean_wake_ms"] < 20.0 and four["mean_wake_ms"] < 20.0  # each woke at its instant, not later
    # four bursts on C cores: the last of them ends no sooner than ceil(4 / C) bursts back to back
    turns = -(-4 // len(os.sched_getaffinity(0)))
    assert four["mean_largest_completion_ms"] >= 0.75 * turns * alone_ms


def test_the_mechanism_suite_s_compute_scale_stretches_every_step_and_refuses_a_bad_factor():
    from benchmarks.fidelity import mechanism

    four = {c.name: c.job for c in mechanism.mechanism_cases(scale=4)}
    eight = {c.name: c.job for c in mechanism.mechanism_cases(scale=8)}
    assert {c.name: c.job for c in mechanism.mechanism_cases()} == eight  # the default, issue 28's premise
    assert four.keys() == eight.keys()
    for name, job in four.items():
        assert eight[name].fwd_ms == 2 * job.fwd_ms and eight[name].bwd_ms == 2 * job.bwd_ms
        assert eight[name].num_microbatches == job.num_microbatches
    with pytest.raises(ValueError, match="--compute-scale 0: must be a positive factor"):
        mechanism.mechanism_cases(scale=0)
    with pytest.raises(SystemExit):
        mechanism.main(["--compute-scale", "-1", "--plan"])
    # The diagnosis takes a mechanism case at the scale it ran.
    assert diagnose._cases(4)["mech-pp4-dp4"].job == four["mech-pp4-dp4"]
    assert diagnose._cases()["mech-pp4-dp4"].job == eight["mech-pp4-dp4"]
    with pytest.raises(ValueError, match="--compute-scale -2"):
        diagnose.diagnose("mech-pp4-dp4", None, None, "alone", -2)
