"""The run report: report.json follows its schema, and report.md, plots and timeline come out of any run.

Golden-free: each test builds a report from a small synthetic simulation and synthetic measurements
and checks properties of what is written, never bytes.
"""

import dataclasses
import json
import os

import pytest

from prism_megatron import files
from prism_megatron.graph.world import LayoutWorld
from prism_megatron.replay.events import OpEvent
from prism_megatron.replay.schedule import OpKind
from prism_megatron.report import (
    ComputeSpan,
    Failure,
    OpLog,
    RankReport,
    RoleReport,
    RunReport,
    SchemaError,
    TargetJob,
    iterations_from_times,
    load_report,
    median_iteration_time_s,
    rerender,
    validate,
    write_report,
)
from prism_megatron.report.timeline import represented_ranks
from prism_megatron.sim import (
    AlphaBetaCost,
    PipelineSpec,
    breakdown,
    layout_pipeline_graph,
    rank_breakdown,
    simulate,
)
from prism_megatron.topology import Layout

PNG_MAGIC = b"\x89PNG\r\n\x1a\n"
LAYOUT = Layout(world_size=64, tp=2, pp=4)  # DP 8
REAL_RANKS = (0, 33)  # stage 0 TP 0 (the data source) and stage 2 TP 1 (rank = tp + 2 dp + 16 pp)
SPEC = PipelineSpec(
    num_microbatches=4,
    fwd_ns=1_000_000,
    bwd_ns=2_000_000,
    activation_bytes=1 << 20,
    tp_allreduce_bytes=1 << 20,
    dp_grad_bytes=1 << 26,
    optimizer_ns=300_000,
)
START_NS = 5_000_000_000  # a CLOCK_MONOTONIC reading


@pytest.fixture(scope="module")
def sim_result():
    cost = AlphaBetaCost(latency_ns=5_000, ns_per_byte=0.02)
    return simulate(layout_pipeline_graph(LAYOUT, SPEC), LayoutWorld(LAYOUT), cost)


def _memory(virtual_rank):
    at_peak = {
        "parameters": 1 << 30,
        "gradients": 1 << 30,
        "optimizer_state": 3 << 29,
        "activations": (virtual_rank + 1) << 28,
    }
    return {"peak_bytes": sum(at_peak.values()), "at_peak_bytes": at_peak, "method": "live-storage"}


def _report(sim_result, **changes):
    iterations = iterations_from_times([0.9, 0.51, 0.5, 0.52], num_warmup=1)
    report = RunReport(
        target=TargetJob.from_layout(LAYOUT, micro_batch_size=1, global_batch_size=32, seq_length=4096),
        real_ranks=REAL_RANKS,
        iterations=iterations,
        iteration_time_s=median_iteration_time_s(iterations),
        ranks={
            r: RankReport.from_pieces(r, memory=_memory(r), breakdown=rank_breakdown(sim_result, r))
            for r in REAL_RANKS
        },
        roles=tuple(RoleReport.from_breakdown(row) for row in breakdown(sim_result)),
        simulated_iteration_time_s=sim_result.iteration_time_ns / 1e9,
        tflops_per_gpu=123.4,
        prism={"emulation": {"world_size": 64, "ranks": "0,33"}, "cluster": {"cluster": "default"}},
        patches={"p2p_communicator": 12},
    )
    return dataclasses.replace(report, **changes)


def _op_log(virtual_rank):
    """Two iterations: a TP all-reduce with a real peer, a DP reduce-scatter that waits for virtual
    peers, and an async send overlapping the reduce-scatter (it must go to a second comm lane)."""
    events, compute, starts = [], [], []
    for iteration in range(2):
        t0 = START_NS + iteration * 500_000_000
        starts.append(t0)
        compute.append(ComputeSpan("forward", t0, t0 + 100_000_000))
        events += [
            OpEvent(
                OpKind.ALL_REDUCE,
                (virtual_rank, virtual_rank + 1),
                -1,
                2 * iteration,
                1 << 20,
                "BFloat16",
                t0 + 100_000_000,
                t0 + 100_000_000,
                t0 + 101_000_000,
                False,
                False,
            ),
            OpEvent(
                OpKind.REDUCE_SCATTER,
                tuple(range(virtual_rank, virtual_rank + 16, 2)),
                -1,
                iteration,
                1 << 26,
                "Float",
                t0 + 200_000_000,
                t0 + 250_000_000,
                t0 + 300_000_000,
                True,
                True,
            ),
            OpEvent(
                OpKind.SEND,
                (virtual_rank, virtual_rank + 16),
                virtual_rank + 16,
                iteration,
                1 << 20,
                "BFloat16",
                t0 + 210_000_000,
                t0 + 210_000_000,
                t0 + 220_000_000,
                True,
                True,
            ),
        ]
    return OpLog(
        virtual_rank=virtual_rank,
        events=tuple(events),
        compute=tuple(compute),
        iteration_starts_ns=tuple(starts),
    )


