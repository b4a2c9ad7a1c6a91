"""`prism-megatron simulate GRAPH_DIR`: summary, timeline, replay schedules, what-ifs, errors."""

import json
import os

import pytest

from prism_megatron.cli import main
from prism_megatron.graph import save_graph
from prism_megatron.graph.printable import parse_op
from prism_megatron.graph.schema import RoleGraph
from prism_megatron.replay.schedule import ReplaySchedule
from prism_megatron.sim import PipelineSpec, layout_pipeline_graph
from prism_megatron.topology import Layout

SPEC = PipelineSpec(
    num_microbatches=8,
    fwd_ns=2_000_000,
    bwd_ns=4_000_000,
    activation_bytes=4 << 20,
    tp_allreduce_bytes=8 << 20,
    dp_grad_bytes=256 << 20,
    optimizer_ns=1_000_000,
)


@pytest.fixture(scope="module")
def graph_dir(tmp_path_factory):
    directory = str(tmp_path_factory.mktemp("graph"))
    save_graph(layout_pipeline_graph(Layout(world_size=256, tp=8, pp=4), SPEC), directory)
    return directory


def _run(capsys, argv):
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_simulate_prints_the_iteration_time_and_a_row_per_role_and_writes_its_outputs(
    capsys, graph_dir, tmp_path
):
    out = str(tmp_path / "sim")
    status, text, _ = _run(capsys, ["simulate", graph_dir, "--out", out, "--real-ranks", "0,9"])
    assert status == 0
    assert "symmetric (one rank per role)" in text
    assert "predicted iteration time:" in text
    for role in ("pp0-tp0src", "pp0", "pp1", "pp2", "pp3-tp0src", "pp3"):
        assert f"\n{role} " in text
    assert sorted(os.listdir(out)) == ["schedule-0.json", "schedule-9.json", "timeline.json"]
    schedule = ReplaySchedule.load(os.path.join(out, "schedule-9.json"))
    iteration_ms = float(text.split("predicted iteration time: ")[1].split(" ms")[0])
    assert schedule.iteration_time_ns / 1e6 == pytest.approx(iteration_ms, abs=1e-3)
    with open(os.path.join(out, "timeline.json"), encoding="utf-8") as f:
        assert json.load(f)["traceEvents"]


def test_a_straggler_simulates_every_rank_and_slows_the_iteration(capsys, graph_dir, tmp_path):
    _, base, _ = _run(capsys, ["simulate", graph_dir, "--out", str(tmp_path / "a")])
    status, slow, _ = _run(
        capsys, ["simulate", graph_dir, "--out", str(tmp_path / "b"), "--straggler", "77:1.5", "--chakra"]
    )
    assert status == 0
    assert "full (every rank)" in slow
    time_of = lambda text: float(text.split("predicted iteration time: ")[1].split(" ms")[0])  # noqa: E731
    assert time_of(slow) > time_of(base)
    assert "what-if ranks:" in slow
    assert os.path.isfile(tmp_path / "b" / "chakra" / "chakra.77.et")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--straggler", "77"], "--straggler '77': expected RANK:FACTOR"),
        (["--straggler", "77:-1"], "the factor must be a number from 0.001 to 1000"),
        (["--straggler", "1:1e308"], "--straggler '1:1e308': the factor must be a number from 0.001 to 1000"),
        (["--slow-nic", "1:1e12"], "--slow-nic '1:1e12': the factor must be"),
        (["--slow-nic", "9999:2"], "--slow-nic rank 9999 is outside the world"),
        (["--cluster", "no-such-cluster"], "no-such-cluster"),
        (["--expert-imbalance", "1:2"], "--expert-imbalance EP rank 1 is outside 0..0"),
    ],
)
def test_bad_flags_are_one_line_naming_the_flag(capsys, graph_dir, tmp_path, argv, message):
    status, _, err = _run(capsys, ["simulate", graph_dir, "--out", str(tmp_path), *argv])
    assert status == 2
    assert message in err and err.count("\n") == 1


def test_a_graph_that_deadlocks_is_reported_not_hung(capsys, graph_dir, tmp_path):
    from prism_megatron.graph import load_graph

    graph = load_graph(graph_dir)
    role = graph.roles["pp2"]
    # stage 2 alone does a second world-wide all-reduce: the other 192 ranks never come
    damaged = {**role.streams, "compute": (*role.streams["compute"], parse_op("AR world#1 8B"))}
    directory = str(tmp_path / "broken")
    save_graph(type(graph)(graph.metadata, {**graph.roles, "pp2": RoleGraph("pp2", damaged)}), directory)
    status, _, text = _run(capsys, ["simulate", directory, "--out", str(tmp_path / "o")])
    assert status == 1
    assert "deadlock" in text
    assert "'AR world#1 8B' waits on its world group of 256 ranks at seq 1: 192 never arrived" in text


def _overlapped_graph():
    """Two data-parallel ranks: a 1 ms compute, a 2 ms compute beside an async all-reduce, a wait."""
    from prism_megatron.graph import COMPUTE_STREAM, ExecutionGraph, GraphMetadata, LayoutWorld

    layout = Layout(world_size=2, tp=1, pp=1)
    compute = [parse_op(text) for text in ("c:fwd 1ms", "c:bwd 2ms", "w <async-dp:0")]
    side = [parse_op("AR dp#0 64MiB Float <compute:0")]
    roles = {
        name: RoleGraph(name, {COMPUTE_STREAM: tuple(compute), "async-dp": tuple(side)})
        for name in LayoutWorld(layout).roles()
    }
    return ExecutionGraph(GraphMetadata(layout=layout.kwargs()), roles)


def _iteration_ms(text: str) -> float:
    return float(text.split("predicted iteration time: ")[1].split(" ms")[0])


@pytest.mark.parametrize("device", ["model:h100", "cpu"])
def test_a_graph_that_names_no_device_takes_the_device_of_its_run_report(capsys, tmp_path, device):
    """Graphs written before graphs recorded their capture device: the run folder's report.json says
    it, and only a modelled GPU's graph gets the contention term (sim/contention.py)."""
    run = tmp_path / "run"
    graph = str(run / "graph")
    save_graph(_overlapped_graph(), graph)
    _, alone, _ = _run(capsys, ["simulate", graph, "--out", str(tmp_path / "alone")])
    (run / "report.json").write_text(json.dumps({"prism": {"emulation": {"device": device}}}))
    status, text, _ = _run(capsys, ["simulate", graph, "--out", str(tmp_path / "sim")])
    assert status == 0
    assert f"device {device} (the graph records none): from the run's report.json" in text
    if device == "cpu":
        assert _iteration_ms(text) == _iteration_ms(alone)
    else:
        assert _iteration_ms(text) > _iteration_ms(alone)
