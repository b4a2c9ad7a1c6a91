"""Middle stages of an interleaved pipeline share one capture, checked against megatron-core's own
schedule: every middle stage captured on its own (`--prism-capture-all-roles`) must issue exactly
the ops `graph.classes` derives for it from any other middle stage's capture.

A tiny job (PP4, VPP2, one layer per chunk, W = 16) through the built-in entry: on a modelled GPU
(the pipeline transfers overlapped, waits recorded), with every microbatch of a stage in warm-up (M = 4:
stage 1's 8 warm-up virtual microbatches are all of them) and on the CPU (no waits, every call blocking).
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from launching import quiet_env

from prism_megatron.graph.capture import compute_durations, first_difference, structure
from prism_megatron.graph.classes import ClassProgram
from prism_megatron.graph.io import load_graph
from prism_megatron.topology.equivalence import RoleClass

TINY_VPP = (
    "--num-layers", "8", "--hidden-size", "512", "--num-attention-heads", "8", "--seq-length", "512",
    "--max-position-embeddings", "512", "--vocab-size", "32000", "--micro-batch-size", "1",
    "--bf16", "--train-iters", "3", "--hidden-dropout", "0", "--attention-dropout", "0",
    "--position-embedding-type", "rope", "--pipeline-model-parallel-size", "4",
    "--num-layers-per-virtual-pipeline-stage", "1", "--prism-emulate", "--prism-world-size", "16",
)  # fmt: skip
"""DP 4: --global-batch-size 32 gives M = 8 (warm-up 8 and 6 of 16 virtual microbatches), 16 gives M = 4."""


def emulate(out: Path, device: str, global_batch: int, *extra: str) -> Path:
    command = [sys.executable, "-m", "prism_megatron.cli", "emulate", "--", *TINY_VPP,
               "--global-batch-size", str(global_batch), "--prism-device", device, *extra,
               "--prism-out", str(out)]  # fmt: skip
    done = subprocess.run(command, env=quiet_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    return out


def middle_class(num_microbatches: int) -> RoleClass:
    total = num_microbatches * 2
    warmup = {"pp2": min(2 + 4, total), "pp1": min(4 + 4, total)}
    return RoleClass("pp2", ("pp2", "pp1"), warmup, num_microbatches, 2, 4, {"pp2": 2, "pp1": 1})


def check_derived(graph_dir: Path, role_class: RoleClass, references: tuple[str, ...]) -> dict[str, int]:
    """Each reference's derivation of every member against that member's own capture; returns the
    derived compute total per member (from the first reference)."""
    graph = load_graph(str(graph_dir))
    totals = {}
    for reference in references:
        program = ClassProgram(role_class, reference, graph.roles[reference].streams)
        spans = compute_durations(graph.roles[reference].streams)
        for member in role_class.members:
            assert first_difference(program.structure(member), structure(graph.roles[member].streams)) is None
            totals.setdefault(member, sum(program.durations(member, spans)))
    return totals


@pytest.fixture(scope="module")
def modelled_runs(tmp_path_factory) -> dict[str, Path]:
    base = tmp_path_factory.mktemp("interleaved")
    return {
        "all": emulate(base / "all", "model:h100", 32, "--prism-capture-all-roles"),
        "derived": emulate(base / "derived", "model:h100", 32),
    }


def test_each_middle_stage_derives_the_other_exactly_on_a_modelled_gpu(modelled_runs):
    graph_dir = modelled_runs["all"] / "graph"
    totals = check_derived(graph_dir, middle_class(8), ("pp2", "pp1"))
    graph = load_graph(str(graph_dir))
    # modelled spans are the same for the same work: the derived member computes what it captured
    for member, total in totals.items():
        assert total == sum(compute_durations(graph.roles[member].streams))


def test_a_run_with_the_class_predicts_the_same_and_reports_the_fullest_stage(modelled_runs):
    with open(modelled_runs["derived"] / "capture" / "role-classes.json", encoding="utf-8") as f:
        classes = [RoleClass.from_json(c) for c in json.load(f)["role_classes"]]
    assert [c.members for c in classes] == [("pp0-tp0src",), ("pp2", "pp1"), ("pp3-tp0src",)]
    assert classes[1] == middle_class(8)
    # pp2 leads the class; pp1, the most in flight, is captured too: confirmed, its peak reported
    captured = sorted(p.name for p in (modelled_runs["derived"] / "capture").glob("capture-*.json"))
    assert captured == [
        "capture-00000.json",
        "capture-00004.json",
        "capture-00008.json",
        "capture-00012.json",
    ]
    reports = {}
    for name, run in modelled_runs.items():
        with open(run / "report.json", encoding="utf-8") as f:
            reports[name] = json.load(f)
    derived, every = reports["derived"], reports["all"]
    assert derived["simulated_iteration_time_s"] == pytest.approx(
        every["simulated_iteration_time_s"], rel=1e-9
    )
    peaks = {r["role"]: r["peak_memory_allocated_bytes"] for r in derived["ranks"].values()}
    assert peaks["pp1"] > peaks["pp2"]


def test_a_stage_whose_microbatches_are_all_warmup_is_derived_from_one_with_a_steady_phase(tmp_path):
    run = emulate(tmp_path / "m4", "model:h100", 16, "--prism-capture-all-roles")
    role_class = middle_class(4)
    assert role_class.warmup == {"pp2": 6, "pp1": 8}  # pp1: all of its 8 virtual microbatches
    check_derived(run / "graph", role_class, ("pp2",))
    # the other way round the reference lacks the steady phase's posts: the class never leads with it
    graph = load_graph(str(run / "graph"))
    program = ClassProgram(role_class, "pp1", graph.roles["pp1"].streams)
    with pytest.raises(ValueError, match="has no post"):
        program.structure("pp2")


def test_each_middle_stage_derives_the_other_on_the_cpu(tmp_path):
    run = emulate(tmp_path / "cpu", "cpu", 32, "--prism-capture-all-roles")
    check_derived(run / "graph", middle_class(8), ("pp2", "pp1"))


def test_aligned_parameter_gathers_move_with_the_rank_when_a_stage_is_derived(tmp_path):
    # V = 3 with --overlap-param-gather: Megatron-LM aligns the gathers (`param_sync_func`), so
    # stage s launches chunk 2's inside its loop at the start of forward step 4 - s.
    run = emulate(
        tmp_path / "gather", "model:h100", 32, "--num-layers", "12", "--use-distributed-optimizer",
        "--overlap-grad-reduce", "--overlap-param-gather", "--prism-capture-all-roles",
    )  # fmt: skip
    role_class = RoleClass("pp2", ("pp2", "pp1"), {"pp2": 2 + 8, "pp1": 4 + 8}, 8, 3, 4, {"pp2": 2, "pp1": 1})
    graph = load_graph(str(run / "graph"))
    for member in role_class.members:
        gathers = [op for op in graph.roles[member].streams["async-dp"] if op.comm.name == "ALL_GATHER"]
        assert len(gathers) == 3, member  # chunks 0 and 1 before the loop, chunk 2 inside it
    check_derived(run / "graph", role_class, ("pp2", "pp1"))
