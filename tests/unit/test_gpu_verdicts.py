"""The GPU run's verdict table: each check reads its stage's JSON; a missing stage is NOT RUN, never PASS."""

from __future__ import annotations

import json

from benchmarks.gpu import verdicts


def write(work, step: str, stage: str, data: dict) -> None:
    (work / step).mkdir(parents=True, exist_ok=True)
    (work / step / f"{stage}.json").write_text(json.dumps(data))


def by_label(rows):
    return {label: (status, evidence) for label, status, evidence in rows}


def test_a_stage_that_left_nothing_is_not_run(tmp_path):
    rows = verdicts.verdicts(str(tmp_path))
    assert {status for _, status, _ in rows} == {"NOT RUN"}
    assert verdicts.main(["--work", str(tmp_path)]) == 0  # nothing failed, but nothing passed either


def test_bounds_decide_pass_and_fail(tmp_path):
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
          {"memory_diff_bytes": 0, "real_peak_bytes": 10, "emulated_peak_bytes": 10})  # fmt: skip
    write(tmp_path, "gpt", "gpt_capture_profile", {"spans": [
        {"captured_us": 1000.0, "profiled_us": 1010.0, "error_pct": 0.99, "within": True},
    ]})  # fmt: skip
    rows = by_label(verdicts.verdicts(str(tmp_path)))
    assert rows["backend + op families on CUDA, 1 process"][0] == "PASS"
    assert rows["backend + op families on CUDA, 2 processes"] == ("FAIL", "wrong results: p2p/exchange_real")
    assert rows["wait kernel: median <= 2 us (waits >= 100 us)"][0] == "FAIL"  # 2.5 us at 1 ms
    assert rows["memory ground truth: TP2xDP2 peak identical"][0] == "PASS"
    assert rows["GPT capture: spans within 2 % of profiler"][0] == "PASS"
    assert rows["Llama-3-8B rank W=8192: 1 % / 2 %"][0] == "NOT RUN"
    assert verdicts.main(["--work", str(tmp_path)]) == 1


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
