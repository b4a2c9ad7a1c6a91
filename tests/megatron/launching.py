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


def process_groups_naming(path: Path) -> dict[int, int]:
    """{pid: process group} of every process whose command line names `path` (a run folder), and
    of every other process in those groups (a worker's own children)."""
    found = {pid: stat[1] for pid, stat in _processes().items() if str(path) in _cmdline(pid)}
    groups = set(found.values())
    return {pid: stat[1] for pid, stat in _processes().items() if stat[1] in groups or pid in found}


def alive_in_groups(groups: set[int]) -> list[int]:
    """The processes (zombies aside) still in any of these process groups."""
    return [pid for pid, stat in _processes().items() if stat[1] in groups and stat[0] != "Z"]


def _processes() -> dict[int, tuple[str, int]]:
    """{pid: (state, process group)} from /proc."""
    out = {}
    for name in os.listdir("/proc"):
        if name.isdigit():
            try:
                with open(f"/proc/{name}/stat", encoding="ascii", errors="replace") as f:
                    fields = f.read().rsplit(")", 1)[1].split()
            except OSError:
                continue
            out[int(name)] = (fields[0], int(fields[2]))
    return out


def _cmdline(pid: int) -> str:
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            return f.read().replace(b"\0", b" ").decode(errors="replace")
    except OSError:
        return ""
