"""Running the built-in entry in real processes for the tests (torch's own launcher, free port)."""

from __future__ import annotations

import glob
import json
import os
import subprocess
import sys
from pathlib import Path

TINY_GPT = (
    "--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
    "--vocab-size", "1000", "--micro-batch-size", "1", "--train-iters", "2",
    "--hidden-dropout", "0", "--attention-dropout", "0",
)  # fmt: skip


def quiet_env() -> dict[str, str]:
    """One thread per process (two cores are shared by everything) and no import-time warnings."""
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}


def run_entry(
    out_dir: Path, nproc: int, *flags: str, script: str = "builtin", timeout_s: float = 420.0
) -> list[dict]:
    """Run `prism_megatron.launch SCRIPT` under torch's launcher with `nproc` processes; per-rank results."""
    command = [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={nproc}",
        "-m", "prism_megatron.launch", script, *flags, "--prism-out", str(out_dir), "--prism-overwrite",
    ]  # fmt: skip
    done = subprocess.run(command, env=quiet_env(), capture_output=True, text=True, timeout=timeout_s)
    assert done.returncode == 0, f"exit {done.returncode}\n{done.stdout[-4000:]}\n{done.stderr[-6000:]}"
    return load_results(out_dir)


def load_results(out_dir: Path) -> list[dict]:
    paths = sorted(glob.glob(os.path.join(out_dir, "rank-*.json")))
    results = []
    for path in paths:
        with open(path, encoding="utf-8") as f:
            results.append(json.load(f))
    return results
