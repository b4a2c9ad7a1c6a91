"""The collective cost model: hand-computed ring and tree costs, placement, and the properties any
network model must have (monotonic in size, a group inside a node never slower than across nodes)."""

from __future__ import annotations

import time

import pytest

from prism_megatron.network import PRESETS, ClusterSpec, CostModel, IntraNodeFabric, NetworkFabric, Topology
from prism_megatron.network.placement import GroupShape, group_shape, nccl_tests_members
from prism_megatron.replay import schedule
from prism_megatron.replay.schedule import OpKind

# A toy cluster with round numbers so that the expected costs can be computed by hand. Its latencies
# are the Simple-protocol references of NCCL's model: base 8.4 us (= 6.6 * 8.4 / 6.6), NVLink step
# 3.4 us, network step 14 us.
TOY = ClusterSpec(
    name="toy",
    gpus_per_node=4,
    base_latency_us=6.6,
    intra_node=IntraNodeFabric(nvlink_bandwidth_gb_per_s=100.0, nvlink_efficiency=1.0, step_latency_us=3.4),
    network=NetworkFabric(
        nics_per_node=4, nic_bandwidth_gb_per_s=10.0, nic_efficiency=1.0, step_latency_us=14.0
    ),
    topology=Topology(nodes_per_leaf=2, spine_latency_us=0.5),
)


def line(model: CostModel, kind: OpKind, members, name: str) -> schedule.CostLine:
    return dict(model.named_lines(kind, members))[name]


def test_ring_all_reduce_inside_one_node_matches_the_hand_computed_cost():
    model = CostModel(TOY)
    simple = line(model, OpKind.ALL_REDUCE, [0, 1, 2, 3], "ring/simple")
    # 2(n-1) = 6 NVLink steps of 3.4 us after 8.4 us of base; each GPU sends 2(n-1)/n = 1.5 bytes per
    # byte of buffer over 100 GB/s (= 100 bytes/ns).
    assert simple.latency_ns == pytest.approx(8400 + 6 * 3400)
    assert simple.ns_per_byte == pytest.approx(1.5 / 100)
    ll = line(model, OpKind.ALL_REDUCE, [0, 1, 2, 3], "ring/ll")
    assert ll.latency_ns == pytest.approx(6600 + 6 * 600)  # LL: 0.6 us per NVLink step
    assert ll.ns_per_byte == pytest.approx(1.5 / 100 / 0.5)  # half of each LL line is flags


def test_ring_all_reduce_across_two_nodes_is_paced_by_the_nics():
    model = CostModel(TOY)
    members = list(range(8))  # nodes 0 and 1, 4 GPUs each
    simple = line(model, OpKind.ALL_REDUCE, members, "ring/simple")
    # 14 steps, 2 of them between nodes. A node's 4 NICs carry 2(n-1)/n = 1.75 S at 4 x 10 GB/s.
    assert simple.latency_ns == pytest.approx(8400 + 12 * 3400 + 2 * 14000)
    assert simple.ns_per_byte == pytest.approx(1.75 / 40)


def test_tree_all_reduce_on_two_nodes_matches_the_hand_computed_cost_and_beats_the_ring():
    model = CostModel(TOY)
    members = list(range(8))
    tree = line(model, OpKind.ALL_REDUCE, members, "tree/simple")
    # Chain of 3 NVLink hops and 1 network hop, up and down.
    assert tree.latency_ns == pytest.approx(8400 + 2 * (3 * 3400 + 1 * 14000))
    # Per node 2(N-1)/N S = S over 40 GB/s, at NCCL's tree efficiency 0.92 (NVLink: 2 S / 100 is faster).
    assert tree.ns_per_byte == pytest.approx(1.0 / 40 / 0.92)
    ring = line(model, OpKind.ALL_REDUCE, members, "ring/simple")
    assert tree.ns_per_byte < ring.ns_per_byte  # why NCCL picks the tree on two nodes


def test_all_gather_takes_the_gathered_output_bytes_like_nccl_tests_and_the_backend():
    model = CostModel(TOY)
    members = [0, 1, 2, 3]
    simple = line(model, OpKind.ALL_GATHER, members, "ring/simple")
    # Ring: each GPU sends (n-1)/n of the gathered output over 100 GB/s.
    assert simple.ns_per_byte == pytest.approx(0.75 / 100)
    assert simple.latency_ns == pytest.approx(8400 + 3 * 3400)
    output_bytes = 4 << 20  # the nccl-tests size column of all_gather_perf is the output
    assert model.nccl_tests_time_ns(OpKind.ALL_GATHER, 4, output_bytes) == pytest.approx(
        model.cost_ns(OpKind.ALL_GATHER, members, output_bytes)
    )


def test_gather_moves_each_members_share_of_the_whole_to_the_root():
    model = CostModel(TOY)
    # 8 members on 2 nodes: the root receives 3/8 of S over NVLink and 4/8 through its NIC.
    gather = line(model, OpKind.GATHER, list(range(8)), "p2p/simple")
    assert gather.ns_per_byte == pytest.approx(max(3 / 8 / 100, 4 / 8 / 10))


def test_send_between_nodes_on_different_rails_pays_the_spine():
    model = CostModel(TOY)
    same_rail = line(model, OpKind.SEND, [1, 5], "p2p/simple")
    other_rail = line(model, OpKind.SEND, [1, 6], "p2p/simple")
    assert same_rail.latency_ns == pytest.approx(8400 + 14000)
    assert other_rail.latency_ns == pytest.approx(8400 + 14000 + 500)
    assert same_rail.ns_per_byte == pytest.approx(1 / 10)  # one NIC per GPU


