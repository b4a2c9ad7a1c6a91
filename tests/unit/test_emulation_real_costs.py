"""Ops among real ranks cost what the real ranks measure (emulation/real_costs.py).

On the synthetic 1F1B job at full scale (W=8192, TP8 PP8) with real ranks 0 and 1024, the first two
pipeline stages: their transfers run between two real processes, every other op has virtual members
that no other real rank shares.
"""

from __future__ import annotations

import pytest

from prism_megatron.graph import LayoutWorld, NodeType
from prism_megatron.passes.closed_loop import ClosedLoop
from prism_megatron.passes.real_costs import (
    RealCosts,
    collective_key,
    measured_costs,
    op_keys,
    shared_costs,
    transfer_key,
)
from prism_megatron.replay.events import OpEvent
from prism_megatron.replay.schedule import OpKind
from prism_megatron.sim import AlphaBetaCost, PipelineSpec, layout_pipeline_graph, simulate
from prism_megatron.sim.problem import build_problem
from prism_megatron.topology import Layout

LAYOUT = Layout(world_size=8192, tp=8, pp=8)
WORLD = LayoutWorld(LAYOUT)
SPEC = PipelineSpec(
    num_microbatches=4, fwd_ns=1_000_000, bwd_ns=2_000_000, activation_bytes=1 << 20,
    tp_allreduce_bytes=1 << 20, dp_grad_bytes=64 << 20, optimizer_ns=500_000,
)  # fmt: skip
GRAPH = layout_pipeline_graph(LAYOUT, SPEC)
COST = AlphaBetaCost(latency_ns=5_000, ns_per_byte=0.01)
REAL = (0, 1024)


def _role_ops(virtual_rank):
    problem = build_problem(GRAPH, WORLD, COST)
    return problem.role_ops[int(WORLD.role_ids()[virtual_rank])]


def test_only_the_ops_among_two_real_ranks_have_instance_keys_and_both_sides_name_them_alike():
    keys_0 = op_keys(_role_ops(0), WORLD, 0, REAL)
    keys_1024 = op_keys(_role_ops(1024), WORLD, 1024, REAL)
    # Stage 0 sends 4 activations to stage 1 and receives 4 gradients back; the grad-norm
    # all-reduce spans the world, both real ranks included. The TP and DP ops have one real member.
    transfers = [transfer_key(0, 1024, s) for s in range(4)] + [transfer_key(1024, 0, s) for s in range(4)]
    assert sorted(keys_0) == sorted([*transfers, collective_key(tuple(range(8192)), 0, mixed=True)])
    assert set(keys_1024) == set(keys_0)
    for key, positions in keys_0.items():
        assert len(positions) == 1
        op = _role_ops(0)[positions[0]][2]
        expected = {"p:0>": NodeType.SEND, "p:10": NodeType.RECV, "m:81": NodeType.COLLECTIVE}[key[:4]]
        assert op.type == expected
    assert op_keys(_role_ops(0), WORLD, 0, (0,)) == {}  # one real rank: nothing among real ranks


def _event(kind, group, peer, issue_ns, start_ns, complete_ns, real_done_ns=-1):
    has_virtual = peer not in REAL if peer >= 0 else not set(group) <= set(REAL)
    return OpEvent(
        kind,
        group,
        peer,
        0,
        1 << 20,
        "Float",
        issue_ns,
        start_ns,
        complete_ns,
        True,
        has_virtual,
        real_done_ns,
    )


