"""Cluster descriptions: presets, YAML/JSON files, and errors that name the file, the key and the choices."""

from __future__ import annotations

import dataclasses
import math

import pytest
import yaml

from prism_megatron.network import PRESETS, CostModel, load_cluster, save_cluster
from prism_megatron.network.cluster import IntraNodeFabric, NetworkFabric
from prism_megatron.replay.schedule import OpKind


def test_presets_cover_the_systems_the_issue_names():
    assert {"dgx-a100", "dgx-h100", "dgx-h200", "gb200-nvl72"} <= set(PRESETS)
    for name, spec in PRESETS.items():
        assert load_cluster(name) is spec
        assert spec.name == name


def test_preset_numbers_are_the_datasheet_line_rates():
    h100 = PRESETS["dgx-h100"]
    assert h100.gpus_per_node == 8
    assert h100.intra_node.nvlink_bandwidth_gb_per_s == 450.0  # 900 GB/s bidirectional
    assert h100.network.nics_per_node == 8 and h100.network.nic_bandwidth_gb_per_s == 50.0  # 400 Gb/s
    assert PRESETS["dgx-a100"].intra_node.nvlink_bandwidth_gb_per_s == 300.0  # 600 GB/s bidirectional
    assert PRESETS["dgx-a100"].network.nic_bandwidth_gb_per_s == 25.0  # 200 Gb/s HDR
    assert not PRESETS["dgx-a100"].intra_node.nvls
    assert PRESETS["gb200-nvl72"].gpus_per_node == 72


@pytest.mark.parametrize("suffix", [".yaml", ".json"])
def test_a_saved_cluster_loads_back_equal(tmp_path, suffix):
    path = tmp_path / f"cluster{suffix}"
    save_cluster(PRESETS["gb200-nvl72"], path, header="from a test")
    assert load_cluster(path) == PRESETS["gb200-nvl72"]


def test_a_file_can_override_a_preset(tmp_path):
    path = tmp_path / "mine.yaml"
    path.write_text(yaml.safe_dump({"base": "dgx-h100", "network": {"nic_efficiency": 0.8}, "name": "mine"}))
    spec = load_cluster(path)
    assert spec.name == "mine"
    assert spec.network.nic_efficiency == 0.8
    assert spec.intra_node == PRESETS["dgx-h100"].intra_node
    slower = CostModel(spec).cost_ns(OpKind.ALL_REDUCE, range(0, 64, 8), 1 << 30)
    assert slower > CostModel(PRESETS["dgx-h100"]).cost_ns(OpKind.ALL_REDUCE, range(0, 64, 8), 1 << 30)


@pytest.mark.parametrize(
    ("content", "message"),
    [
        ({"base": "dgx-h100", "netwrk": {}}, r"unknown key 'netwrk'; valid keys are"),
        ({"base": "dgx-h100", "network": {"nic_speed": 1}}, r"unknown key network.nic_speed; valid keys are"),
        ({"base": "dgx-z"}, r"base 'dgx-z' is not a preset; choose one of dgx-a100"),
        ({"name": "x", "gpus_per_node": 8}, r"missing key\(s\) base_latency_us, intra_node, network"),
        (
            {"base": "dgx-h100", "intra_node": {"nvlink_efficiency": 1.5}},
            r"nvlink_efficiency must be in \(0, 1\]",
        ),
        ({"base": "dgx-h100", "topology": {"kind": "torus"}}, r"topology.kind must be one of"),
        ({"base": "dgx-h100", "schema_version": 7}, r"schema_version 7 is not supported"),
        # a quoted "false" is a truthy string: it must not switch NVLS on
        ({"base": "dgx-h100", "intra_node": {"nvls": "false"}}, r"intra_node.nvls must be true or false"),
        ({"base": "dgx-h100", "intra_node": {"nvswitch": 1}}, r"intra_node.nvswitch must be true or false"),
        ({"base": "dgx-h100", "intra_node": {"nvlink_efficiency": True}}, r"nvlink_efficiency must be in"),
        ({"base": "dgx-h100", "topology": {"num_rails": True}}, r"topology.num_rails must be an integer"),
        ({"base": "dgx-h100", "description": 7}, r"cluster description must be text"),
    ],
)
def test_bad_files_are_rejected_with_the_file_and_the_key(tmp_path, content, message):
    path = tmp_path / "bad.yaml"
    path.write_text(yaml.safe_dump(content))
    with pytest.raises(ValueError, match=message) as info:
        load_cluster(path)
    assert str(path) in str(info.value)


