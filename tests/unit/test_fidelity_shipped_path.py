"""The fidelity suite runs the product's passes, not a sibling of them (cheap: no process starts).

Each emulated process of a case gets the command line the product's own emulation launch gives it,
and that command line selects the product's `EmulatePhase` over the run's graph and the calibrated
cost file; captures are the product's capture launches; the ground truth is a plain run. And no
module of the suite replays, records or folds anything itself: a suite that kept its own replay loop
(as `benchmarks/fidelity/loop.py` once did) would measure a sibling of the product.
"""

from __future__ import annotations

import ast
import pathlib

import pytest

from benchmarks.fidelity import passes
from benchmarks.fidelity.cases import real_compute_cases, sleep_cases
from prism_megatron import files
from prism_megatron.config import parse_prism_flags
from prism_megatron.emulation import driver

SUITE = pathlib.Path(__file__).resolve().parents[2] / "benchmarks" / "fidelity"
PRODUCT_ONLY = {
    "load_schedule",
    "set_mode",
    "mark_iteration_start",
    "start_recording",
    "stop_recording",
    "ClosedLoop",
    "replay_schedules",
    "blocked_waits",
    "iteration_streams",
    "p2p_completion_ns",
}
"""What the emulation pass does with the replay engine; the suite must leave all of it to the product."""


@pytest.fixture(params=["pp8-vpp2-dp2-overlap-straggler", "tp2-pp4-dp2", "pp4-dp4", "real-tp2"])
def case(request):
    return next(c for c in sleep_cases() + real_compute_cases() if c.name == request.param)


def _plan(case, tmp_path):
    # The suite calibrates before it plans; a run checks its --prism-cluster before any process.
    (tmp_path / "costs.json").write_text(
        '{"schema_version": 1, "kind": "measured", "name": "test", "costs_us": {"ALL_REDUCE/2": [[4, 100.0]]}}'
    )
    return passes.plan(
        case.job,
        real_ranks=case.real_ranks,
        out_dir=str(tmp_path / "run"),
        cost_file=str(tmp_path / "costs.json"),
        iterations=case.iterations,
        capture_iters=case.capture_iters,
    )


def test_an_emulated_process_runs_the_products_emulation_pass_over_the_run_graph(case, tmp_path):
    plan = _plan(case, tmp_path)
    launch = driver.emulate_launch(plan)
    argv = passes.launch_argv(plan, launch)
    assert argv[0] == "builtin" and len(launch.ranks) == len(case.real_ranks)
    config = parse_prism_flags(argv)
    emulation = config.emulation
    assert emulation.emulate and emulation.phase == "emulate" and emulation.device == "cpu"
    assert emulation.world_size == case.job.world_size
    assert [int(r) for r in emulation.ranks.split(",")] == list(case.real_ranks)
    assert emulation.stragglers() == dict(case.job.stragglers)
    assert config.capture.graph == plan.path(files.GRAPH_DIR)
    assert config.cluster.cluster == str(tmp_path / "costs.json")
    assert config.output.out == plan.out_dir


def test_the_captures_are_the_products_capture_launches_and_the_ground_truth_a_plain_run(case, tmp_path):
    plan = _plan(case, tmp_path)
    launches = driver.capture_launches(plan)
    assert [r for launch in launches for r in launch.ranks] == list(plan.slice_ranks)
    for launch in launches:
        config = parse_prism_flags(passes.launch_argv(plan, launch))
        assert config.emulation.phase == "capture" and config.output.out == plan.path(files.CAPTURE_DIR)
    real = parse_prism_flags(passes.real_argv(case.job, out_dir=str(tmp_path / "real"), iterations=4))
    assert not real.emulation.emulate and real.emulation.device == "cpu"


def test_no_module_of_the_suite_replays_records_or_folds_by_itself():
    used = {}
    for path in sorted(SUITE.glob("*.py")):
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            name = (
                node.attr
                if isinstance(node, ast.Attribute)
                else node.id
                if isinstance(node, ast.Name)
                else None
            )
            if isinstance(node, ast.alias):
                name = node.name.rsplit(".", 1)[-1]
            if name in PRODUCT_ONLY:
                used.setdefault(path.name, set()).add(name)
    assert not used, f"the suite does the emulation pass's work itself: {used}"
    assert not (SUITE / "loop.py").exists()


def test_a_sleep_model_process_steps_between_the_runtimes_iteration_marks():
    source = (SUITE / "workload.py").read_text(encoding="utf-8")
    tree = ast.parse(source)
    iterate = next(n for n in ast.walk(tree) if isinstance(n, ast.FunctionDef) and n.name == "_iterate")
    calls = {
        f"{n.func.value.id}.{n.func.attr}"
        for n in ast.walk(iterate)
        if isinstance(n, ast.Call)
        and isinstance(n.func, ast.Attribute)
        and isinstance(n.func.value, ast.Name)
    }
    assert {"rt.iteration_begins", "rt.iteration_ends"} <= calls
    assert "parse_prism_flags(list(request.argv))" in source  # the pass's config is its command line's


def test_the_suites_captures_leave_the_plans_role_classes_beside_them(case, tmp_path, monkeypatch):
    """The graph is built from the capture folder, one capture per class of roles: without the classes
    file there every role would be its own class, and the roles not captured would be missing."""
    from prism_megatron.graph import classes
    from prism_megatron.passes import closed_loop

    plan = _plan(case, tmp_path)
    built = []
    monkeypatch.setattr(passes, "run_processes", lambda *args, **kwargs: [])
    monkeypatch.setattr(
        closed_loop, "load_or_build_graph", lambda path, layout: built.append(path) or "graph"
    )
    monkeypatch.setattr("prism_megatron.graph.save_graph", lambda graph, path: None)
    assert passes.capture_with_results(plan, case.job)[0] == "graph"
    assert built == [plan.path(files.CAPTURE_DIR)]
    assert classes.load_classes(plan.path(files.CAPTURE_DIR)) == plan.role_classes
    if case.name in ("pp4-dp4", "tp2-pp4-dp2"):  # these share captures between roles
        assert len(plan.slice_ranks) < sum(len(c.members) for c in plan.role_classes)
