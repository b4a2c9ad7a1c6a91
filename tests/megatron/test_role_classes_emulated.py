"""Roles that run the same program share one capture, end to end on CPU.

The job: GPT on W=16, TP2 PP4 (DP2), 4 microbatches, real ranks 0 and 4. Its six roles run three
programs: stage 0 (the data source and its TP peer), the middle stages 1 and 2 (1F1B with 2 and 1
warm-up microbatches: the same steps in another order) and stage 3. The capture runs the three
representatives and, in the spare place of its second pass, stage 2, whose real capture must match
the ops the graph derives for it from stage 1's; a capture of every role would take three passes.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from launching import quiet_env

from prism_megatron.emulation.plan import plan_run
from prism_megatron.graph import load_graph
from prism_megatron.graph.capture import compute_durations
from prism_megatron.graph.classes import class_programs
from prism_megatron.report import schema

JOB = (
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
    "--vocab-size", "1000", "--micro-batch-size", "1", "--global-batch-size", "8",
    "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "4",
    "--hidden-dropout", "0", "--attention-dropout", "0", "--train-iters", "3", "--prism-capture-iters", "2",
    "--prism-emulate", "--prism-world-size", "16", "--prism-device", "cpu", "--prism-ranks", "pp=0,1;tp=0;dp=0",
)  # fmt: skip


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("classes")
    done = subprocess.run(
        [sys.executable, "-m", "prism_megatron.cli", "emulate", "--", *JOB, "--prism-out", str(out)],
        env=quiet_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return out


@pytest.mark.slow
def test_one_capture_per_program_takes_fewer_passes_and_a_second_stage_confirms_the_derived_order(run_dir):
    with open(run_dir / "report.json", encoding="utf-8") as f:
        report = json.load(f)
    schema.validate(report)
    capture = report["capture"]
    assert report["status"] == "ok"
    assert capture["captured_ranks"] == {"pp0-tp0src": 0, "pp1": 4, "pp2": 8, "pp3-tp0src": 12}
    assert (capture["num_roles"], capture["num_captured_roles"], capture["num_passes"]) == (6, 4, 2)
    assert capture["capture_s"] > 0
    assert capture["classes"]["pp1"] == ["pp1", "pp2"]
    every_role = plan_run([*JOB, "--prism-out", str(run_dir / "x"), "--prism-capture-all-roles"], nproc=2)
    assert len(every_role.capture_batches) == 3
    assert sorted(os.listdir(run_dir / "capture"))[:4] == [f"capture-{r:05d}.json" for r in (0, 4, 8, 12)]


@pytest.mark.slow
def test_the_members_of_a_class_get_identical_spans_and_the_real_ranks_fold_into_their_classes(run_dir):
    graph = load_graph(str(run_dir / "graph"))
    assert graph.roles["pp0"].streams == graph.roles["pp0-tp0src"].streams
    assert graph.roles["pp3"].streams == graph.roles["pp3-tp0src"].streams
    program = class_programs(graph)["pp2"]
    spans = {}
    for role in ("pp1", "pp2"):
        durations = compute_durations(graph.roles[role].streams)
        spans[role] = {p: d for p, d in zip(program.source(role), durations, strict=True) if len(p) == 1}
    common = spans["pp1"].keys() & spans["pp2"].keys()
    assert len(common) > 20 and all(spans["pp1"][p] == spans["pp2"][p] for p in common)
    assert sum(compute_durations(graph.roles["pp1"].streams)) == sum(
        compute_durations(graph.roles["pp2"].streams)
    )
    assert graph.roles["pp1"].streams != graph.roles["pp2"].streams, "in each stage's own 1F1B order"
    for rank in (0, 4):
        with open(run_dir / f"rank-{rank:05d}.json", encoding="utf-8") as f:
            phase = json.load(f)["prism_phase"]
        assert phase["num_folded"] == 2 and phase["not_folded"] == {}
