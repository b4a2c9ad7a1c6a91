"""Every shipped configuration runs as written, only its size shrunk, through `prism-megatron emulate` on CPU.

`shrink_size` keeps the world size, every parallel size, the batch and every switch, and changes only
the flags of `SIZE_FLAGS` (checked here for every file, without processes, together with the built-in
entry's own checks: none is refused). Then each configuration runs end to end: its whole slice (one
rank per role) in capture passes of two processes in the full-size virtual world, the graph, the
simulation, two emulated iterations of virtual rank 0 and the report. Sequence parallelism, context
parallelism (Llama 3 405B at CP 16) and MoE with TP 2 (Mixtral) run on the local layers.

A whole slice at full world size takes minutes per role on a 2-core machine (Llama 3 405B at CP 16:
18 roles of a 16384-rank world), so CI runs the two-role GPT 7.1B (TP 2 with sequence parallelism, two
real processes in one TP group); every configuration runs with PRISM_PRODUCTION_CONFIGS=1, DeepSeek-V3
(EP 64: 1024 roles) and Mixtral (80 roles) only with PRISM_LARGE_SLICES=1 as well.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from launching import quiet_env

from prism_megatron.commands.emulate import check_builtin_flags
from prism_megatron.megatron.job.configs import read_config, world_size_of
from prism_megatron.megatron.job.size_shrink import SIZE_FLAGS, shrink_size

CONFIGS = sorted(Path(__file__).resolve().parents[2].joinpath("launch", "configs").glob("*.args"))
LARGE_SLICES = {"deepseek-v3-2048gpus": 1024, "mixtral-8x22b-2048gpus": 80}


def _flag_values(argv: list[str]) -> dict[str, str]:
    """The last value of every flag (Megatron-LM's parser keeps the last); switches map to ''."""
    values: dict[str, str] = {}
    for i, word in enumerate(argv):
        if word.startswith("--"):
            following = argv[i + 1] if i + 1 < len(argv) else ""
            values[word] = "" if following.startswith("--") else following
    return values


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_a_size_shrink_changes_only_the_size_flags_and_the_entry_takes_it(path):
    production = read_config(path)
    small = shrink_size(production)
    before, after = _flag_values(production), _flag_values(small)
    changed = {flag for flag in after if before.get(flag) != after[flag]}
    assert changed <= set(SIZE_FLAGS), changed - set(SIZE_FLAGS)
    assert set(before) <= set(after)
    assert after["--prism-world-size"] == before["--prism-world-size"]
    check_builtin_flags(small, world_size_of(small))


IN_CI = {"gpt-7.1b-96gpus"}


def _slow_unless_small(path: Path):
    roles = LARGE_SLICES.get(path.stem)
    marks = [pytest.mark.slow]
    if roles and not os.environ.get("PRISM_LARGE_SLICES"):
        marks.append(pytest.mark.skip(reason=f"{roles} roles to capture; set PRISM_LARGE_SLICES=1"))
    elif path.stem not in IN_CI and not os.environ.get("PRISM_PRODUCTION_CONFIGS"):
        marks.append(pytest.mark.skip(reason="minutes per role; set PRISM_PRODUCTION_CONFIGS=1"))
    return pytest.param(path, marks=marks, id=path.stem)


@pytest.mark.parametrize("path", [_slow_unless_small(p) for p in CONFIGS])
def test_the_configuration_runs_as_written_at_full_world_size(tmp_path, path):
    flags = [
        *shrink_size(read_config(path)),
        "--prism-emulate",
        "--prism-device",
        "cpu",
        "--prism-ranks",
        "0",
    ]
    done = subprocess.run(
        [sys.executable, "-m", "prism_megatron.cli", "emulate", "--nproc-per-node", "2", "--", *flags,
         "--prism-out", str(tmp_path)],
        env=quiet_env(), capture_output=True, text=True, timeout=3000,
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    report = json.loads((tmp_path / "report.json").read_text())
    assert report["status"] == "ok" and report["real_ranks"] == [0]
    assert report["target"]["world_size"] == world_size_of(flags)
    assert len(report["iterations"]) == 2
    # One capture per class of roles that run the same program (and confirming members in a pass's
    # spare places); every role of the job is in a class whose spans it takes.
    capture = report["capture"]
    captured = {name for name in os.listdir(tmp_path / "capture") if name.startswith("capture-")}
    assert captured == {f"capture-{rank:05d}.json" for rank in set(capture["captured_ranks"].values())}
    assert sorted(r for members in capture["classes"].values() for r in members) == sorted(report["roles"])
    assert capture["num_roles"] == len(report["roles"]) and capture["num_captured_roles"] <= len(
        report["roles"]
    )
    result = json.loads((tmp_path / "rank-00000.json").read_text())
    assert all(it["grad_norm"] is not None and it["grad_norm"] > 0 for it in result["iterations"])


def test_a_split_that_counts_the_embedding_and_loss_as_layers_shrinks_to_what_megatron_takes():
    """Interleaved or not, the embedding and the loss take a layer's place in the shrunk split."""
    for interleaved in ((), ("--num-layers-per-virtual-pipeline-stage", "2")):
        production = [
            "--num-layers", "30", "--hidden-size", "256", "--num-attention-heads", "8", "--seq-length", "64",
            "--max-position-embeddings", "64", "--vocab-size", "1024", "--micro-batch-size", "1",
            "--global-batch-size", "64",
            "--pipeline-model-parallel-size", "4", "--account-for-embedding-in-pipeline-split",
            "--account-for-loss-in-pipeline-split", *interleaved, "--prism-world-size", "8",
        ]  # fmt: skip
        small = shrink_size(production)
        check_builtin_flags(small, world_size_of(small))
        # 2 per stage less the two, or 1 per chunk (PP 4 x VPP 4, the production's 32 / 4 / 2) less the two
        assert _flag_values(small)["--num-layers"] == ("14" if interleaved else "6")