def test_cost_is_the_cheapest_line_and_protocols_take_turns_by_size():
    model = CostModel(TOY)
    members = [0, 1, 2, 3]
    names = dict(model.named_lines(OpKind.ALL_REDUCE, members))

    def cheapest(size_bytes):
        return min(names, key=lambda n: names[n].latency_ns + names[n].ns_per_byte * size_bytes)

    assert cheapest(8) == "ring/ll"
    assert cheapest(1 << 30) == "ring/simple"
    assert model.cost_ns(OpKind.ALL_REDUCE, members, 1 << 20) == schedule.cost_ns(
        model.cost_lines(OpKind.ALL_REDUCE, members), 1 << 20
    )


def test_group_shapes_follow_contiguous_placement():
    spec = PRESETS["dgx-h100"]
    assert group_shape(spec, range(8)) == GroupShape(8, 1, 8, 8, False)
    # A data-parallel group of TP=8: one GPU per node, same rail, 16 nodes under one leaf group.
    assert group_shape(spec, range(3, 16 * 8, 8)) == GroupShape(16, 16, 1, 1, False)
    # 64 nodes are more than the 32 of a scalable unit: the group crosses a spine.
    assert group_shape(spec, range(0, 64 * 8, 8)).crosses_spine
    # Two nodes on different rails (local GPUs 0 and 4) meet at a spine.
    assert group_shape(spec, [0, 12]).crosses_spine
    with pytest.raises(ValueError, match="distinct"):
        group_shape(spec, [1, 1])


def test_nccl_tests_members_fill_nodes_in_order():
    spec = PRESETS["dgx-h100"]
    assert nccl_tests_members(spec, 16) == list(range(16))
    assert nccl_tests_members(spec, 2, gpus_per_node=1) == [0, 8]
    with pytest.raises(ValueError, match=r"gpus_per_node must be in 1\.\.8"):
        nccl_tests_members(spec, 16, gpus_per_node=9)


SIZES = [0, 1, 8, 1000, 1 << 16, 1 << 20, 3 << 22, 1 << 27, 1 << 30, 1 << 33]
KINDS = [OpKind.ALL_REDUCE, OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER, OpKind.ALL_TO_ALL, OpKind.BROADCAST]


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("kind", KINDS)
def test_cost_never_decreases_with_size(preset, kind):
    model = CostModel(PRESETS[preset])
    gpn = model.spec.gpus_per_node
    for members in (range(8), range(0, 8 * gpn, gpn), range(2 * gpn)):
        costs = [model.cost_ns(kind, list(members), size) for size in SIZES]
        assert costs == sorted(costs), (preset, kind, list(members)[:4])


@pytest.mark.parametrize("preset", sorted(PRESETS))
@pytest.mark.parametrize("kind", [*KINDS, OpKind.SEND])
def test_a_group_inside_one_node_is_never_slower_than_the_same_group_across_nodes(preset, kind):
    model = CostModel(PRESETS[preset])
    gpn = model.spec.gpus_per_node
    n = 2 if kind == OpKind.SEND else 8
    inside = list(range(n))
    spread_out = [node * gpn for node in range(n)]
    half_and_half = [node * gpn + local for node in range(2) for local in range(n // 2)]
    for size in SIZES:
        fast = model.cost_ns(kind, inside, size)
        assert fast <= model.cost_ns(kind, spread_out, size), size
        assert fast <= model.cost_ns(kind, half_and_half, size), size


def test_a_group_of_one_costs_nothing():
    model = CostModel(PRESETS["dgx-h100"])
    assert model.cost_ns(OpKind.ALL_REDUCE, [5], 1 << 20) == 0.0


def test_send_needs_a_sender_and_a_receiver():
    with pytest.raises(ValueError, match="SEND cost needs members"):
        CostModel(TOY).cost_lines(OpKind.SEND, [0, 1, 2])


def test_lines_are_cached_per_shape_so_a_full_scale_job_is_cheap():
    model = CostModel(PRESETS["dgx-h100"])
    world, tp = 8192, 8
    start = time.perf_counter()
    tp_lines = {model.cost_lines(OpKind.ALL_REDUCE, range(g * tp, (g + 1) * tp)) for g in range(world // tp)}
    dp_lines = {model.cost_lines(OpKind.REDUCE_SCATTER, range(local, world, tp)) for local in range(tp)}
    elapsed_s = time.perf_counter() - start
    assert len(tp_lines) == 1 and len(dp_lines) == 1  # one shape each
    assert elapsed_s < 2.0


def test_bus_bandwidth_follows_the_nccl_tests_definition():
    model = CostModel(TOY)
    size = 1 << 30
    time_ns = model.nccl_tests_time_ns(OpKind.ALL_REDUCE, 4, size)
    assert model.bus_bandwidth_gb_per_s(OpKind.ALL_REDUCE, 4, size) == pytest.approx(
        size / time_ns * 2 * 3 / 4
    )
    # At large sizes the ring's bus bandwidth approaches the NVLink rate.
    assert model.bus_bandwidth_gb_per_s(OpKind.ALL_REDUCE, 4, 1 << 36, algorithm="ring") == pytest.approx(
        100, rel=1e-3
    )
    with pytest.raises(ValueError, match="candidates: ring/ll"):
        model.bus_bandwidth_gb_per_s(OpKind.ALL_REDUCE, 4, size, algorithm="nvls")
