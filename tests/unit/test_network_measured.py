"""Costs measured where the job runs (`--prism-cluster` with a file of kind: measured)."""

from __future__ import annotations

import json

import pytest

from prism_megatron.network.measured import MeasuredCost, interpolate, load_measured, monotone
from prism_megatron.passes.closed_loop import network_cost
from prism_megatron.replay import OpKind
from prism_megatron.sim import NetworkCost

TABLE = {
    "schema_version": 1,
    "kind": "measured",
    "name": "loopback",
    "description": "two processes on loopback",
    "costs_us": {
        "ALL_REDUCE/2": [[4, 200.0], [512, 400.0], [4096, 300.0]],
        "ALL_REDUCE/8": [[4, 1000.0], [4096, 3000.0]],
        "SEND/2": [[4, 100.0], [1024, 200.0]],
    },
}


def _write(tmp_path, data, name="costs.json"):
    path = tmp_path / name
    path.write_text(json.dumps(data))
    return str(path)


def test_costs_interpolate_by_size_and_never_fall_with_it():
    points = monotone([(512, 400_000.0), (4, 200_000.0), (4096, 300_000.0)])
    assert points == ((4, 200_000.0), (512, 400_000.0), (4096, 400_000.0))
    assert interpolate(points, 1) == 200_000.0
    assert interpolate(points, 258) == pytest.approx(300_000.0)
    assert interpolate(((4, 10.0), (8, 20.0)), 16) == pytest.approx(40.0)  # the last segment continues


def test_an_op_takes_its_kinds_table_at_the_nearest_group_size(tmp_path):
    cost = load_measured(_write(tmp_path, TABLE))
    assert cost(OpKind.SEND, (0, 1), 4) == 100_000.0
    assert cost(OpKind.RECV, (1, 0), 1024) == 200_000.0  # RECV costs what SEND does
    assert cost(OpKind.ALL_REDUCE, (0, 1), 512) == 400_000.0
    assert cost(OpKind.ALL_REDUCE, tuple(range(4)), 4) == 200_000.0  # 2 is nearer than 8
    assert cost(OpKind.ALL_REDUCE, tuple(range(5)), 4) == 1_000_000.0  # a tie takes the larger
    assert cost(OpKind.ALL_REDUCE, tuple(range(16)), 4096) == 3_000_000.0
    assert cost(OpKind.ALL_GATHER, (0, 1), 4) == 200_000.0  # no table: an all-reduce's
    assert cost(OpKind.ALL_REDUCE, (3,), 4096) == 0.0


def test_the_file_round_trips_and_network_cost_tells_it_from_a_cluster_file(tmp_path):
    path = _write(tmp_path, TABLE)
    cost = network_cost(path)
    assert isinstance(cost, MeasuredCost) and cost.name == "loopback"
    again = load_measured(_write(tmp_path, cost.to_dict(), "again.json"))
    assert again.tables == cost.tables
    yaml_path = tmp_path / "costs.yaml"
    yaml_path.write_text("kind: measured\nschema_version: 1\ncosts_us:\n  SEND/2: [[4, 50]]\n")
    assert network_cost(str(yaml_path))(OpKind.SEND, (0, 1), 4) == 50_000.0
    assert isinstance(network_cost("dgx-h100"), NetworkCost)


@pytest.mark.parametrize(
    ("change", "message"),
    [
        ({"schema_version": 2}, "schema_version 2"),
        ({"extra": 1}, r"unknown keys \['extra'\]"),
        ({"costs_us": {}}, "costs_us must map"),
        ({"costs_us": {"ALLREDUCE/2": [[4, 1]]}}, "key 'ALLREDUCE/2' must read KIND/GROUP_SIZE"),
        ({"costs_us": {"SEND/1": [[4, 1]]}}, "GROUP_SIZE >= 2"),
        ({"costs_us": {"SEND/2": [[4, -1]]}}, r"costs_us.SEND/2 must be a list of \[bytes, microseconds\]"),
        ({"costs_us": {"SEND/2": [4, 1]}}, "must be a list of"),
    ],
)
def test_a_malformed_file_is_refused_naming_the_file_and_the_key(tmp_path, change, message):
    path = _write(tmp_path, TABLE | change)
    with pytest.raises(ValueError, match=message) as info:
        load_measured(path)
    assert path in str(info.value)
