"""launch/prism-chain.sh: one submission, capture -> emulate -> report as dependent SLURM jobs.

A stand-in `sbatch` records what it was asked to submit (its environment and arguments) and answers
job ids, as `sbatch --parsable` does; the chain's own logic (batches, dependencies, flags) is real.
"""

from __future__ import annotations

import json
import os
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
script = None if sys.stdin.isatty() else sys.stdin.read()
job = {"args": sys.argv[1:], "env": {k: os.environ.get(k) for k in ("PHASE", "GPUS_PER_NODE", "EXTRA_FLAGS")},
       "stdin": script}
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
    done = subprocess.run(
        [str(CHAIN), *args], env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL
    )
    jobs = [json.loads(line) for line in log.read_text().splitlines()] if log.exists() else []
    return done, jobs


def _option(args: list[str], name: str) -> str:
    return args[args.index(name) + 1]


def _after_dashes(args: list[str]) -> list[str]:
    """The flags a job's prism.sbatch gets after its `--`."""
    return args[args.index("--") + 1 :]


def _report_command(script: str) -> list[str]:
    """The words the report job's bash script runs, as bash itself reads them (its `exec` replaced by
    a function that prints its arguments NUL-separated)."""
    assert script.startswith("#!/bin/bash\n")
    shown = subprocess.run(
        ["bash", "-c", 'exec() { printf "%s\\0" "$@"; }; eval "$1"', "-", script],
        capture_output=True, text=True, check=True,
    )  # fmt: skip
    return shown.stdout.split("\0")[:-1]


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
    batches = [[int(r) for r in c["args"][c["args"].index("--") - 1].split(",")] for c in captures]
    assert [r for b in batches for r in b] == list(slice_ranks)
    assert all(len(b) == 8 for b in batches[:-1]) and 0 < len(batches[-1]) <= 8
    for job, batch in zip(captures, batches, strict=True):
        assert job["env"]["PHASE"] == "capture" and job["env"]["GPUS_PER_NODE"] == str(len(batch))
        assert job["env"]["EXTRA_FLAGS"] is None
        assert _after_dashes(job["args"]) == ["--prism-out", f"{run}/capture", "--prism-cluster", "dgx-h100"]
        assert _option(job["args"], "--nodes") == "1" and job["args"][job["args"].index("--") - 2] == str(
            CONFIG
        )
        assert "--dependency" not in job["args"]  # the capture batches run at once
    # The emulation waits for every capture job; its ranks and the graph they built.
    capture_ids = [str(5000 + i) for i in range(len(captures))]
    assert _option(emulate["args"], "--dependency") == "afterok:" + ":".join(capture_ids)
    assert _option(emulate["args"], "--nodes") == "2"
    assert emulate["args"][emulate["args"].index("--") - 1] == "pp=0-15;tp=0;dp=0"
    assert emulate["env"]["PHASE"] == "emulate"
    assert _after_dashes(emulate["args"]) == [
        "--prism-graph", f"{run}/capture", "--prism-out", run, "--prism-cluster", "dgx-h100",
    ]  # fmt: skip
    # The report waits for the emulation and runs the report-only pass over the same flags.
    assert _option(report["args"], "--dependency") == f"afterok:{5000 + len(captures)}"
    words = _report_command(report["stdin"])
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


def _dry_run_commands(stderr: str) -> tuple[list[list[str]], str]:
    """DRY_RUN's printed sbatch commands, each read back into its words by bash, and the report
    job's script."""
    script = stderr.split("<<SCRIPT\n", 1)[1].split("\nSCRIPT\n", 1)[0]
    lines = [line for line in stderr.split("<<SCRIPT\n", 1)[0].splitlines() if line.startswith("env ")]
    commands = []
    for line in lines:  # the report job's line is the last, before its script
        words = subprocess.run(["bash", "-c", 'f() { printf "%s\\0" "$@"; }; eval "f $1"', "-", line],
                               capture_output=True, text=True, check=True).stdout  # fmt: skip
        commands.append(words.split("\0")[:-1])
    return commands, script


