"""The GPU run's verdict table: the step's fate first (a crash, a timeout, a failure is FAIL with its
note), then the stage's numbers; a stage that left nothing is never PASS, and every stage has a row."""

from __future__ import annotations

import json

from benchmarks.gpu import verdicts


def write(work, step: str, stage: str, data: dict) -> None:
    (work / step).mkdir(parents=True, exist_ok=True)
    (work / step / f"{stage}.json").write_text(json.dumps(data))


def steps(work, *rows: tuple[str, str, str]) -> None:
    with open(work / "steps.tsv", "a") as f:
        for name, status, note in rows:
            f.write(f"{name}\t{status}\t1\t{note}\n")


def by_label(rows):
    return {label: (status, evidence) for _, label, status, evidence in rows}


def test_a_stage_that_never_ran_is_not_run_and_every_stage_has_a_row(tmp_path):
    rows = verdicts.verdicts(str(tmp_path), ["build", "smoke"])
    assert {status for *_, status, _ in rows} == {"NOT RUN"}
    stages = [stage for stage, *_ in rows]
    assert stages[:2] == ["build", "smoke"] and set(verdicts.CHECKS) <= set(stages)
    assert verdicts.main(["--work", str(tmp_path)]) == 0  # nothing failed, but nothing passed either


def test_a_crash_a_timeout_and_a_failure_are_fail_with_the_signal_and_the_first_error(tmp_path):
    steps(
        tmp_path,
        ("smoke", "crashed", "signal 11 (SEGV): Fatal Python error: Segmentation fault"),
        ("smoke_backtrace", "ok", ""),
        ("main_claim", "timeout", "killed at 150 s (SIGTERM, SIGKILL 10 s later)"),
        ("wait_precision", "failed", "exit status 1"),
        ("backend_ops", "ok", ""),
    )
    write(tmp_path, "wait_precision", "wait_precision", {"rows": [{"target_us": 100.0, "median_us": 1.0}]})
    rows = verdicts.verdicts(str(tmp_path), ["smoke", "main_claim", "wait_precision", "backend_ops"])
    got = {(stage, label): (status, evidence) for stage, label, status, evidence in rows}
    assert got[("smoke", "ran")] == (
        "FAIL",
        "crashed: signal 11 (SEGV): Fatal Python error: Segmentation fault",
    )
    assert got[("smoke_backtrace", "diagnosis")][0] == "INFO"
    assert all(got[("main_claim", f"main claim: {part}")][0] == "FAIL" for part in ("compute", "memory"))
    assert "timeout: killed at 150 s" in got[("main_claim", "main claim: compute")][1]
    # Its numbers would pass, but the step failed: FAIL.
    assert got[("wait_precision", "wait kernel: median <= 2 us (waits >= 100 us)")][0] == "FAIL"
    # It passed but left no numbers: FAIL, never PASS.
    assert got[("backend_ops", "backend + op families, 1 process")] == (
        "FAIL",
        "the stage passed but left no results",
    )
    assert verdicts.main(["--work", str(tmp_path)]) == 1


def test_the_main_claim_failing_one_part_shows_each_part_as_its_numbers_say(tmp_path):
    """main_claim exits 1 when any part does not hold: each part reads its own numbers."""
    steps(tmp_path, ("main_claim", "failed", "exit status 1"))
    write(tmp_path, "main_claim", "main_claim", {
        "simulated_iteration_time_s": 0.100, "emulated_iteration_s": 0.1005, "compute_error_pct": 0.4,
        "emulated_compute_ms": 99.0, "plain_iteration_s": 0.0986, "spans": [], "num_spans": {},
        "emulated_peak_bytes": 12, "plain_peak_bytes": 10, "plan_total_bytes": 10, "plan_error_pct": 20.0,
        "emulated_requested_peak_bytes": 12, "plain_requested_peak_bytes": 10,
    })  # fmt: skip
    rows = by_label(verdicts.verdicts(str(tmp_path), ["main_claim"]))
    assert rows["main claim: compute"][0] == "PASS" and rows["main claim: iteration"][0] == "PASS"
    assert rows["main claim: memory"][0] == "FAIL" and rows["main claim: plan"][0] == "FAIL"
    assert rows["main claim: spans"][0] == "FAIL"  # no span judged


