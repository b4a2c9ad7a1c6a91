"""The plan of an emulation run: checked and laid out before any process starts."""

from __future__ import annotations

import argparse
import os

import pytest

from prism_megatron.commands import demo
from prism_megatron.emulation.plan import plan_run

JOB = [
    "--num-layers", "8", "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "64",
    "--micro-batch-size", "1", "--global-batch-size", "512", "--train-iters", "3",
    "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "8",
    "--prism-emulate", "--prism-world-size", "8192",
]  # fmt: skip


def test_the_slice_is_one_rank_per_class_of_roles_in_passes_of_as_many_processes_as_real_ranks(tmp_path):
    plan = plan_run([*JOB, "--prism-ranks", "pp=0,1;tp=0;dp=0", "--prism-out", str(tmp_path)])
    assert plan.real_ranks == (0, 1024)
    assert [list(c.members) for c in plan.role_classes] == [
        ["pp0-tp0src", "pp0"],
        [f"pp{s}" for s in range(1, 7)],
        ["pp7-tp0src", "pp7"],
    ]
    # The three representatives, then the middle stage with the fewest warm-ups fills the spare place.
    assert plan.slice_ranks == (0, 1024, 7168, 6144)
    assert plan.capture_batches == [(0, 1024), (7168, 6144)]
    assert plan.num_microbatches == 4


def test_capture_all_roles_captures_one_rank_of_every_role_as_before(tmp_path):
    plan = plan_run(
        [*JOB, "--prism-ranks", "0", "--prism-out", str(tmp_path), "--prism-capture-all-roles"], nproc=4
    )
    assert plan.slice_ranks == (0, 1, 1024, 2048, 3072, 4096, 5120, 6144, 7168, 7169)
    assert [len(batch) for batch in plan.capture_batches] == [4, 4, 2]
    assert all(len(c.members) == 1 for c in plan.role_classes)


def test_fewer_processes_than_classes_take_more_passes_and_fewer_than_real_ranks_are_refused(tmp_path):
    plan = plan_run([*JOB, "--prism-ranks", "0", "--prism-out", str(tmp_path)], nproc=2)
    assert plan.capture_batches == [(0, 1024), (7168, 6144)]
    with pytest.raises(ValueError, match="--nproc-per-node 1 is fewer than the 2 real ranks"):
        plan_run([*JOB, "--prism-ranks", "0,1024", "--prism-out", str(tmp_path)], nproc=1)


def test_the_default_run_folder_is_a_new_timestamped_one_under_prism_out(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    plan = plan_run([*JOB, "--prism-ranks", "0"], now_s=0.0)
    assert os.path.dirname(plan.out_dir) == "prism-out"
    assert len(os.path.basename(plan.out_dir)) == len("YYYYmmdd-HHMMSS")
    assert not os.path.exists(plan.out_dir), "planning writes nothing"


def test_a_run_folder_that_holds_files_is_refused_unless_overwrite(tmp_path):
    (tmp_path / "report.json").write_text('{"schema_version": 1, "status": "ok", "target": {}}')
    with pytest.raises(ValueError, match="already holds a run; pass --prism-overwrite"):
        plan_run([*JOB, "--prism-out", str(tmp_path)])
    (tmp_path / "report.json").write_text("{}")  # not a report of ours: overwrite would remove user files
    with pytest.raises(ValueError, match="holds files but no run of ours"):
        plan_run([*JOB, "--prism-out", str(tmp_path), "--prism-overwrite"])
    (tmp_path / "report.json").write_text('{"schema_version": 1, "status": "ok", "target": {}}')
    assert plan_run([*JOB, "--prism-out", str(tmp_path), "--prism-overwrite"]).out_dir == str(tmp_path)


@pytest.mark.parametrize(
    "extra, message",
    [
        ([], "--prism-emulate is needed"),
        (
            ["--prism-emulate", "--prism-world-size", "8192", "--prism-phase", "emulate"],
            "--prism-phase emulate",
        ),
    ],
)
def test_what_the_command_cannot_run_is_refused_naming_the_flag(extra, message):
    flags = [f for f in JOB if f not in ("--prism-emulate", "--prism-world-size", "8192")]
    with pytest.raises(ValueError, match=message):
        plan_run([*flags, *extra])


def test_the_demo_is_the_8192_gpu_job_with_two_adjacent_real_stages(tmp_path):
    args = argparse.Namespace(out=str(tmp_path / "run"), overwrite=False, train_iters=6, capture_iters=4)
    plan = plan_run(demo.demo_flags(args))
    assert (plan.layout.world_size, plan.layout.tp, plan.layout.pp, plan.layout.dp) == (8192, 8, 8, 128)
    assert plan.real_ranks == (0, 1024)
    assert len(plan.capture_batches) == 2 and plan.config.capture.capture_iters == 4


def test_a_reused_graph_is_checked_before_the_run_and_not_loaded_again(tmp_path, monkeypatch):
    """The checks before the first process load (or build) the --prism-graph; the run takes that graph
    instead of loading or building it a second time (a capture folder of a large job builds slowly)."""
    from prism_megatron.emulation import driver
    from prism_megatron.graph import save_graph
    from prism_megatron.sim import PipelineSpec, layout_pipeline_graph
    from prism_megatron.topology import Layout

    spec = PipelineSpec(num_microbatches=2, fwd_ns=1_000_000, bwd_ns=2_000_000, activation_bytes=1 << 16)
    layout = Layout(world_size=16, tp=2, pp=2)
    save_graph(layout_pipeline_graph(layout, spec), str(tmp_path / "graph"))
    flags = ["--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
             "--micro-batch-size", "1", "--global-batch-size", "8", "--train-iters", "2",
             "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--prism-emulate",
             "--prism-world-size", "16", "--prism-ranks", "0", "--prism-graph", str(tmp_path / "graph"),
             "--prism-out", str(tmp_path / "run")]  # fmt: skip
    plan = plan_run(flags)
    assert plan.reused_graph is not None and len(plan.reused_graph.roles) == len(layout.roles())

    def load_again(*args, **kwargs):
        raise AssertionError("the graph was loaded a second time")

    monkeypatch.setattr(driver, "load_or_build_graph", load_again)
    assert driver._load(plan.config.capture.graph, plan) is plan.reused_graph