def test_paths_with_spaces_and_a_newline_reach_every_job_whole(tmp_path):
    """--out and a cluster file path with spaces and a newline: the capture and emulation jobs get
    them as single arguments (prism.sbatch's, after --), the report job's bash script reads them back
    whole; prism.sbatch hands them on to emulate.sh and torchrun whole too."""
    odd = tmp_path / "runs dir\nwith newline"
    odd.mkdir()
    cluster = odd / "my cluster.yaml"
    cluster.write_text("base: dgx-h100\n")
    run = str(odd / "chain a b")
    sbatch = tmp_path / "sbatch"
    sbatch.write_text(FAKE_SBATCH)
    sbatch.chmod(0o755)
    env = {**os.environ, "SBATCH": str(sbatch), "PYTHON": sys.executable, "PYTHONPATH": str(REPO),
           "PYTHONWARNINGS": "ignore", "DRY_RUN": "1"}  # fmt: skip
    done = subprocess.run(
        [str(CHAIN), str(CONFIG), "--out", run, "--ranks", "0,1", "--gpus-per-node", "2", "--",
         "--prism-cluster", str(cluster)],
        env=env, capture_output=True, text=True, stdin=subprocess.DEVNULL,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr
    commands, script = _dry_run_commands(done.stderr)
    *captures, emulate, report = commands
    assert captures and all(
        _after_dashes(c) == ["--prism-out", f"{run}/capture", "--prism-cluster", str(cluster)]
        for c in captures
    )
    assert _after_dashes(emulate) == [
        "--prism-graph", f"{run}/capture", "--prism-out", run, "--prism-cluster", str(cluster),
    ]  # fmt: skip
    assert "--dependency" in report and "--wrap" not in report
    words = _report_command(script)
    assert words[words.index("--prism-cluster") + 1] == str(cluster)
    assert words[-4:] == ["--prism-graph", f"{run}/capture", "--prism-out", run]
    assert not os.path.exists(os.path.join(run, "capture")), "a dry run writes nothing"

    # prism.sbatch -> srun -> emulate.sh -> torchrun, with the emulation job's own arguments.
    fake = tmp_path / "bin"
    fake.mkdir()
    (fake / "scontrol").write_text("#!/bin/bash\necho node1\n")
    (fake / "srun").write_text('#!/bin/bash\nwhile [[ $1 == --* ]]; do shift; done\nexec "$@"\n')
    (fake / "torchrun").write_text(f"#!{sys.executable}\nimport json, sys\nprint(json.dumps(sys.argv[1:]))\n")
    for name in ("scontrol", "srun", "torchrun"):
        (fake / name).chmod(0o755)
    sbatch_args = emulate[emulate.index(str(REPO / "launch" / "prism.sbatch")) :]
    slurm = {**os.environ, "PATH": f"{fake}:{os.environ['PATH']}", "SLURM_SUBMIT_DIR": str(REPO),
             "SLURM_JOB_NODELIST": "node1", "SLURM_NNODES": "1", "SLURM_JOB_ID": "7", "PHASE": "emulate",
             "GPUS_PER_NODE": "2", "TORCHRUN": str(fake / "torchrun")}  # fmt: skip
    slurm.pop("EXTRA_FLAGS", None)
    ran = subprocess.run(["bash", *sbatch_args], env=slurm, capture_output=True, text=True, check=True)
    argv = json.loads(ran.stdout)
    assert argv[-6:] == [
        "--prism-graph",
        f"{run}/capture",
        "--prism-out",
        run,
        "--prism-cluster",
        str(cluster),
    ]
    assert argv[argv.index("--prism-ranks") + 1] == "0,1"


def test_the_chain_refuses_what_emulate_refuses_before_submitting(tmp_path):
    """The built-in entry's own flag check, which `emulate` makes before any process starts."""
    done, jobs = _chain(tmp_path, str(CONFIG), "--out", str(tmp_path / "run"), "--ranks", "0,1",
                        "--gpus-per-node", "2", "--", "--no-such-flag", "3")  # fmt: skip
    assert done.returncode != 0 and jobs == []
    assert "does not support --no-such-flag 3" in done.stderr and done.stderr.strip().count("\n") == 0
