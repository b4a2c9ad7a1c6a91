"""Production configurations: each file reads, cites its source, describes a job Megatron can lay out,
says what its source says, and reads the same in the shell wrapper as in Python."""

from __future__ import annotations

import argparse
import os
import subprocess
from pathlib import Path

import pytest

from prism_megatron.megatron.job import target
from prism_megatron.megatron.job.configs import flag_value, header, read_config, world_size_of
from prism_megatron.topology import Layout

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "launch" / "configs").glob("*.args"))


def _int(argv: list[str], flag: str, default: int | None = 1) -> int | None:
    value = flag_value(argv, flag)
    return default if value is None else int(value)


def layout_of(argv: list[str]) -> Layout:
    """The configuration's layout, read by the parser every command uses (no torch, no Megatron)."""
    parser = argparse.ArgumentParser(add_help=False, allow_abbrev=False)
    target.add_job_arguments(parser)
    flags, _ = parser.parse_known_args(argv)
    return target.derive(flags, world_size=world_size_of(argv)).layout()


def test_the_issue_s_configurations_are_all_shipped():
    names = {path.stem for path in CONFIGS}
    weak_scaling = {f"gpt-{size}-{gpus}gpus" for size, gpus in (
        ("1.7b", 48), ("7.1b", 96), ("16b", 192), ("32b", 384), ("70b", 768), ("119b", 1536),
        ("177b", 2304), ("314b", 3072), ("462b", 6144))}  # fmt: skip
    others = {
        "gpt3-175b-1024gpus", "gpt3-175b-3072gpus", "llama3-405b-8192gpus", "llama3-405b-16384gpus",
        "llama3-405b-16384gpus-cp16", "llama3-70b-8192gpus", "mixtral-8x22b-2048gpus", "deepseek-v3-2048gpus",
    }  # fmt: skip
    assert weak_scaling | others <= names


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_configuration_reads_cites_its_source_and_lays_out(path):
    argv = read_config(path)
    lines = header(path)
    assert lines[0].startswith("Source:"), "the first comment line cites the source"
    assert any(line.startswith("Chosen") for line in lines), "the header says what was chosen"
    assert all(word.startswith("--") for word in argv[:1])
    assert "--prism-ranks" not in argv
    layout = layout_of(argv)  # raises ValueError where megatron-core would refuse the sizes
    assert layout.dp * layout.tp * layout.pp * layout.cp == layout.world_size


# (world size, TP, PP, CP, DP, sequence, layers, hidden, heads, global batch) as the sources give them.
PUBLISHED = {
    "gpt-1.7b-48gpus": (48, 1, 1, 1, 48, 4096, 24, 2048, 16, 192),
    "gpt-7.1b-96gpus": (96, 2, 1, 1, 48, 4096, 30, 4096, 32, 192),
    "gpt-16b-192gpus": (192, 4, 1, 1, 48, 4096, 32, 6144, 48, 192),
    "gpt-32b-384gpus": (384, 8, 1, 1, 48, 4096, 48, 7168, 56, 192),
    "gpt-70b-768gpus": (768, 8, 2, 1, 48, 4096, 84, 8192, 64, 384),
    "gpt-119b-1536gpus": (1536, 8, 4, 1, 48, 4096, 92, 10240, 80, 768),
    "gpt-177b-2304gpus": (2304, 8, 6, 1, 48, 4096, 96, 12288, 96, 1152),
    "gpt-314b-3072gpus": (3072, 8, 8, 1, 48, 4096, 96, 16384, 128, 1536),
    "gpt-462b-6144gpus": (6144, 8, 16, 1, 48, 4096, 112, 18432, 144, 3072),
    "gpt3-175b-1024gpus": (1024, 8, 16, 1, 8, 2048, 96, 12288, 96, 1536),
    "gpt3-175b-3072gpus": (3072, 8, 8, 1, 48, 2048, 96, 12288, 96, 1536),
    "llama3-405b-8192gpus": (8192, 8, 16, 1, 64, 8192, 126, 16384, 128, 2048),
    "llama3-405b-16384gpus": (16384, 8, 16, 1, 128, 8192, 126, 16384, 128, 2048),
    "llama3-405b-16384gpus-cp16": (16384, 8, 16, 16, 8, 131072, 126, 16384, 128, 128),
    "llama3-70b-8192gpus": (8192, 8, 4, 1, 256, 8192, 80, 8192, 64, 2048),
}