def test_a_measurement_runs_from_issue_to_completion_or_for_a_mixed_op_to_its_real_part():
    events = [
        _event(OpKind.SEND, (0, 1024), 1024, 1_000, 1_000, 301_000),
        _event(OpKind.SEND, (0, 1024), 1024, 5_000_000, 5_000_000, 5_250_000),
        _event(OpKind.RECV, (0, 1024), 1024, 9_000_000, 9_000_000, 12_000_000),
        _event(OpKind.ALL_REDUCE, tuple(range(8)), -1, 20_000_000, 20_400_000, 20_500_000),  # TP: one real
        # The grad-norm all-reduce has both real ranks and virtual ones: its real part counts (to
        # 25.3 ms), not its completion at the engine's time (25.9 ms)...
        _event(OpKind.ALL_REDUCE, tuple(range(8192)), -1, 25_000_000, 25_000_000, 25_900_000, 25_300_000),
        # ... and without a real part seen (a device op) it is not measured.
        _event(OpKind.ALL_REDUCE, tuple(range(8192)), -1, 26_000_000, 26_000_000, 26_900_000),
        _event(OpKind.SEND, (0, 1), 1, 30_000_000, 30_000_000, 30_100_000),  # virtual peer
    ]
    assert measured_costs(events, 0, REAL) == {
        transfer_key(0, 1024, 0): 300_000,
        transfer_key(0, 1024, 1): 250_000,
        transfer_key(1024, 0, 0): 3_000_000,
        collective_key(tuple(range(8192)), 0, mixed=True): 300_000,
    }
    costs = RealCosts(virtual_rank=0, real_ranks=REAL, window=3)
    for complete_ns in (301_000, 901_000, 401_000, 201_000):  # the first leaves the window of 3
        costs.add([_event(OpKind.SEND, (0, 1024), 1024, 1_000, 1_000, complete_ns)])
    assert costs.current() == {transfer_key(0, 1024, 0): 400_000}


def test_an_instance_costs_the_least_its_real_members_measured_once_all_have():
    holders = {"a": [0, 1024], "b": [0, 1024]}
    published = {0: {"a": 3_000_000, "b": 100}, 1024: {"a": 250_000}}
    assert shared_costs(published, holders) == {"a": 250_000}  # b: rank 1024 has not measured it


def test_the_loop_gives_the_transfers_among_real_ranks_what_they_measured():
    loop = ClosedLoop.start(GRAPH, WORLD, COST, virtual_rank=0, real_ranks=REAL)
    plain = simulate(GRAPH, WORLD, COST)
    measured = {transfer_key(0, 1024, s): 2_000_000 for s in range(4)}
    measured.update({transfer_key(1024, 0, s): 2_000_000 for s in range(4)})
    own = GRAPH.roles["pp0-tp0src"].streams
    assert loop.fold(own, costs={0: measured, 1024: {k: v + 500_000 for k, v in measured.items()}}) is None

    def transfer_costs(result, virtual_rank):
        return [
            t.end_ns - t.ready_ns
            for t in result.timeline(virtual_rank)
            if t.op.type in (NodeType.SEND, NodeType.RECV) and t.op.offset in (1, -7)
        ]

    assert transfer_costs(loop.result, 0) == [2_000_000] * 8  # the least of the two ranks' values
    assert loop.iteration_time_ns > plain.iteration_time_ns
    # Without the other rank's measurements the model's costs stay.
    alone = ClosedLoop.start(GRAPH, WORLD, COST, virtual_rank=0, real_ranks=REAL)
    alone.fold(own, costs={0: measured})
    assert alone.iteration_time_ns == plain.iteration_time_ns


def test_an_op_with_virtual_members_too_costs_at_least_what_the_network_model_says():
    world_op = collective_key(tuple(range(8192)), 0, mixed=True)
    model = ClosedLoop.start(GRAPH, WORLD, COST, virtual_rank=0, real_ranks=REAL)
    position = model.real_ops[0][1][world_op][0]
    model_ns = int(model.base.arrays["op_cost_ns"][model.base.role_base(0) + position])
    own = GRAPH.roles["pp0-tp0src"].streams
    for measured_ns, expected_ns in ((model_ns + 400_000, model_ns + 400_000), (1, model_ns)):
        loop = ClosedLoop.start(GRAPH, WORLD, COST, virtual_rank=0, real_ranks=REAL)
        loop.fold(own, costs={0: {world_op: measured_ns}, 1024: {world_op: measured_ns + 5}})
        grad_norm = [t for t in loop.result.timeline(0) if t.op.group == "world"]
        assert [t.end_ns - t.ready_ns for t in grad_norm] == [expected_ns]


def test_a_cost_for_an_op_that_does_not_communicate_is_refused():
    problem = build_problem(GRAPH, WORLD, COST)
    compute = next(i for i, (_, _, op) in enumerate(problem.role_ops[0]) if op.type == NodeType.COMPUTE)
    role = problem.role_names[0]
    with pytest.raises(ValueError, match=f"role '{role}': op {compute} is not one of its communication ops"):
        problem.with_comm_costs({role: {compute: 5}})
    with pytest.raises(ValueError, match="role 'nope' is not a role of this job"):
        problem.with_comm_costs({"nope": {}})
