"""`prism-megatron report RUN_DIR [--check]`: re-render a run folder, validate its report.json."""

import json
import os

import pytest

from prism_megatron import files
from prism_megatron.cli import main
from prism_megatron.graph import save_graph
from prism_megatron.graph.world import LayoutWorld
from prism_megatron.report import RankReport, RunReport, TargetJob, iterations_from_times, write_report
from prism_megatron.sim import AlphaBetaCost, PipelineSpec, layout_pipeline_graph, simulate
from prism_megatron.topology import Layout

LAYOUT = Layout(world_size=16, tp=2, pp=2)
SPEC = PipelineSpec(num_microbatches=2, fwd_ns=1_000_000, bwd_ns=2_000_000, activation_bytes=1 << 16)


def _run_dir(tmp_path, *, with_sim=True, modelled=None, asked=None):
    out = str(tmp_path / "run")
    graph = layout_pipeline_graph(LAYOUT, SPEC)
    iterations = iterations_from_times([0.2, 0.1], num_warmup=1)
    report = RunReport(
        target=TargetJob.from_layout(LAYOUT, micro_batch_size=1, global_batch_size=8, seq_length=64),
        real_ranks=(2,),
        iterations=iterations,
        iteration_time_s=0.1,
        ranks={2: RankReport(virtual_rank=2, peak_memory_allocated_bytes=1 << 20)},
        prism={"cluster": {"cluster": "default"}, "emulation": {"straggler": None, "ranks": asked}},
        modelled=modelled,
    )
    result = simulate(graph, LayoutWorld(LAYOUT), AlphaBetaCost(latency_ns=1000)) if with_sim else None
    write_report(report, out, sim_result=result)
    save_graph(graph, os.path.join(out, "graph"))
    return out


def _cli(capsys, argv):
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_check_accepts_a_valid_report(capsys, tmp_path):
    out = _run_dir(tmp_path)
    status, text, _ = _cli(capsys, ["report", out, "--check"])
    assert status == 0
    assert text.strip().endswith("report.json: valid (schema 1, status ok)")


def test_check_lists_every_problem_with_its_key_path_and_fails(capsys, tmp_path):
    out = _run_dir(tmp_path)
    path = os.path.join(out, "report.json")
    with open(path) as f:
        doc = json.load(f)
    doc["ranks"]["2"]["peak_memory_allocated_bytes"] = -1
    doc["target"]["seq_length"] = 0
    with open(path, "w") as f:
        json.dump(doc, f)
    status, _, err = _cli(capsys, ["report", out, "--check"])
    assert status == 1
    assert "invalid (2 problem(s))" in err
    assert "$.ranks.2.peak_memory_allocated_bytes: must be >= 0, got -1" in err
    assert "$.target.seq_length: must be >= 1, got 0" in err


def test_report_renders_the_markdown_plots_and_timeline_again(capsys, tmp_path):
    out = _run_dir(tmp_path)
    for name in ("report.md", "timeline.json", os.path.join("plots", "iteration_time.png")):
        os.unlink(os.path.join(out, name))
    status, text, _ = _cli(capsys, ["report", out])
    assert status == 0
    for name in ("report.md", "timeline.json", os.path.join("plots", "iteration_time.png")):
        assert os.path.isfile(os.path.join(out, name))
        assert f"wrote {os.path.join(out, name)}" in text
    assert "skipped memory.png: no real rank reported memory by category" in text


def test_without_saved_virtual_tracks_the_graph_of_the_run_is_simulated(capsys, tmp_path):
    out = _run_dir(tmp_path)
    os.unlink(os.path.join(out, files.SIMULATED_SPANS_FILE))
    status, text, _ = _cli(capsys, ["report", out])
    assert status == 0
    assert "virtual tracks: simulated" in text
    with open(os.path.join(out, "timeline.json")) as f:
        names = [e["args"]["name"] for e in json.load(f)["traceEvents"] if e["name"] == "process_name"]
    assert "rank 3 (tp=1 pp=0 dp=1) virtual, replayed" in names  # rank 2's TP peer


def _process_names(out: str) -> list[str]:
    with open(os.path.join(out, "timeline.json")) as f:
        return [e["args"]["name"] for e in json.load(f)["traceEvents"] if e["name"] == "process_name"]


@pytest.mark.parametrize("asked", [None, "13,2"])
def test_a_modelled_run_simulated_again_draws_the_ranks_it_was_asked_about(capsys, tmp_path, asked):
    """A modelled run draws --prism-ranks beside the captured ranks (`emulation.outputs.write_final`);
    re-rendered from its graph, it draws them again."""
    from prism_megatron.report.modelled import ModelledReport

    modelled = ModelledReport(
        gpu="h100", gpu_name="H100 SXM", peak_tflops=989.4, iteration_time_s=0.1, tflops_per_gpu=1.0,
        mfu=0.001, tokens_per_s_per_gpu=1.0, critical_role="pp0",
        time_by_kind_s={"gemm": 0.05, "attention": 0.0, "memory": 0.0, "launch": 0.0,
                        "exposed_communication": 0.0, "pipeline_bubble": 0.05},
    )  # fmt: skip
    out = _run_dir(tmp_path, modelled=modelled, asked=asked)
    os.unlink(os.path.join(out, files.SIMULATED_SPANS_FILE))
    status, text, _ = _cli(capsys, ["report", out])
    assert status == 0 and "virtual tracks: simulated" in text
    drawn = [name for name in _process_names(out) if name.startswith("rank 13 ")]
    assert len(drawn) == (1 if asked else 0)  # not a role's representative: drawn only when asked


@pytest.mark.parametrize("argv", [["report", "no-such-dir"], ["report", "no-such-dir", "--check"]])
def test_a_missing_run_folder_is_one_line_and_status_2(capsys, argv):
    status, _, err = _cli(capsys, argv)
    assert status == 2
    assert err.count("\n") == 1 and "is not a directory" in err


def test_a_folder_without_report_json_says_so(capsys, tmp_path):
    status, _, err = _cli(capsys, ["report", str(tmp_path)])
    assert status == 2
    assert "report.json: no run report here" in err
