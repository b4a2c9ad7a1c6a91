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
        ({"costs_us": {"SEND/1": [[4, 1]]}}, "GROUP_SIZE from 2 to 1048576"),
        ({"costs_us": {"SEND/4294967296": [[4, 1]]}}, "GROUP_SIZE from 2 to 1048576"),
        ({"costs_us": {"SEND/2": [[True, 5]]}}, r"numbers \(not true/false\).*got \[True, 5\]"),
        ({"costs_us": {"SEND/2": [[4, float("inf")]]}}, r"microseconds 0\.\.1e\+09; got \[4, inf\]"),
        ({"costs_us": {"SEND/2": [[4, float("nan")]]}}, r"got \[4, nan\]"),
        ({"costs_us": {"SEND/2": [[10**400, 1]]}}, "bytes 0..1125899906842624"),
        ({"costs_us": {"SEND/2": [[4, -1]]}}, r"costs_us.SEND/2 must be a list of \[bytes, microseconds\]"),
        ({"costs_us": {"SEND/2": [4, 1]}}, "must be a list of"),
    ],
)
def test_a_malformed_file_is_refused_naming_the_file_and_the_key(tmp_path, change, message):
    path = _write(tmp_path, TABLE | change)
    with pytest.raises(ValueError, match=message) as info:
        load_measured(path)
    assert path in str(info.value)


BATCHES = {"2": [[4, 300.0], [1024, 500.0]], "4": [[4, 450.0], [1024, 800.0]]}


def test_a_two_peer_batch_takes_its_op_counts_table_and_survives_the_file(tmp_path):
    cost = load_measured(_write(tmp_path, {**TABLE, "batches_us": BATCHES}))
    assert cost.batch_cost(2, 4) == 300_000.0
    assert cost.batch_cost(4, 1024) == 800_000.0
    assert cost.batch_cost(3, 4) == 450_000.0  # a tie takes the larger
    assert load_measured(_write(tmp_path, cost.to_dict(), "again.json")) == cost
    assert load_measured(_write(tmp_path, TABLE, "none.json")).batch_cost(2, 4) is None


@pytest.mark.parametrize(
    ("batches", "message"),
    [({"1": [[4, 1.0]]}, "op count >= 2"), ({"two": [[4, 1.0]]}, "op count >= 2"), ([1], "must map")],
)
def test_a_bad_batch_table_is_refused_naming_the_key(tmp_path, batches, message):
    with pytest.raises(ValueError, match=message):
        load_measured(_write(tmp_path, {**TABLE, "batches_us": batches}))


def _interleaved_exchange_graph():
    """Three stages in a ring (the interleaved schedule's wrap-around), each posting one batch:
    a send to the next stage and a receive from the previous, then 1 ms of compute."""
    from prism_megatron.graph import (
        COMPUTE_STREAM,
        ExecutionGraph,
        GraphMetadata,
        LayoutWorld,
        NodeType,
        Op,
        RoleGraph,
    )
    from prism_megatron.topology import Layout

    layout = Layout(world_size=3, tp=1, pp=3)
    world = LayoutWorld(layout)
    ops = (
        Op(type=NodeType.SEND, group="pp", offset=1, seq=0, size_bytes=1024, coalesced=True),
        Op(type=NodeType.RECV, group="pp", offset=-1, seq=0, size_bytes=1024),
        Op(type=NodeType.COMPUTE, name="fwd", duration_ns=1_000_000),
    )
    roles = {name: RoleGraph(name, {COMPUTE_STREAM: ops}) for name in world.roles()}
    return ExecutionGraph(GraphMetadata(layout=layout.kwargs()), roles), world


def test_a_batch_with_two_peers_costs_what_the_batch_calibration_says():
    from prism_megatron.sim import simulate

    graph, world = _interleaved_exchange_graph()
    alone = MeasuredCost({(OpKind.SEND, 2): ((4, 100_000.0), (1024, 200_000.0))})
    batched = MeasuredCost(alone.tables, batches={2: ((4, 300_000.0), (1024, 500_000.0))})
    assert simulate(graph, world, alone, symmetric=False).iteration_time_ns == 200_000 + 1_000_000
    result = simulate(graph, world, batched, symmetric=False)
    assert result.iteration_time_ns == 500_000 + 1_000_000
    assert [t.end_ns - t.ready_ns for t in result.timeline(1)[:2]] == [500_000, 500_000]