def test_bounds_decide_pass_and_fail(tmp_path):
    steps(
        tmp_path,
        *((name, "ok", "") for name in ("backend_ops", "wait_precision", "memory_ground_truth", "gpt")),
    )
    ops = ["mixed/all_reduce", "p2p/recv_from_virtual"]
    write(tmp_path, "backend_ops", "backend_ops", {"runs": {
        "1": {"created": True, "ops": ops, "failed_ops": [], "errors": []},
        "2": {"created": True, "ops": ops, "failed_ops": ["p2p/exchange_real"], "errors": []},
    }})  # fmt: skip
    write(tmp_path, "wait_precision", "wait_precision", {"rows": [
        {"target_us": 10.0, "median_us": 9.0}, {"target_us": 100.0, "median_us": 1.5},
        {"target_us": 1000.0, "median_us": 2.5},
    ]})  # fmt: skip
    write(tmp_path, "memory_ground_truth", "memory_ground_truth",
          {"memory_diff_bytes": 0, "real_peak_bytes": 10, "emulated_peak_bytes": 10,
           "real_requested_peak_bytes": 10, "emulated_requested_peak_bytes": 11})  # fmt: skip
    rows = by_label(verdicts.verdicts(str(tmp_path)))
    assert rows["backend + op families, 1 process"][0] == "PASS"
    assert rows["backend + op families, 2 processes"] == ("FAIL", "wrong results: p2p/exchange_real")
    assert rows["wait kernel: median <= 2 us (waits >= 100 us)"][0] == "FAIL"  # 2.5 us at 1 ms
    assert rows["memory ground truth: TP2xDP2 allocator peak identical"][0] == "PASS"
    assert rows["memory ground truth: TP2xDP2 requested peak identical"][0] == "FAIL"  # 11 against 10
    assert rows["Llama-3-8B rank W=8192: 1 % / 2 %"][0] == "NOT RUN"
    assert verdicts.main(["--work", str(tmp_path)]) == 1


def test_a_dry_run_judges_correctness_and_shows_timing_as_cpu(tmp_path):
    steps(tmp_path, ("wait_precision", "ok", ""), ("memory_ground_truth", "ok", ""))
    write(tmp_path, "wait_precision", "wait_precision", {"rows": [{"target_us": 100.0, "median_us": 50.0}]})
    write(tmp_path, "memory_ground_truth", "memory_ground_truth",
          {"memory_diff_bytes": 4, "real_peak_bytes": 10, "emulated_peak_bytes": 14,
           "real_requested_peak_bytes": 10, "emulated_requested_peak_bytes": None})  # fmt: skip
    rows = by_label(verdicts.verdicts(str(tmp_path), dry_run=True))
    assert rows["wait kernel: median <= 2 us (waits >= 100 us)"][0] == "CPU"
    assert rows["memory ground truth: TP2xDP2 allocator peak identical"][0] == "FAIL"
    assert rows["memory ground truth: TP2xDP2 requested peak identical"][0] == "FAIL"  # none recorded


def test_the_gpt_stage_matches_captured_spans_to_the_profilers_stamp_kernels(tmp_path):
    """Compute spans between marks on the compute stream against the same marks' stamp kernels."""
    from benchmarks.gpu import gpt_capture_profile as stage
    from prism_megatron.graph.capture import CapturedIteration
    from prism_megatron.replay import OpEvent, OpKind

    ms = 1_000_000
    base = 10**15  # the GPU global timer
    send = OpEvent(
        OpKind.SEND, (0, 1), 1, 0, 64, "Float", base + 5 * ms, base + 5 * ms, base + 6 * ms, True, True
    )
    reduce = OpEvent(OpKind.ALL_REDUCE, (0, 2), -1, 0, 64, "Float", base + 16 * ms, base + 17 * ms, base + 18 * ms,
                     False, True)  # fmt: skip
    iteration = CapturedIteration(base, base + 30 * ms, (send, reduce), ((base + 5 * ms, base + 6 * ms),))
    times = stage.compute_stream_times(iteration)
    # The profiler's clock: another origin, and one span 1 % longer than the capture saw.
    starts_us = [(t - base) / 1e3 + 777.0 for t in times]
    starts_us[times.index(base + 16 * ms)] += 100.0  # 10 ms span seen as 10.1 ms
    trace = {"traceEvents": [
        {"cat": "kernel", "name": "void prism::cuda_clock::stamp_kernel(long*)", "ts": ts, "args": {"stream": 7}}
        for ts in starts_us
    ] + [{"cat": "kernel", "name": "stamp_kernel", "ts": 1.0, "args": {"stream": 9}}]}  # fmt: skip
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    result = stage.compare(iteration, stage.stamp_kernels_by_stream(str(path)))
    assert result["stream"] == 7 and result["num_marks"] == len(times)
    spans = {round(s["captured_us"]): s for s in result["spans"]}
    assert set(spans) == {5000, 10000, 12000}  # start..send, call exit..reduce, reduce done..end
    assert spans[5000]["within"] and spans[12000]["within"]
    assert 0.98 < spans[10000]["error_pct"] < 1.0 and spans[10000]["within"]


