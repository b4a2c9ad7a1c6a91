"""Graphs that cannot run are reported with the ranks and ops involved, never simulated into a hang."""

import pytest

from prism_megatron.graph.printable import parse_op
from prism_megatron.graph.schema import COMPUTE_STREAM, ExecutionGraph, GraphMetadata, RoleGraph
from prism_megatron.graph.world import ExplicitWorld
from prism_megatron.sim.cost import AlphaBetaCost
from prism_megatron.sim.engine import reference_core, simulate
from prism_megatron.sim.faults import DeadlockError, SimulationFault

COST = AlphaBetaCost(latency_ns=10, ns_per_byte=0.1)


def _graph(roles):
    return ExecutionGraph(
        GraphMetadata(layout={}),
        {n: RoleGraph(n, {k: tuple(parse_op(t) for t in v) for k, v in s.items()}) for n, s in roles.items()},
    )


@pytest.mark.parametrize("core", [None, reference_core], ids=["native", "reference"])
def test_a_send_whose_receive_never_comes_is_reported_with_both_ranks(core):
    roles = {"a": {COMPUTE_STREAM: ["c:fwd 1us", "S→pp+1#0 1KiB"]}, "b": {COMPUTE_STREAM: ["c:fwd 1us"]}}
    world = ExplicitWorld(["a", "b"], {"pp": [(0, 1)]})
    with pytest.raises(DeadlockError) as caught:
        simulate(_graph(roles), world, COST, symmetric=False, core=core)
    message = str(caught.value)
    assert "virtual rank 0 compute[1] 'S→pp+1#0 1KiB'" in message
    assert "waits for virtual rank 1, which has no matching RECV #0" in message
    assert caught.value.stuck == [(0, COMPUTE_STREAM, 1, parse_op("S→pp+1#0 1KiB"))]


@pytest.mark.parametrize("core", [None, reference_core], ids=["native", "reference"])
def test_a_collective_missing_on_one_member_names_the_ranks_that_never_arrived(core):
    roles = {
        "a": {COMPUTE_STREAM: ["AR dp#0 1KiB", "AR dp#1 1KiB"]},
        "b": {COMPUTE_STREAM: ["AR dp#0 1KiB"]},  # lost its second all-reduce
    }
    world = ExplicitWorld(["a", "a", "b", "a"], {"dp": [(0, 1, 2, 3)]})
    with pytest.raises(DeadlockError) as caught:
        simulate(_graph(roles), world, COST, core=core)
    message = str(caught.value)
    assert "deadlock: 1 streams" in message  # one role node stands for ranks 0, 1 and 3
    assert "waits on its dp group of 4 ranks at seq 1: 1 never arrived (virtual ranks 2)" in message


def test_a_stream_waiting_on_a_stuck_stream_is_reported_too():
    roles = {
        "a": {COMPUTE_STREAM: ["w <comm:0", "c:opt 1us"], "comm": ["R←pp+1#0 8B"]},
        "b": {COMPUTE_STREAM: ["c:idle 1us"]},
    }
    world = ExplicitWorld(["a", "b"], {"pp": [(0, 1)]})
    with pytest.raises(DeadlockError) as caught:
        simulate(_graph(roles), world, COST)
    assert "compute[0] 'w <comm:0' waits for comm[0]" in str(caught.value)
    assert "comm[0] 'R←pp+1#0 8B' waits for virtual rank 1" in str(caught.value)


@pytest.mark.parametrize("core", [None, reference_core], ids=["native", "reference"])
def test_matched_ops_that_disagree_are_a_mismatch(core):
    roles = {"a": {COMPUTE_STREAM: ["AR tp#0 1KiB"]}, "b": {COMPUTE_STREAM: ["AR tp#0 2KiB"]}}
    world = ExplicitWorld(["a", "b"], {"tp": [(0, 1)]})
    with pytest.raises(SimulationFault, match=r"mismatched ops.*'AR tp#0 1KiB'.*'AR tp#0 2KiB'"):
        simulate(_graph(roles), world, COST, core=core)


def test_an_op_on_a_group_its_rank_lacks_is_named():
    roles = {"a": {COMPUTE_STREAM: ["AR embd#0 1KiB"]}, "b": {COMPUTE_STREAM: ["c:x 1ns"]}}
    world = ExplicitWorld(["a", "b", "a"], {"embd": [(0, 1)]})  # rank 2 is in no embedding group
    with pytest.raises(
        SimulationFault, match=r"virtual rank 2 compute\[0\] 'AR embd#0 1KiB': its rank has no group"
    ):
        simulate(_graph(roles), world, COST, symmetric=False)


def test_p2p_ops_numbered_with_gaps_are_refused_before_simulating():
    roles = {"a": {COMPUTE_STREAM: ["S→pp+1#1 1KiB"]}, "b": {COMPUTE_STREAM: ["R←pp-1#0 1KiB"]}}
    world = ExplicitWorld(["a", "b"], {"pp": [(0, 1)]})
    with pytest.raises(ValueError, match=r"role 'a': SEND ops to pp\+1 have seqs \[1\]"):
        simulate(_graph(roles), world, COST)


def test_a_graph_missing_a_role_of_the_job_is_refused():
    world = ExplicitWorld(["a", "b"], {})
    with pytest.raises(ValueError, match=r"no ops for roles \['b'\]"):
        simulate(_graph({"a": {COMPUTE_STREAM: ["c:x 1ns"]}}), world, COST)
