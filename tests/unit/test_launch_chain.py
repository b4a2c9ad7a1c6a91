"""launch/prism-chain.sh: one submission, capture -> emulate -> report as dependent SLURM jobs.

A stand-in `sbatch` records what it was asked to submit (its environment and arguments) and answers
job ids, as `sbatch --parsable` does; the chain's own logic (batches, dependencies, flags) is real.
"""

from __future__ import annotations

import json
import os
import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from prism_megatron.emulation import plan_run
from prism_megatron.graph.classes import load_classes
from prism_megatron.megatron.job.configs import read_config

REPO = Path(__file__).resolve().parents[2]
CHAIN = REPO / "launch" / "prism-chain.sh"
CONFIG = (
    REPO / "launch" / "configs" / "gpt3-175b-1024gpus.args"
)  # TP8 PP16: 16 roles of TP rank 0 ... 16 more
FAKE_SBATCH = """#!/usr/bin/env python3
import json, os, sys
log = os.environ["FAKE_SBATCH_LOG"]
jobs = [json.loads(line) for line in open(log)] if os.path.exists(log) else []
job = {"args": sys.argv[1:], "env": {k: os.environ.get(k) for k in ("PHASE", "GPUS_PER_NODE", "EXTRA_FLAGS")}}
with open(log, "a") as f:
    f.write(json.dumps(job) + "\\n")
print(f"{5000 + len(jobs)};cluster")
"""


def _chain(tmp_path, *args: str) -> tuple[subprocess.CompletedProcess, list[dict]]:
    sbatch = tmp_path / "sbatch"
    sbatch.write_text(FAKE_SBATCH)
    sbatch.chmod(0o755)
    log = tmp_path / "jobs.jsonl"
    env = {
        **os.environ,
        "SBATCH": str(sbatch),
        "FAKE_SBATCH_LOG": str(log),
        "PYTHON": sys.executable,
        "PYTHONPATH": str(REPO),
        "PYTHONWARNINGS": "ignore",
    }
    done = subprocess.run([str(CHAIN), *args], env=env, capture_output=True, text=True)
    jobs = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return done, jobs


def _option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def test_one_submission_chains_capture_batches_the_emulation_and_the_report(tmp_path):
    run = str(tmp_path / "run1")
    done, jobs = _chain(
        tmp_path, str(CONFIG), "--out", run, "--nodes", "2", "--gpus-per-node", "8",
        "--ranks", "pp=0-15;tp=0;dp=0", "--", "--prism-cluster", "dgx-h100",
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    *captures, emulate, report = jobs
    # The slice (one rank per class of roles) in batches of 8 ranks, the last one smaller, one node
    # each; the classes go beside the captures, for the graph the emulation builds there.
    plan = plan_run([*read_config(CONFIG), "--prism-emulate", "--prism-ranks", "pp=0-15;tp=0;dp=0"], nproc=16)
    slice_ranks = plan.slice_ranks
    assert load_classes(f"{run}/capture") == plan.role_classes
    batches = [[int(r) for r in c["args"][-1].split(",")] for c in captures]
    assert [r for b in batches for r in b] == list(slice_ranks)
    assert all(len(b) == 8 for b in batches[:-1]) and 0 < len(batches[-1]) <= 8
    for job, batch in zip(captures, batches, strict=True):
        assert job["env"]["PHASE"] == "capture" and job["env"]["GPUS_PER_NODE"] == str(len(batch))
        assert job["env"]["EXTRA_FLAGS"].split() == [
            "--prism-out",
            f"{run}/capture",
            "--prism-cluster",
            "dgx-h100",
        ]
        assert _option(job["args"], "--nodes") == "1" and job["args"][-2] == str(CONFIG)
        assert "--dependency" not in job["args"]  # the capture batches run at once
    # The emulation waits for every capture job; its ranks and the graph they built.
    capture_ids = [str(5000 + i) for i in range(len(captures))]
    assert _option(emulate["args"], "--dependency") == "afterok:" + ":".join(capture_ids)
    assert _option(emulate["args"], "--nodes") == "2" and emulate["args"][-1] == "pp=0-15;tp=0;dp=0"
    assert emulate["env"]["PHASE"] == "emulate"
    assert emulate["env"]["EXTRA_FLAGS"].split()[:4] == [
        "--prism-graph",
        f"{run}/capture",
        "--prism-out",
        run,
    ]
    # The report waits for the emulation and runs the report-only pass over the same flags.
    assert _option(report["args"], "--dependency") == f"afterok:{5000 + len(captures)}"
    words = shlex.split(_option(report["args"], "--wrap"))
    assert words[:6] == [sys.executable, "-m", "prism_megatron.cli", "emulate", "--report-only", "--"]
    assert words[6:] == [
        *read_config(CONFIG), "--prism-emulate", "--prism-ranks", "pp=0-15;tp=0;dp=0", "--prism-cluster", "dgx-h100",
        "--prism-graph", f"{run}/capture", "--prism-out", run,
    ]  # fmt: skip
    assert f"capture jobs: {' '.join(capture_ids)} " in done.stdout


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (
            ["--out", "/r", "--nodes", "3", "--ranks", "0"],
            "real ranks must fill --nodes 3 x --gpus-per-node 8",
        ),
        (["--out", "/r", "--ranks", "99999"], "virtual rank 99999 is outside the world"),
        (["--nodes", "1"], "--out RUN is required"),
        (["--out", "/r", "--nodes", "two"], "--nodes must be a whole number"),
    ],
)
def test_mistakes_are_one_line_and_submit_nothing(tmp_path, args, message):
    done, jobs = _chain(tmp_path, str(CONFIG), *args)
    assert done.returncode != 0 and jobs == []
    assert message in done.stderr and done.stderr.strip().count("\n") == 0


def test_a_run_folder_that_holds_a_run_is_refused_before_anything_is_submitted(tmp_path):
    """Captures left in RUN by an earlier run would mix into this run's graph."""
    run = tmp_path / "run"
    (run / "capture").mkdir(parents=True)
    (run / "capture" / "capture-00000.json").write_text("{}")
    done, jobs = _chain(tmp_path, str(CONFIG), "--out", str(run), "--ranks", "0,1", "--gpus-per-node", "2")
    assert done.returncode != 0 and jobs == []
    assert "--prism-out" in done.stderr and "--prism-overwrite" in done.stderr
    assert not (run / "capture" / "role-classes.json").exists()
