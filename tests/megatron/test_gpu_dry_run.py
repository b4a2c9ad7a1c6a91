"""The GPU script's dress rehearsal: `benchmarks/gpu/run.sh --dry-run` on this machine's CPU.

A lent GPU machine gives a few minutes once; the script must not be what fails there. The dry run
goes through everything the GPU run does (setup steps, the probes, each stage's command line as
run.sh builds it, the summary, the verdict table), with the stages that can run without a GPU on
the CPU and the asynchronous test device at small sizes, and the GPU-only stages NOT RUN. It must
end with status 0: no step crashed, timed out or failed, and every check of correctness held.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CPU_STAGES = ("smoke", "main_claim", "stream_ordering", "shared_gpu_jobs", "backend_ops", "memory_ground_truth",
              "emulated_llama_rank", "cpu_clock")  # fmt: skip
GPU_STAGES = (
    "model_kernels",
    "kernel_profile",
    "wait_precision",
    "gpt_capture_profile",
    "gpu_tests",
    "stream_overlap",
)


def run_script(tmp_path: Path, *args: str, timeout_s: float) -> subprocess.CompletedProcess:
    env = {**os.environ, "OUT": str(tmp_path), "PYTHON": sys.executable, "OMP_NUM_THREADS": "1",
           "PYTHONWARNINGS": "ignore", "TMPDIR": str(tmp_path)}  # fmt: skip
    return subprocess.run(["bash", str(REPO / "benchmarks/gpu/run.sh"), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=timeout_s)  # fmt: skip


def first_failure(tmp_path: Path) -> str:
    """The log around the first traceback: a failed step's verdict row keeps its first error line only."""
    log = tmp_path / f"{datetime.date.today().isoformat()}-gpu.log"
    text = log.read_text() if log.exists() else ""
    start = text.find("Traceback")
    return "" if start < 0 else "\n--- first traceback in the log:\n" + text[start : start + 4000]


def verdict_rows(tmp_path: Path) -> dict[str, list[str]]:
    """stage -> its rows' results, from the summary's verdict table."""
    text = (tmp_path / f"{datetime.date.today().isoformat()}-gpu.md").read_text()
    table = text[text.index("## Verdict") :]
    rows: dict[str, list[str]] = {}
    for line in table.splitlines()[4:]:
        cells = [c.strip() for c in line.strip("|").split("|")]
        if len(cells) == 4:
            rows.setdefault(cells[0], []).append(cells[2].strip("*"))
    return rows


@pytest.mark.slow  # every CPU stage once at small sizes: several minutes on two shared cores
def test_the_dry_run_runs_every_stage_that_needs_no_gpu_and_passes(tmp_path):
    done = run_script(tmp_path, "--dry-run", timeout_s=3000)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:] + first_failure(tmp_path)
    rows = verdict_rows(tmp_path)
    for stage in CPU_STAGES:
        assert rows[stage] and set(rows[stage]) <= {"PASS", "CPU"}, (stage, rows[stage])
    for stage in GPU_STAGES:
        assert rows[stage] == ["NOT RUN"] * len(rows[stage]), (stage, rows[stage])
    assert "dry run: needs a GPU" in done.stdout
    for setup in ("prebuilt", "build", "cuda_build"):
        assert set(rows[setup]) == {"NOT RUN"}


def test_only_runs_the_named_stage_and_refuses_an_unknown_one(tmp_path):
    refused = run_script(tmp_path, "--dry-run", "--only", "smoke,no_such_stage", timeout_s=60)
    assert refused.returncode == 2
    assert "--only: no stage 'no_such_stage'" in refused.stderr and "main_claim" in refused.stderr
    done = run_script(tmp_path, "--dry-run", "--only", "smoke", timeout_s=900)
    assert done.returncode == 0, done.stdout[-6000:] + done.stderr[-3000:]
    rows = verdict_rows(tmp_path)
    assert rows["smoke"] == ["PASS"]
    assert all(set(rows[s]) == {"NOT RUN"} for s in CPU_STAGES[1:])
    assert "not selected (--only smoke)" in done.stdout
