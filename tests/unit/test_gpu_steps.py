"""The GPU script's step machinery on CPU: a crashing step gets a backtrace and a malloc-checked rerun.

benchmarks/gpu/run.sh runs on a lent GPU machine once per task, so its crash handling must be proven
here: a step whose process dies of a signal is recorded as crashed, followed once by its native
backtrace (gdb) and once by a rerun under glibc's malloc checking, and neither follow-up is followed
up again; a failing step that did not crash gets neither.
"""

from __future__ import annotations

import shutil
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CRASH = f"{sys.executable} -c 'import os, signal; os.kill(os.getpid(), signal.SIGSEGV)'"


def run_steps(tmp_path: Path, steps: str) -> tuple[list[list[str]], str]:
    """Source steps.sh, run the given run_step lines; (rows of steps.tsv, the log)."""
    script = f"""
set -uo pipefail
WORK={tmp_path}/work; LOG={tmp_path}/log; BUDGET_S=300; START_S=$SECONDS; failed=0
mkdir -p "$WORK"; : >"$LOG"
source {REPO}/benchmarks/gpu/steps.sh
{steps}
echo "failed=$failed"
"""
    done = subprocess.run(["bash", "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.strip().endswith("failed=1")
    rows = [line.split("\t") for line in (tmp_path / "work" / "steps.tsv").read_text().splitlines()]
    return rows, (tmp_path / "log").read_text()


def test_a_crash_is_followed_by_a_backtrace_and_one_malloc_checked_rerun(tmp_path):
    rows, log = run_steps(tmp_path, f"run_step smoke 60 : -- {CRASH}\nrun_step after 10 : -- true")
    status = {row[0]: row[1] for row in rows}
    assert [row[0] for row in rows] == ["smoke", "smoke_backtrace", "smoke_malloc_check", "after"]
    assert status["smoke"] == "crashed" and "signal 11" in rows[0][3]
    assert status["smoke_malloc_check"] == "crashed"  # crashed again, and not followed up again
    assert "signal 11 (SEGV)" in rows[2][3]
    assert "MALLOC_CHECK_=3" in log
    if shutil.which("gdb") is None:
        assert status["smoke_backtrace"] == "skipped"
    else:
        assert "SIGSEGV" in log and "#0" in log, log[-3000:]  # gdb stopped there and printed the stack
    assert status["after"] == "ok"


def test_a_timeout_names_the_limit_and_the_signals(tmp_path):
    rows, _ = run_steps(tmp_path, f"run_step slow 1 : -- {sys.executable} -c 'import time; time.sleep(30)'")
    assert rows[0][:2] == ["slow", "timeout"]
    assert rows[0][3].startswith("killed at 1 s (SIGTERM, SIGKILL 10 s later)")


def test_a_plain_failure_is_not_followed_up(tmp_path):
    rows, _ = run_steps(tmp_path, f"run_step tests 30 : -- {sys.executable} -c 'raise SystemExit(3)'")
    assert rows == [["tests", "failed", rows[0][2], "exit status 3"]]


def test_a_fallback_build_runs_only_after_the_build_before_it_failed(tmp_path):
    steps = (
        "run_step build 30 : -- false\n"
        "run_step build_backend_only 30 'step_failed build' -- true\n"
        "run_step build_clock_only 30 'step_failed build_backend_only' -- true\n"
    )
    rows, _ = run_steps(tmp_path, steps)
    assert [(row[0], row[1]) for row in rows] == [
        ("build", "failed"),
        ("build_backend_only", "ok"),
        ("build_clock_only", "skipped"),
    ]
    assert rows[2][3] == "build_backend_only did not fail"


@pytest.mark.parametrize("script", ["benchmarks/gpu/run.sh", "benchmarks/gpu/steps.sh"])
def test_the_gpu_scripts_parse(script):
    subprocess.run(["bash", "-n", str(REPO / script)], check=True)
