"""Faults during a run: no run outlives its command, and a hung real rank fails the run saying where.

The job: GPT on W=2 GPUs as two pipeline stages, both real; its slice is both ranks, captured in
one pass of two processes. Processes are found by their process groups (torchrun and every worker
lead groups of their own), so a process that was reparented still counts. Each test prints how long
its fault took to end the run (`pytest -s` shows it).
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from launching import alive_in_groups, process_groups_naming, quiet_env

from prism_megatron.report import schema

JOB = (
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
    "--vocab-size", "1000", "--micro-batch-size", "1", "--global-batch-size", "2",
    "--pipeline-model-parallel-size", "2", "--hidden-dropout", "0", "--attention-dropout", "0",
    "--prism-emulate", "--prism-world-size", "2", "--prism-device", "cpu", "--train-iters", "3",
)  # fmt: skip
HANG_SITE = os.path.join(os.path.dirname(__file__), "hang_site")
STOPPED_WITHIN_S = 10.0
TIMEOUT_S = 20


EMULATE_SH = os.path.join(os.path.dirname(__file__), "..", "..", "launch", "emulate.sh")


def start_emulate(out, *flags: str, env: dict | None = None, config=None) -> subprocess.Popen:
    """`prism-megatron emulate -- JOB ...`, or with `config` (JOB written to it) `launch/emulate.sh
    CONFIG -- ...`, which replaces itself with the same command."""
    if config is None:
        command = [sys.executable, "-m", "prism_megatron.cli", "emulate", "--", *JOB]
    else:
        config.write_text("\n".join(JOB) + "\n")
        command = ["bash", EMULATE_SH, str(config), "--"]
        env = {**(env or quiet_env()), "PYTHON": sys.executable}
    return subprocess.Popen(
        [*command, "--prism-out", str(out), *flags], env=env or quiet_env(),
        stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True, start_new_session=True,
    )  # fmt: skip


def read_json(path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def wait_for_iterations(process: subprocess.Popen, progress_dir, num_iterations: int, timeout_s=300) -> None:
    """Until every real rank's progress file shows `num_iterations` done (or the run ended)."""
    deadline_s = time.monotonic() + timeout_s
    while time.monotonic() < deadline_s and process.poll() is None:
        states = [read_json(progress_dir / name) for name in ("rank-00000.json", "rank-00001.json")
                  if (progress_dir / name).exists()]  # fmt: skip
        if len(states) == 2 and min(s["iterations_done"] for s in states) >= num_iterations:
            return
        time.sleep(0.2)
    raise AssertionError(f"the ranks did not reach iteration {num_iterations}: {process.communicate()}")


def stop_and_time(process: subprocess.Popen, run_dir, signum=signal.SIGTERM) -> tuple[float, float]:
    """Signal the command; (seconds until every process it started is gone, until it exited)."""
    groups = set(process_groups_naming(run_dir).values()) - {os.getpgrp()}
    assert len(groups) >= 4, f"the command, torchrun and two workers, in groups of their own: {groups}"
    started_s = time.monotonic()
    process.send_signal(signum)
    while alive_in_groups(groups - {process.pid}) and time.monotonic() - started_s < 60:
        time.sleep(0.05)
    stopped_s = time.monotonic() - started_s
    process.communicate(timeout=60)
    exited_s = time.monotonic() - started_s
    assert not alive_in_groups(groups), "no process of the run is left"
    return stopped_s, exited_s


@pytest.mark.slow
def test_sigterm_during_capture_ends_every_process_and_the_report_says_interrupted(tmp_path):
    out = tmp_path / "run"  # started by launch/emulate.sh, which a SLURM task or a person runs
    process = start_emulate(out, "--prism-capture-iters", "1000", config=tmp_path / "job.args")
    wait_for_iterations(process, out / "capture" / "progress", 2)
    stopped_s, exited_s = stop_and_time(process, out)
    print(
        f"\nfault timing: SIGTERM during capture: processes gone in {stopped_s:.1f} s, command exited in {exited_s:.1f} s"
    )
    assert stopped_s < STOPPED_WITHIN_S
    assert process.returncode == 128 + signal.SIGTERM
    report = read_json(out / "report.json")
    schema.validate(report)
    assert report["status"] == "interrupted"
    assert "SIGTERM" in report["failure"]["message"] and "capture pass" in report["failure"]["message"]
    done = subprocess.run([sys.executable, "-m", "prism_megatron.cli", "report", "--check", str(out)],
                          env=quiet_env(), capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1 and "not finished (status interrupted" in done.stderr


@pytest.mark.slow
def test_a_hung_real_rank_fails_the_run_naming_it_with_every_ranks_stacks(tmp_path):
    out = tmp_path / "run"
    env = {**quiet_env(), "PRISM_TEST_HANG": "0:2"}  # process 0 sleeps when its iteration 2 begins
    env["PYTHONPATH"] = os.pathsep.join([HANG_SITE, *filter(None, [env.get("PYTHONPATH")])])
    process = start_emulate(out, "--prism-capture-iters", "4", "--prism-timeout", str(TIMEOUT_S), env=env)
    wait_for_iterations(process, out / "capture" / "progress", 1)
    hung_s = time.monotonic()  # rank 0 is at most one iteration from its hang
    groups = set(process_groups_naming(out).values()) - {os.getpgrp()}
    assert len(groups) >= 4
    stdout, stderr = process.communicate(timeout=TIMEOUT_S + 120)
    took_s = time.monotonic() - hung_s
    print(
        f"\nfault timing: hung rank (--prism-timeout {TIMEOUT_S}): run failed {took_s:.1f} s after the hang"
    )
    assert took_s < TIMEOUT_S + 30, "the run fails within --prism-timeout + 30 s"
    assert process.returncode == 1, stderr[-3000:]
    report = read_json(out / "report.json")
    schema.validate(report)
    failure = report["failure"]
    assert report["status"] == "failed" and failure["dead_rank"] == 0
    message = failure["message"]
    assert f"virtual rank 0 (process 0) made no progress for {TIMEOUT_S} s" in message, message
    assert "capture-1 pass" in message and "sitecustomize.py" in message and "_hanging_begins" in message
    assert "virtual rank 1 (process 1) made no progress" not in message, "the rank waiting on it is no cause"
    folder = out / "capture" / "watchdog"
    assert str(folder) in message and "virtual rank 0" in stdout
    stacks = (folder / "rank-00000.stacks.txt").read_text()
    assert "in _hanging_begins" in stacks and "pretrain.py" in stacks
    assert (folder / "rank-00001.stacks.txt").exists(), "every rank leaves its stacks"
    for rank in (0, 1):
        assert (
            (folder / f"rank-{rank:05d}.flight-recorder.txt").read_text().startswith("prism flight recorder")
        )
    assert not alive_in_groups(groups), "no process of the run is left"