def test_an_unknown_name_lists_the_presets():
    with pytest.raises(
        ValueError,
        match=r"neither a preset \(dgx-a100, dgx-b200, dgx-h100, dgx-h200, gb200-nvl72, or default",
    ):
        load_cluster("dgx-h1000")


def test_the_default_cluster_is_a_dgx_h100():
    assert load_cluster("default") is PRESETS["dgx-h100"]


def test_validation_names_the_field():
    h100 = PRESETS["dgx-h100"]
    with pytest.raises(ValueError, match=r"cluster\.gpus_per_node must be an integer from 1 to 1048576"):
        dataclasses.replace(h100, gpus_per_node=0)
    with pytest.raises(ValueError, match=r"network\.nic_bandwidth_gb_per_s must be a finite number > 0"):
        NetworkFabric(nics_per_node=8, nic_bandwidth_gb_per_s=-1.0, nic_efficiency=0.9, step_latency_us=1.0)
    with pytest.raises(ValueError, match=r"nvls needs intra_node\.nvswitch"):
        IntraNodeFabric(
            nvlink_bandwidth_gb_per_s=1.0,
            nvlink_efficiency=1.0,
            step_latency_us=1.0,
            nvswitch=False,
            nvls=True,
        )


@pytest.mark.parametrize(
    "section, key, value, words",
    [
        ("topology", "oversubscription", math.inf, "topology.oversubscription must be from 1"),
        ("topology", "spine_latency_us", math.inf, "topology.spine_latency_us must be from 0 to 1e+06"),
        ("topology", "nodes_per_leaf", True, "topology.nodes_per_leaf must be an integer"),
        ("network", "nic_bandwidth_gb_per_s", math.nan, "network.nic_bandwidth_gb_per_s must be a finite"),
        (
            "network",
            "step_latency_us",
            10**400,
            "network.step_latency_us must be a finite number > 0 and <= 1e+06",
        ),
        ("intra_node", "nvlink_efficiency", math.inf, "intra_node.nvlink_efficiency must be in (0, 1]"),
        (None, "base_latency_us", True, "cluster.base_latency_us must be a finite number"),
    ],
)
def test_every_number_is_checked_for_type_finiteness_and_range(tmp_path, section, key, value, words):
    """Infinity, NaN, a boolean or a huge integer is refused naming the file and the key, never
    passed on (an infinite oversubscription used to reach the exported network as inf)."""
    path = tmp_path / "c.yaml"
    path.write_text(
        yaml.safe_dump({"base": "dgx-h100", **({section: {key: value}} if section else {key: value})})
    )
    with pytest.raises(ValueError) as info:
        load_cluster(str(path))
    message = str(info.value)
    assert message.startswith(f"{path}: ") and words in message and "\n" not in message
    assert len(message) < 300  # a huge integer is shown shortened


def test_an_unreadable_cluster_file_is_named(tmp_path):
    path = tmp_path / "c.yaml"
    path.write_bytes(b"base: dgx-h100\n\xff\xfe\n")
    with pytest.raises(ValueError, match=rf"{path}: not a readable cluster file \(not UTF-8"):
        load_cluster(str(path))
    path.write_text("base: " + "[" * 100_000)
    with pytest.raises(ValueError, match=rf"{path}: not a readable cluster file"):
        load_cluster(str(path))


def test_the_old_gbps_keys_load_as_gb_per_s_with_a_one_line_warning(tmp_path, capsys):
    path = tmp_path / "old.yaml"
    path.write_text(
        yaml.safe_dump(
            {
                "base": "dgx-h100",
                "intra_node": {"nvlink_bandwidth_gbps": 400.0},
                "network": {"nic_bandwidth_gbps": 25},
            }
        )
    )
    spec = load_cluster(path)
    assert spec.intra_node.nvlink_bandwidth_gb_per_s == 400.0 and spec.network.nic_bandwidth_gb_per_s == 25
    warnings = capsys.readouterr().err.strip().splitlines()
    assert len(warnings) == 2
    assert "intra_node.nvlink_bandwidth_gbps is now intra_node.nvlink_bandwidth_gb_per_s" in warnings[0]
    both = tmp_path / "both.yaml"
    both.write_text(
        yaml.safe_dump(
            {"base": "dgx-h100", "network": {"nic_bandwidth_gbps": 25, "nic_bandwidth_gb_per_s": 50}}
        )
    )
    with pytest.raises(ValueError, match="are the same field; keep only nic_bandwidth_gb_per_s"):
        load_cluster(both)