def _write(tmp_path, result, report=None, **kwargs):
    out = str(tmp_path / "run")
    kwargs.setdefault("sim_result", result)
    kwargs.setdefault("measured_ops", {r: _op_log(r) for r in REAL_RANKS})
    written = write_report(report or _report(result), out, **kwargs)
    return out, written


def test_report_json_holds_what_the_issue_promises_and_validates(tmp_path, sim_result):
    out, _ = _write(tmp_path, sim_result)
    with open(os.path.join(out, "report.json")) as f:
        doc = json.load(f)
    validate(doc)
    assert doc["schema_version"] == 1 and doc["status"] == "ok"
    assert {
        "world_size",
        "tp",
        "pp",
        "vpp",
        "cp",
        "ep",
        "etp",
        "dp",
        "micro_batch_size",
        "global_batch_size",
        "seq_length",
    } <= set(doc["target"])
    assert doc["target"]["dp"] == 8 and doc["target"]["etp"] == 2
    assert doc["real_ranks"] == [0, 33]
    assert [it["index"] for it in doc["iterations"]] == [0, 1, 2, 3]
    assert doc["iteration_time_s"] == pytest.approx(0.51)  # median of 0.51, 0.5, 0.52: warm-up left out
    assert set(doc["ranks"]) == {"0", "33"}
    for row in doc["ranks"].values():
        assert {
            "peak_memory_allocated_bytes",
            "peak_memory_reserved_bytes",
            "compute_s",
            "exposed_comm_s",
            "bubble_s",
        } <= set(row)
        assert sum(row["memory_by_category"].values()) == row["peak_memory_allocated_bytes"]
        total = row["compute_s"] + row["exposed_comm_s"] + row["bubble_s"]
        assert total == pytest.approx(doc["simulated_iteration_time_s"])
    assert sum(role["count"] for role in doc["roles"].values()) == 64
    assert doc["simulated_iteration_time_s"] == sim_result.iteration_time_ns / 1e9
    assert set(doc["versions"]) >= {"prism_megatron", "megatron_core", "torch"}


def test_a_report_reads_back_equal_to_what_was_written(tmp_path, sim_result):
    report = _report(sim_result)
    out, _ = _write(tmp_path, sim_result, report)
    assert load_report(out) == report


def test_plots_are_png_files_and_report_md_mentions_every_real_rank_and_role(tmp_path, sim_result):
    out, written = _write(tmp_path, sim_result)
    assert written.skipped == {}
    for name in ("iteration_time.png", "breakdown.png", "memory.png"):
        with open(os.path.join(out, "plots", name), "rb") as f:
            assert f.read(8) == PNG_MAGIC
    with open(os.path.join(out, "report.md")) as f:
        md = f.read()
    for virtual_rank in REAL_RANKS:
        assert f"\n| {virtual_rank} | " in md
    for row in breakdown(sim_result):
        assert f"| {row.role} | {row.num_ranks} |" in md
    for name in ("plots/iteration_time.png", "plots/breakdown.png", "plots/memory.png", "timeline.json"):
        assert f"]({name})" in md
    assert "Status: **ok**" in md and "| world_size |" in md and "emulation.ranks" in md


def _trace(out):
    with open(os.path.join(out, "timeline.json")) as f:
        return json.load(f)


def test_the_timeline_is_a_chrome_trace_with_a_track_per_real_and_represented_virtual_rank(
    tmp_path, sim_result
):
    out, _ = _write(tmp_path, sim_result)
    events = _trace(out)["traceEvents"]
    for event in events:
        assert {"ph", "pid", "tid"} <= set(event)
        assert "ts" in event or event["ph"] == "M"  # metadata events carry no time
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert processes[0] == "rank 0 (tp=0 pp=0 dp=0) real"
    assert processes[33] == "rank 33 (tp=1 pp=2 dp=0) real"
    virtual = represented_ranks(sim_result, REAL_RANKS)
    assert {1, 16, 2, 32, 17, 49, 35} <= set(virtual)  # TP peers, pipeline and DP neighbours
    assert set(processes) == {*REAL_RANKS, *virtual}
    assert processes[1] == "rank 1 (tp=1 pp=0 dp=0) virtual, replayed"
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == set(processes)
    assert min(e["ts"] for e in spans) == 0  # µs from the run start
    threads = {(e["pid"], e["args"]["name"]) for e in events if e["name"] == "thread_name"}
    assert {(0, "compute"), (0, "comm"), (0, "comm 2")} <= threads  # the async send overlaps
    assert (1, "compute") in threads


