"""PrismConfig and the --prism-* flags generated from it."""

from __future__ import annotations

import argparse
import dataclasses

import pytest

from prism_megatron import config as prism_config
from prism_megatron.config import PrismConfig, add_prism_arguments

# The frozen flag set: changing a flag or a default is a user-visible change; update README with it.
FROZEN_FLAGS = {
    "--prism-emulate": False,
    "--prism-world-size": None,
    "--prism-ranks": None,
    "--prism-device": "auto",
    "--prism-cpu-threads-per-rank": None,
    "--prism-data-policy": "mirror",
    "--prism-timeout": 300.0,
    "--prism-straggler": None,
    "--prism-phase": "auto",
    "--prism-capture-iters": 4,
    "--prism-graph": None,
    "--prism-capture-all-roles": False,
    "--prism-cluster": "default",
    "--prism-out": None,
    "--prism-overwrite": False,
    "--prism-memory-history": False,
    "--prism-allow-untested-megatron": False,
    "--prism-list-patches": False,
}


def parse(*argv: str) -> PrismConfig:
    parser = argparse.ArgumentParser()
    add_prism_arguments(parser)
    return PrismConfig.from_args(parser.parse_args(list(argv)))


def test_the_flag_set_and_defaults_are_frozen():
    assert {flag: default for flag, default, _ in prism_config.flag_table()} == FROZEN_FLAGS


def test_every_flag_has_help_from_its_field_docstring():
    for flag, _, help_text in prism_config.flag_table():
        assert len(help_text) > 20, flag


def test_defaults_parse_to_the_default_config():
    assert parse() == PrismConfig()


def test_flags_land_in_their_sections_with_units_in_field_names():
    cfg = parse(
        "--prism-emulate", "--prism-world-size", "8192", "--prism-ranks", "0,5", "--prism-device", "cpu",
        "--prism-timeout", "12.5", "--prism-straggler", "5:1.5,7:2", "--prism-capture-iters", "3",
        "--prism-graph", "g.json", "--prism-cluster", "dgx-h100", "--prism-out", "o", "--prism-overwrite",
        "--prism-allow-untested-megatron",
    )  # fmt: skip
    assert cfg.emulation.world_size == 8192 and cfg.emulation.ranks == "0,5" and cfg.emulation.device == "cpu"
    assert cfg.emulation.timeout_s == 12.5
    assert cfg.emulation.stragglers() == {5: 1.5, 7: 2.0}
    assert cfg.capture == prism_config.CaptureConfig(capture_iters=3, graph="g.json")
    assert cfg.cluster.cluster == "dgx-h100"
    assert cfg.output == prism_config.OutputConfig(out="o", overwrite=True)
    assert cfg.patches.allow_untested_megatron and not cfg.patches.list_patches


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (("--prism-emulate",), "--prism-emulate needs --prism-world-size"),
        (("--prism-world-size", "0"), "--prism-world-size must be >= 1"),
        (("--prism-cpu-threads-per-rank", "0"), "--prism-cpu-threads-per-rank must be from 1 to 1024, got 0"),
        (("--prism-cpu-threads-per-rank", "100000"), "--prism-cpu-threads-per-rank must be from 1 to 1024"),
        (
            ("--prism-world-size", "2147483648"),
            "--prism-world-size 2147483648 is above the largest supported",
        ),
        (("--prism-timeout", "0"), "--prism-timeout must be a positive"),
        (("--prism-timeout", "nan"), "--prism-timeout must be a positive"),
        (("--prism-straggler", "5"), "--prism-straggler item '5' must read RANK:FACTOR"),
        (("--prism-straggler", "5:-1"), "the factor must be a number from 0.001 to 1000"),
        (("--prism-straggler", "1:0"), "--prism-straggler '1:0': the factor must be .* got 0$"),
        (("--prism-straggler", "1:1e308"), "the factor must be a number from 0.001 to 1000"),
        (("--prism-world-size", "8", "--prism-straggler", "9:1.5"), "outside --prism-world-size 8"),
        (("--prism-straggler", "5:1.5,5:2"), "--prism-straggler rank 5 is given twice"),
        (("--prism-capture-iters", "0"), "--prism-capture-iters must be >= 2"),
        (("--prism-capture-iters", "1"), "--prism-capture-iters must be >= 2 (the first is warm-up"),
        (("--prism-ranks", " "), "--prism-ranks must not be empty"),
        (("--prism-out", ""), "--prism-out must name a directory"),
        (("--prism-phase", "capture"), "--prism-phase capture needs --prism-emulate"),
        (("--prism-emulate", "--prism-world-size", "8", "--prism-phase", "emulate"), "needs --prism-graph"),
    ],
)
def test_invalid_values_name_the_flag(argv, message):
    with pytest.raises(ValueError, match=message.replace("(", r"\(")):
        parse(*argv)


def test_a_repeated_straggler_flag_adds_ranks_and_refuses_one_given_twice():
    flags = ["--prism-straggler", "5:1.5", "--prism-straggler", "7:2"]
    assert prism_config.parse_prism_flags(flags).emulation.stragglers() == {5: 1.5, 7: 2.0}
    with pytest.raises(ValueError, match=r"rank 5 is given twice \(5:1.5 and 5:2\)"):
        prism_config.parse_prism_flags(["--prism-straggler", "5:1.5", "--prism-straggler", "5:2"])


def test_a_bad_value_is_one_line_not_the_usage_of_every_flag():
    with pytest.raises(ValueError, match=r"argument --prism-device: invalid choice: 'tpu'"):
        prism_config.parse_prism_flags(["--prism-device", "tpu"])


def test_choices_are_enforced_by_the_parser():
    with pytest.raises(SystemExit):
        parse("--prism-device", "tpu")


def test_sections_are_frozen_and_keyword_only():
    with pytest.raises(dataclasses.FrozenInstanceError):
        PrismConfig().emulation.world_size = 3  # type: ignore[misc]
    with pytest.raises(TypeError):
        prism_config.EmulationConfig(True)  # type: ignore[misc]


def test_a_cpu_rank_gets_the_threads_asked_for_else_an_eighth_of_the_machine():
    assert prism_config.EmulationConfig(cpu_threads_per_rank=3).resolved_cpu_threads(num_cores=2) == 3
    assert prism_config.EmulationConfig().resolved_cpu_threads(num_cores=2) == 1
    assert prism_config.EmulationConfig().resolved_cpu_threads(num_cores=64) == 8


def test_auto_device_resolves_by_cuda_availability():
    assert prism_config.EmulationConfig().resolved_device(cuda_available=False) == "cpu"
    assert prism_config.EmulationConfig().resolved_device(cuda_available=True) == "cuda"
    assert prism_config.EmulationConfig(device="cpu").resolved_device(cuda_available=True) == "cpu"


def test_the_readme_lists_every_flag_with_its_default():
    import pathlib

    readme = (pathlib.Path(__file__).parents[2] / "README.md").read_text(encoding="utf-8")
    for flag, default, help_text in prism_config.flag_table():
        shown = "off" if default is False else ("—" if default is None else f"`{default}`")
        assert f"| `{flag}` | {shown} | {help_text} |" in readme, flag