def test_an_extra_stamp_kernel_does_not_shift_the_pairing_of_marks(tmp_path):
    """Marks pair with their own stamp kernels by time on a common clock, not by sorted position: a
    stamp of a mark the capture does not keep (another mark on the stream) changes no span."""
    from benchmarks.gpu import gpt_capture_profile as stage
    from prism_megatron.graph.capture import CapturedIteration
    from prism_megatron.replay import OpEvent, OpKind

    ms = 1_000_000
    base = 10**15
    reduce = OpEvent(OpKind.ALL_REDUCE, (0, 2), -1, 0, 64, "Float", base + 16 * ms, base + 17 * ms, base + 18 * ms,
                     False, True)  # fmt: skip
    iteration = CapturedIteration(base, base + 30 * ms, (reduce,), ())
    times = stage.compute_stream_times(iteration)
    starts_us = [(t - base) / 1e3 + 55.5 for t in times]
    starts_us.insert(1, (7 * ms) / 1e3 + 55.5)  # an unrelated stamp between the start and the reduce
    trace = {"traceEvents": [{"cat": "kernel", "name": "stamp_kernel", "ts": ts, "args": {"stream": 3}}
                             for ts in starts_us]}  # fmt: skip
    path = tmp_path / "trace.json"
    path.write_text(json.dumps(trace))
    result = stage.compare(iteration, stage.stamp_kernels_by_stream(str(path)))
    assert result["num_paired"] == len(times) and result["unpaired_spans"] == 0
    assert all(s["within"] and s["error_pct"] < 1e-6 for s in result["spans"])
    assert {round(s["captured_us"]) for s in result["spans"]} == {16000, 12000}


def test_the_main_claim_has_a_row_per_part_and_spans_of_another_structure_fail(tmp_path):
    steps(tmp_path, ("main_claim", "ok", ""))
    result = {
        "plain_iteration_s": 0.100, "emulated_iteration_s": 0.1005, "simulated_iteration_time_s": 0.1004,
        "emulated_compute_ms": 100.5, "compute_error_pct": 0.5,
        "spans": [{"alone_us": 500.0, "emulated_us": 501.0, "error_pct": 0.2}],
        "num_spans": {"alone": 9, "emulated": 10},
        "plain_peak_bytes": 1000, "emulated_peak_bytes": 1000, "plan_total_bytes": 1020, "plan_error_pct": -1.96,
        "plain_requested_peak_bytes": 990, "emulated_requested_peak_bytes": 990,
    }  # fmt: skip
    write(tmp_path, "main_claim", "main_claim", result)
    rows = by_label(verdicts.verdicts(str(tmp_path), ["main_claim"]))
    assert [rows[f"main claim: {p}"][0] for p in ("compute", "iteration", "memory", "plan")] == ["PASS"] * 4
    assert rows["main claim: spans"][0] == "FAIL" and "9 alone, 10 emulated" in rows["main claim: spans"][1]
    dry = by_label(verdicts.verdicts(str(tmp_path), ["main_claim"], dry_run=True))
    assert dry["main claim: spans"][0] == "CPU" and dry["main claim: memory"][0] == "PASS"


def test_the_gpu_models_kernels_are_judged_per_family_by_the_median_and_copies_by_the_worst(tmp_path):
    def row(kind, error, shape="1x1x1"):
        return {"kind": kind, "config": "c", "op": "fwd", "shape": shape, "error_pct": error}

    gemms = [row("gemm", e) for e in (-3.0, 4.0, 12.0)]  # median |error| 4 %: within 10 %
    attention = [row("attention cuDNN", e) for e in (16.0, -20.0, 2.0)]  # median 16 %: beyond 15 %
    copies = [row("copy", 40.0, "64 KiB"), row("copy", 35.0, "16384 KiB"), row("copy", 9.0, "2097152 KiB")]
    rows = [
        *gemms,
        *attention,
        *copies,
        {"kind": "attention cuDNN", "config": "c", "op": "bwd", "error": "x"},
    ]
    from benchmarks.gpu.model_kernels import summaries

    steps(tmp_path, ("model_kernels", "ok", ""))
    write(tmp_path, "model_kernels", "model_kernels", {"rows": rows, "summary": summaries(rows)})
    got = by_label(verdicts.verdicts(str(tmp_path), ["model_kernels"]))
    assert got["GPU model: GEMMs, median within 10 %"][0] == "PASS"
    assert got["GPU model: cuDNN attention, median within 15 %"][0] == "FAIL"
    # The 64 KiB copy is launch-bound and the 16 MiB one fits the L2: not judged; the worst judged is +9 %.
    assert got["GPU model: copies beyond the L2 within 10 %"] == ("PASS", "worst +9.0 % (2097152 KiB)")
    # In a dry run the same numbers are the CPU's and never judged.
    dry = by_label(verdicts.verdicts(str(tmp_path), ["model_kernels"], dry_run=True))
    assert {dry[label][0] for label in got if label.startswith("GPU model")} == {"CPU"}
