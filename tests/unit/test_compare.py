"""`prism-megatron compare RUN_A RUN_B`: the regression gate on hand-made run folders.

Real emulations judged in repeated pairs (the noise bar of the issue) are in benchmarks/compare.
"""

import itertools
import json
import math
import os
import statistics

import pytest

from prism_megatron.cli import main
from prism_megatron.compare import Thresholds, compare_runs
from prism_megatron.compare.metrics import measured_breakdown
from prism_megatron.compare.stats import _u_counts, mann_whitney, smallest_p
from prism_megatron.files import write_json
from prism_megatron.replay.events import OpEvent
from prism_megatron.replay.schedule import OpKind
from prism_megatron.report import Failure, RankReport, RoleReport, RunReport, TargetJob, iterations_from_times
from prism_megatron.report.oplog import ComputeSpan, OpLog, save_op_log
from prism_megatron.topology import Layout

BASE_MS = [120.0, 100.0, 101.0, 99.0, 100.5, 100.2, 99.6, 100.8]  # the first is warm-up


def _run(tmp_path, name, times_ms, *, peak=1 << 20, tp=2, status="ok", bubble_s=0.01, simulated_s=0.09):
    out = str(tmp_path / name)
    times = [t / 1e3 for t in times_ms]
    iterations = iterations_from_times(times, num_warmup=1)
    median = statistics.median(times[1:])
    layout = Layout(world_size=16, tp=tp, pp=2)
    role = RoleReport(
        role="pp0",
        virtual_rank=0,
        count=16,
        compute_s=simulated_s - 0.04,
        exposed_comm_s=0.04 - bubble_s,
        bubble_s=bubble_s,
    )
    report = RunReport(
        target=TargetJob.from_layout(layout, micro_batch_size=1, global_batch_size=8, seq_length=64),
        real_ranks=(2,),
        status=status,
        iterations=iterations,
        iteration_time_s=median,
        ranks={
            2: RankReport(
                virtual_rank=2,
                peak_memory_allocated_bytes=peak,
                memory_by_category={"parameters": peak // 4, "activations": peak // 2},
            )
        },
        roles=(role,),
        simulated_iteration_time_s=simulated_s,
        tokens_per_s_per_gpu=8 * 64 / median / 16,
        failure=None if status == "ok" else Failure(message="rank 2 died"),
        prism={"emulation": {"device": "cpu"}},
    )
    os.makedirs(out)
    write_json(report.to_json(), os.path.join(out, "report.json"), indent=1)
    # An op log: per iteration, compute for 60 % of it, a collective waiting 10 % then transferring 10 %.
    starts, compute, events, t = [], [], [], 0
    for time_ms in times_ms:
        length = int(time_ms * 1e6)
        starts.append(t)
        compute.append(ComputeSpan("compute", t, t + int(0.6 * length)))
        issue = t + int(0.6 * length)
        events.append(
            OpEvent(
                OpKind.ALL_REDUCE,
                (2, 3),
                -1,
                len(events),
                4,
                "Float",
                issue,
                issue + int(0.1 * length),
                issue + int(0.2 * length),
                False,
                True,
            )
        )
        t += length
    save_op_log(
        out,
        OpLog(
            virtual_rank=2, events=tuple(events), compute=tuple(compute), iteration_starts_ns=tuple(starts)
        ),
    )
    return out


def _cli(capsys, argv):
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


# ---- the rank test -------------------------------------------------------------------------------


@pytest.mark.parametrize(("n_a", "n_b"), [(1, 1), (3, 3), (4, 6), (5, 5)])
def test_exact_u_distribution_matches_counting_every_ordering(n_a, n_b):
    counts = [0] * (n_a * n_b + 1)
    for a_positions in itertools.combinations(range(n_a + n_b), n_a):
        a = set(a_positions)
        counts[sum(1 for j in range(n_a + n_b) if j not in a for i in a if j > i)] += 1
    assert tuple(counts) == _u_counts(n_a, n_b)


def test_mann_whitney_known_values():
    # Completely separated samples of 5: the smallest two-sided p, 2 / C(10, 5).
    assert mann_whitney([1, 2, 3, 4, 5], [6, 7, 8, 9, 10]).p_value == pytest.approx(2 / 252)
    assert smallest_p(5, 5) == pytest.approx(2 / 252)
    # Interleaved: U = 15 of 25, p = 0.6905 (scipy.stats.mannwhitneyu, method="exact").
    result = mann_whitney([1, 2, 3, 4, 5], [1.5, 2.5, 3.5, 4.5, 5.5])
    assert (result.u, result.method) == (15.0, "exact")
    assert result.p_value == pytest.approx(0.690476, abs=1e-6)
    # Ties: the normal approximation with tie correction; all equal means no evidence at all.
    assert mann_whitney([1, 1, 2], [1, 2, 2]).method == "normal approximation"
    assert mann_whitney([3, 3, 3], [3, 3, 3]).p_value == 1.0


# ---- measured breakdown --------------------------------------------------------------------------


def test_measured_breakdown_splits_each_iteration_into_compute_exposed_comm_and_bubble(tmp_path):
    from prism_megatron.report.oplog import load_op_logs

    out = _run(tmp_path, "a", [100.0, 200.0])
    rows = measured_breakdown(load_op_logs(out)[2], last_iteration_s=0.2)
    # 60 % compute, 10 % waiting for the last member (bubble), 10 % transfer (exposed), 20 % idle (bubble).
    assert rows[0] == pytest.approx((0.060, 0.010, 0.030))
    assert rows[1] == pytest.approx((0.120, 0.020, 0.060))


# ---- verdicts ------------------------------------------------------------------------------------


def test_same_configuration_with_noise_is_same_and_exits_0(capsys, tmp_path):
    a = _run(tmp_path, "a", BASE_MS)
    b = _run(
        tmp_path,
        "b",
        [t * f for t, f in zip(BASE_MS, [1.0, 1.01, 0.99, 1.02, 0.98, 1.0, 1.01, 0.99], strict=True)],
    )
    status, text, _ = _cli(capsys, ["compare", a, b])
    assert status == 0
    assert "Verdict: **same**" in text
    assert "Mann-Whitney U test" in text
    assert os.path.isfile(os.path.join(b, "compare", "compare.png"))
    assert os.path.isfile(os.path.join(b, "compare", "compare.md"))


def test_a_slower_run_beyond_threshold_and_noise_is_a_regression_and_exits_1(capsys, tmp_path):
    a = _run(tmp_path, "a", BASE_MS)
    b = _run(tmp_path, "b", [t * 1.2 for t in BASE_MS])
    status, text, _ = _cli(capsys, ["compare", a, b, "--json", "--out", str(tmp_path / "cmp")])
    assert status == 1
    doc = json.loads(text)
    assert doc["verdict"] == "regression"
    assert doc["test"] == "Mann-Whitney U test (two-sided)"
    iteration = next(m for m in doc["metrics"] if m["key"] == "iteration")
    assert iteration["change_pct"] == pytest.approx(20.0, abs=0.01)
    assert iteration["p_value"] < 0.01
    assert iteration["verdict"] == "regression"
    assert iteration["megatron_name"] == "elapsed time per iteration (ms)"
    # The measured parts grew with the iteration: compute by 12 % of the iteration time.
    compute = next(m for m in doc["metrics"] if m["key"] == "rank.2.compute")
    assert compute["change_pct"] == pytest.approx(12.0, abs=0.1) and compute["verdict"] == "regression"
    # A threshold above the change: the same runs pass the gate.
    status, _, _ = _cli(capsys, ["compare", a, b, "--max-regression", "25", "--out", str(tmp_path / "c2")])
    assert status == 0


def test_a_shift_beyond_the_threshold_that_the_test_cannot_tell_from_noise_is_same(tmp_path):
    a = _run(tmp_path, "a", [100, 100, 130, 70, 100, 140, 60, 100])
    b = _run(tmp_path, "b", [100, 140, 75, 135, 65, 120, 110, 100])
    result = compare_runs(a, b, Thresholds(max_regression_pct=5))
    iteration = next(j for j in result.judged if j.key == "iteration")
    assert iteration.change_pct > 5 and iteration.p_value > 0.05
    assert iteration.verdict == "same"


def test_faster_run_is_an_improvement_and_exits_0(capsys, tmp_path):
    a = _run(tmp_path, "a", BASE_MS)
    b = _run(tmp_path, "b", [t * 0.8 for t in BASE_MS])
    status, text, _ = _cli(capsys, ["compare", a, b])
    assert status == 0 and "Verdict: **improvement**" in text


def test_memory_growth_beyond_the_memory_threshold_is_a_regression(capsys, tmp_path):
    a = _run(tmp_path, "a", BASE_MS, peak=1 << 20)
    b = _run(tmp_path, "b", BASE_MS, peak=int((1 << 20) * 1.02))
    status, text, _ = _cli(capsys, ["compare", a, b, "--json"])
    doc = json.loads(text)
    verdicts = {m["key"]: m["verdict"] for m in doc["metrics"]}
    assert status == 1
    assert verdicts["memory.2.peak"] == "regression"
    assert verdicts["iteration"] == "same"
    status, _, _ = _cli(capsys, ["compare", a, b, "--max-memory-regression", "3"])
    assert status == 0


def test_simulated_breakdown_is_judged_on_the_threshold_against_the_simulated_iteration(tmp_path):
    a = _run(tmp_path, "a", BASE_MS, bubble_s=0.01)
    b = _run(tmp_path, "b", BASE_MS, bubble_s=0.02)  # +10 ms of a 90 ms simulated iteration: +11 %
    result = compare_runs(a, b, Thresholds(max_regression_pct=5))
    bubble = next(j for j in result.judged if j.key == "role.pp0.bubble")
    assert bubble.change_pct == pytest.approx(100 * 0.01 / 0.09)
    assert (bubble.test, bubble.verdict, bubble.headline) == ("one value per run", "regression", False)


def test_only_a_breakdown_metric_regressing_passes_the_gate_and_is_named(capsys, tmp_path):
    """The issue's false alarm: one role's simulated bubble grew while the job ran as fast as before."""
    a = _run(tmp_path, "a", BASE_MS, bubble_s=0.01)
    b = _run(tmp_path, "b", BASE_MS, bubble_s=0.02)
    status, text, _ = _cli(capsys, ["compare", a, b])
    assert status == 0
    assert "Verdict: **same**." in text
    assert "Breakdown beyond its threshold (reported, not gated; `--gate-breakdown` gates it): " in text
    assert "role pp0 bubble (simulated): regression" in text
    status, text, _ = _cli(capsys, ["compare", a, b, "--json", "--out", str(tmp_path / "j")])
    doc = json.loads(text)
    assert (status, doc["verdict"], doc["gated"]) == (0, "same", "headline")
    assert {m["key"] for m in doc["breakdown_flagged"]} == {"role.pp0.bubble", "role.pp0.exposed_comm"}
    headline = {m["key"] for m in doc["metrics"] if m["headline"]}
    assert headline == {"iteration", "throughput", "memory.2.peak"}
    # asked for, the breakdown gates too
    status, text, _ = _cli(capsys, ["compare", a, b, "--gate-breakdown", "--out", str(tmp_path / "g")])
    verdict_line = next(line for line in text.splitlines() if line.startswith("Verdict:"))
    assert status == 1 and verdict_line.startswith("Verdict: **regression** (")
    assert "role pp0 bubble (simulated): regression" in verdict_line


def test_a_2x_straggler_is_a_regression_of_the_headline_metrics_and_exits_1(capsys, tmp_path):
    a = _run(tmp_path, "a", BASE_MS)
    b = _run(tmp_path, "b", [2 * t for t in BASE_MS])  # every iteration waits for a rank twice as slow
    status, text, _ = _cli(capsys, ["compare", a, b, "--json"])
    doc = json.loads(text)
    assert (status, doc["verdict"]) == (1, "regression")
    verdicts = {m["key"]: (m["verdict"], m["change_pct"]) for m in doc["metrics"]}
    assert verdicts["iteration"][0] == "regression" and verdicts["iteration"][1] == pytest.approx(
        100, abs=0.1
    )
    # throughput halves: a fall is its regression (rank-tested on the same iterations)
    assert verdicts["throughput"][0] == "regression" and verdicts["throughput"][1] == pytest.approx(
        -50, abs=0.1
    )


def test_too_few_samples_for_the_test_fall_back_to_the_threshold_and_say_so(capsys, tmp_path):
    a = _run(tmp_path, "a", [100, 100, 100])
    b = _run(tmp_path, "b", [100, 130, 130])
    status, text, _ = _cli(capsys, ["compare", a, b])
    assert status == 1
    assert "too few samples (2 and 2) for the rank test" in text


# ---- bad input -----------------------------------------------------------------------------------


def test_runs_of_different_jobs_exit_2_naming_every_differing_field(capsys, tmp_path):
    a = _run(tmp_path, "a", BASE_MS, tp=2)
    b = _run(tmp_path, "b", BASE_MS, tp=4)
    status, _, err = _cli(capsys, ["compare", a, b])
    assert status == 2
    assert "different jobs" in err and "target.tp: 2 vs 4" in err and "target.dp: 4 vs 2" in err
    assert len(err.strip().splitlines()) == 1


def test_not_a_run_folder_and_failed_runs_exit_2(capsys, tmp_path):
    a = _run(tmp_path, "a", BASE_MS)
    status, _, err = _cli(capsys, ["compare", a, str(tmp_path / "nothing")])
    assert status == 2 and "is not a directory" in err
    failed = _run(tmp_path, "f", BASE_MS, status="failed")
    status, _, err = _cli(capsys, ["compare", a, failed])
    assert status == 2 and "status is 'failed'" in err and "rank 2 died" in err
    status, _, err = _cli(capsys, ["compare", a, a, "--max-regression", "-1"])
    assert status == 2 and "--max-regression must be a percentage >= 0" in err


def test_json_document_is_finite_and_complete(capsys, tmp_path):
    a = _run(tmp_path, "a", BASE_MS)
    status, text, _ = _cli(capsys, ["compare", a, a, "--json"])
    doc = json.loads(text)
    assert status == 0 and doc["verdict"] == "same"
    for metric in doc["metrics"]:
        assert set(metric) >= {"key", "metric", "a", "b", "difference", "change_pct", "p_value", "verdict"}
        assert metric["change_pct"] is None or math.isfinite(metric["change_pct"])


def test_compare_says_whether_both_runs_emulated_the_same_graph(capsys, tmp_path):
    a = _run(tmp_path, "a", BASE_MS)
    b = _run(tmp_path, "b", BASE_MS)
    for run, digest in ((a, "1" * 64), (b, "1" * 64)):
        os.makedirs(os.path.join(run, "graph"))
        write_json({"sha256": digest}, os.path.join(run, "graph", "graph.json"))
    _, text, _ = _cli(capsys, ["compare", a, b, "--json"])
    doc = json.loads(text)
    assert doc["same_graph"] is True and doc["captures"] is None
    write_json({"sha256": "2" * 64}, os.path.join(b, "graph", "graph.json"))
    _, text, _ = _cli(capsys, ["compare", a, b])
    assert "The runs emulated different execution graphs" in text
    assert "the measured iteration time did not move" in text


def test_with_different_graphs_the_verdict_says_how_much_the_captures_alone_explain(capsys, tmp_path):
    """B is 10 ms slower; its own capture, simulated alone, is 6 ms slower than A's: 60 % of the change."""
    a = _run(tmp_path, "a", BASE_MS, simulated_s=0.090)
    b = _run(tmp_path, "b", [t + 10 for t in BASE_MS], simulated_s=0.096)
    for run, digest in ((a, "1" * 64), (b, "2" * 64)):
        os.makedirs(os.path.join(run, "graph"))
        write_json({"sha256": digest}, os.path.join(run, "graph", "graph.json"))
    status, text, _ = _cli(capsys, ["compare", a, b, "--json"])
    doc = json.loads(text)
    assert status == 1 and doc["captures"]["explained_pct"] == pytest.approx(60.0)
    assert doc["captures"]["simulated_change_s"] == pytest.approx(0.006)
    _, text, _ = _cli(capsys, ["compare", a, b, "--out", str(tmp_path / "m")])
    verdict_paragraph = text.split("How:")[0]
    assert "Verdict: **regression**" in verdict_paragraph
    assert (
        "+6.000 ms" in verdict_paragraph
        and "the captures alone explain 60 % of the change" in verdict_paragraph
    )