def test_a_modelled_run_s_timeline_draws_the_captured_ranks_and_one_rank_per_role_all_modelled(
    tmp_path, sim_result
):
    from prism_megatron.report.modelled import ModelledReport

    modelled = ModelledReport(
        gpu="h100", gpu_name="H100 SXM", peak_tflops=989.0, iteration_time_s=0.5, tflops_per_gpu=None,
        mfu=None, tokens_per_s_per_gpu=None, critical_role="pp0", time_by_kind_s={"gemm": 0.5},
    )  # fmt: skip
    report = _report(sim_result, modelled=modelled)
    out, written = _write(tmp_path, sim_result, report, measured_ops={})  # no rank ran in real time
    events = _trace(out)["traceEvents"]
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    world = sim_result.problem.world
    representatives = {world.representative(name) for name in sim_result.problem.role_names}
    assert set(processes) == {*REAL_RANKS, *representatives}  # no neighbours: a role's ranks repeat it
    assert list(processes)[: len(REAL_RANKS)] == list(REAL_RANKS)
    assert processes[0] == "rank 0 (tp=0 pp=0 dp=0) modelled"
    assert all(name.endswith(" modelled") for name in processes.values())
    spans = [e for e in events if e["ph"] == "X"]
    assert {e["pid"] for e in spans} == set(processes)  # the captured ranks' tracks are not empty
    assert "op logs" not in written.skipped
    with open(os.path.join(out, "report.md")) as f:
        assert "every time modelled" in f.read()


def test_virtual_tracks_line_up_with_the_last_measured_iteration(tmp_path, sim_result):
    out, _ = _write(tmp_path, sim_result)
    spans = [e for e in _trace(out)["traceEvents"] if e["ph"] == "X"]
    last_iteration_us = 500_000_000 / 1000  # the second iteration starts 0.5 s after the run
    assert min(e["ts"] for e in spans if e["pid"] == 1) == pytest.approx(last_iteration_us)


def test_the_number_of_virtual_tracks_is_capped(tmp_path, sim_result):
    out, _ = _write(tmp_path, sim_result, max_virtual_tracks=3)
    names = [e for e in _trace(out)["traceEvents"] if e["name"] == "process_name"]
    assert len(names) == len(REAL_RANKS) + 3


def test_a_failed_run_renders_what_was_measured_and_says_why(tmp_path, sim_result):
    report = _report(
        sim_result,
        status="failed",
        failure=Failure(message="rank 33 stopped answering", dead_rank=33, last_op="all_reduce dp seq 3"),
        iterations=iterations_from_times([0.9], num_warmup=1),
        iteration_time_s=None,
        ranks={0: RankReport(virtual_rank=0, peak_memory_allocated_bytes=1 << 30)},
        roles=(),
        simulated_iteration_time_s=None,
        tflops_per_gpu=None,
    )
    unfinished = OpEvent(OpKind.ALL_REDUCE, (0, 1), -1, 0, 8, "Float", START_NS, START_NS, -1, False, True)
    out, written = _write(tmp_path, sim_result, report, sim_result=None, measured_ops={0: [unfinished]})
    assert set(written.skipped) == {"breakdown.png", "memory.png", "op logs"}
    with open(os.path.join(out, "report.md")) as f:
        md = f.read()
    assert "Status: **failed**: rank 33 stopped answering" in md
    assert "virtual rank 33" in md and "all_reduce dp seq 3" in md
    assert "No results from virtual rank(s) 33." in md
    assert "Peak memory by category: skipped: no real rank reported memory by category." in md
    assert "no op log from real rank(s) 33: their tracks are empty" in md
    events = _trace(out)["traceEvents"]
    (span,) = [e for e in events if e["ph"] == "X"]
    assert span["args"]["completed"] is False
    processes = {e["pid"]: e["args"]["name"] for e in events if e["name"] == "process_name"}
    assert processes == {0: "rank 0 (tp=0 pp=0 dp=0) real", 33: "rank 33 (tp=1 pp=2 dp=0) real"}
    assert load_report(out).failure.dead_rank == 33


def test_a_run_with_nothing_measured_still_writes_report_md(tmp_path, sim_result):
    report = _report(
        sim_result,
        status="running",
        iterations=(),
        iteration_time_s=None,
        ranks={},
        roles=(),
        simulated_iteration_time_s=None,
    )
    out, written = _write(tmp_path, sim_result, report, sim_result=None, measured_ops=None)
    assert set(written.skipped) == {"iteration_time.png", "breakdown.png", "memory.png", "timeline"}
    assert sorted(os.listdir(out)) == ["report.json", "report.md"]
    with open(os.path.join(out, "report.md")) as f:
        assert "Status: **running**" in f.read()


def test_an_invalid_report_is_refused_before_anything_is_written(tmp_path, sim_result):
    report = _report(sim_result, iteration_time_s=0.7)  # not the median after warm-up
    with pytest.raises(SchemaError, match=r"\$\.iteration_time_s: must be the median"):
        _write(tmp_path, sim_result, report)
    assert not os.path.exists(tmp_path / "run")


def test_rerender_draws_the_same_outputs_from_the_run_folder_alone(tmp_path, sim_result):
    out, _ = _write(tmp_path, sim_result)
    first = _trace(out)
    assert os.path.isfile(os.path.join(out, files.SIMULATED_SPANS_FILE))
    assert sorted(os.listdir(os.path.join(out, "ops"))) == ["rank-00000.json", "rank-00033.json"]
    for name in ("timeline.json", "report.md", "plots/memory.png"):
        os.unlink(os.path.join(out, name))
    written = rerender(out)
    assert written.skipped == {}
    assert _trace(out) == first
    assert os.path.isfile(os.path.join(out, "plots", "memory.png"))
