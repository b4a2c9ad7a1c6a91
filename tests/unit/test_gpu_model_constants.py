"""The GPU model's constants table: every number has a value, a unit and a public source."""

from __future__ import annotations

import ast
import pathlib

import pytest
import torch

from prism_megatron.gpu_model import GPU_NAMES, gpu_spec
from prism_megatron.gpu_model.constants import CONSTANTS, GPU_QUANTITIES, Constant

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "prism_megatron" / "gpu_model"
UNITS = {"FLOP/s", "bytes/s", "bytes", "ns", "count", "fraction"}


def unsourced(table: dict[str, Constant]) -> list[str]:
    """Keys whose constant lacks a source that names a document (a title and an address or a paper)."""
    bad = []
    for key, constant in table.items():
        source = constant.source.strip()
        names_a_place = "http" in source or "arXiv" in source
        if len(source) < 20 or not names_a_place or constant.unit not in UNITS:
            bad.append(key)
    return bad


def test_every_constant_has_a_unit_and_a_public_source():
    assert unsourced(CONSTANTS) == []


def test_a_constant_without_a_source_fails_the_check():
    table = dict(CONSTANTS)
    table["h100.made_up"] = Constant(value=1.0, unit="fraction", source="")
    table["h100.vague"] = Constant(value=1.0, unit="fraction", source="a number someone told me once")
    table["h100.no_unit"] = Constant(value=1.0, unit="", source=CONSTANTS["h100.num_sms"].source)
    assert unsourced(table) == ["h100.made_up", "h100.vague", "h100.no_unit"]


@pytest.mark.parametrize("gpu", GPU_NAMES)
def test_every_gpu_has_every_quantity(gpu):
    missing = [q for q in GPU_QUANTITIES if f"{gpu}.{q}" not in CONSTANTS]
    assert missing == []
    spec = gpu_spec(gpu)
    assert spec.num_sms > 100 and spec.hbm_bytes_per_s > 1e12 and spec.bf16_flops_per_s > 3e14


def test_the_datasheet_figures():
    h100, h200, a100, b200 = (gpu_spec(n) for n in ("h100", "h200", "a100", "b200"))
    assert (h100.num_sms, a100.num_sms, b200.num_sms) == (132, 108, 148)
    assert h100.bf16_flops_per_s == h200.bf16_flops_per_s == pytest.approx(989.4e12)
    assert (h100.hbm_bytes_per_s, h200.hbm_bytes_per_s, a100.hbm_bytes_per_s) == (3.35e12, 4.8e12, 2039e9)
    assert b200.bf16_flops_per_s == 2250e12 and b200.fp8_flops_per_s == 4500e12
    assert a100.fp8_flops_per_s == 0
    assert h100.peak_flops_per_s() == 989.4e12 and b200.peak_flops_per_s(torch.float8_e4m3fn) == 4500e12
    assert a100.peak_flops_per_s(torch.float32) == 156e12


def test_no_number_outside_the_table_in_the_model():
    """Float literals in the model's formulas would be constants without a source: only small
    structural numbers (tile sizes, 2 FLOPs per multiply-add, 1e9 ns per s) may appear outside."""
    allowed = {0.0, 0.5, 1.0, 2.0, 2.5, 1e9, 1e-9}
    found = []
    for path in PACKAGE.glob("*.py"):
        if path.name == "constants.py":
            continue
        for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"))):
            if isinstance(node, ast.Constant) and isinstance(node.value, float) and node.value not in allowed:
                found.append(f"{path.name}:{node.lineno} {node.value}")
    assert found == []


def test_unknown_gpu_names_the_valid_ones():
    with pytest.raises(ValueError, match="a100, b200, h100, h200"):
        gpu_spec("v100")
    assert gpu_spec("H100").name == "h100"