@pytest.mark.parametrize("name", sorted(PUBLISHED))
def test_configurations_say_what_their_sources_say(name):
    argv = read_config(REPO / "launch" / "configs" / f"{name}.args")
    layout = layout_of(argv)
    got = (
        layout.world_size, layout.tp, layout.pp, layout.cp, layout.dp,
        _int(argv, "--seq-length"), _int(argv, "--num-layers"), _int(argv, "--hidden-size"),
        _int(argv, "--num-attention-heads"), _int(argv, "--global-batch-size"),
    )  # fmt: skip
    assert got == PUBLISHED[name]


def test_moe_configurations_use_expert_parallelism_at_2048_gpus_or_more():
    for name, experts, ep in (("mixtral-8x22b-2048gpus", 8, 8), ("deepseek-v3-2048gpus", 256, 64)):
        argv = read_config(REPO / "launch" / "configs" / f"{name}.args")
        assert world_size_of(argv) >= 2048
        assert (_int(argv, "--num-experts"), _int(argv, "--expert-model-parallel-size")) == (experts, ep)
        assert layout_of(argv).edp >= 1


@pytest.mark.parametrize("path", CONFIGS[:3] + CONFIGS[-3:], ids=lambda p: p.stem)
def test_emulate_sh_passes_the_same_flags_as_the_python_reader(path):
    command = [str(REPO / "launch" / "emulate.sh"), str(path), "--ranks", "pp=0;tp=0", "--nproc-per-node", "2",
               "--", "--prism-device", "cpu"]  # fmt: skip
    done = subprocess.run(
        command, env={**os.environ, "DRY_RUN": "1"}, capture_output=True, text=True, check=True
    )
    words = done.stdout.splitlines()
    assert words[:7] == ["python3", "-m", "prism_megatron.cli", "emulate", "--nproc-per-node", "2", "--"]
    assert words[7:] == [
        *read_config(path),
        "--prism-emulate",
        "--prism-ranks",
        "pp=0;tp=0",
        "--prism-device",
        "cpu",
    ]


def test_emulate_sh_across_machines_runs_the_named_pass_under_torchrun():
    path = CONFIGS[0]
    command = [str(REPO / "launch" / "emulate.sh"), str(path), "--nproc-per-node", "8"]
    env = {**os.environ, "DRY_RUN": "1", "TORCHRUN_ARGS": "--nnodes 2", "PHASE": "capture"}
    words = subprocess.run(command, env=env, capture_output=True, text=True, check=True).stdout.splitlines()
    assert words[:7] == ["torchrun", "--nnodes", "2", "--nproc-per-node", "8", "-m", "prism_megatron.launch"]
    assert words[8:] == [*read_config(path), "--prism-emulate", "--prism-phase", "capture"]


def test_emulate_sh_across_machines_without_a_pass_is_refused_in_one_line():
    path = CONFIGS[0]
    env = {**os.environ, "DRY_RUN": "1", "TORCHRUN_ARGS": "--nnodes 2"}
    done = subprocess.run(
        [str(REPO / "launch" / "emulate.sh"), str(path)], env=env, capture_output=True, text=True
    )
    assert done.returncode == 2
    assert done.stderr.count("\n") == 1 and "PHASE=capture or PHASE=emulate" in done.stderr


def test_reader_strips_comments_keeps_values_and_expands_nothing(tmp_path):
    path = tmp_path / "job.args"
    path.write_text(
        "# Source: a test\n\n--num-layers 4   # four\n--moe-layer-freq ([0]*1+[1]*3)\n"
        "--data-path $HOME/a#b *.bin\n  --rampup-batch-size 16 16 100\n",
        encoding="utf-8",
    )
    assert read_config(path) == [
        "--num-layers", "4", "--moe-layer-freq", "([0]*1+[1]*3)", "--data-path", "$HOME/a#b", "*.bin",
        "--rampup-batch-size", "16", "16", "100",
    ]  # fmt: skip
    assert header(path) == ["Source: a test"]


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("num-layers 4\n", "job.args:1: expected a flag"),
        ("# x\n--prism-ranks 0\n", "job.args:2: --prism-ranks"),
    ],
)
def test_reader_names_the_file_and_line_of_a_mistake(tmp_path, text, message):
    path = tmp_path / "job.args"
    path.write_text(text, encoding="utf-8")
    with pytest.raises(ValueError, match=message):
        read_config(path)
