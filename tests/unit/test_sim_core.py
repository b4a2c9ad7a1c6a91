"""The C++ core against its Python reference, on many generated jobs: same arrays, same faults."""

import dataclasses
import random

import numpy as np
import pytest

from prism_megatron.graph.schema import ExecutionGraph, NodeType, Op, RoleGraph
from prism_megatron.graph.world import ExplicitWorld
from prism_megatron.sim import reference
from prism_megatron.sim.cost import AlphaBetaCost
from prism_megatron.sim.engine import native_core
from prism_megatron.sim.problem import build_problem
from prism_megatron.sim.synthetic import PipelineSpec, pipeline_graph
from prism_megatron.sim.whatif import WhatIf


def _random_job(rng: random.Random):
    pp, dp, tp = rng.choice([1, 2, 3, 4]), rng.choice([1, 2, 3]), rng.choice([1, 2])
    vpp = rng.choice([1, 2]) if pp >= 3 else 1
    m = pp * rng.choice([1, 2]) if vpp > 1 else rng.randint(1, 6)
    spec = PipelineSpec(
        num_microbatches=m,
        fwd_ns=rng.randint(0, 5000) * vpp,
        bwd_ns=rng.randint(0, 9000) * vpp,
        vpp=vpp,
        activation_bytes=rng.choice([0, 1000, 1 << 20]),
        tp_allreduce_bytes=rng.choice([0, 4096]),
        dp_grad_bytes=rng.choice([0, 1 << 16]),
        optimizer_ns=rng.randint(0, 3000),
        grad_norm=rng.random() < 0.5,
        expert_ns=rng.choice([0, 0, 3000]),
        all_to_all_bytes=2048,
    )
    # rank = t + tp * (s + pp * d)
    rank = lambda t, s, d: t + tp * (s + pp * d)  # noqa: E731
    world_size = tp * pp * dp
    groups = {
        "tp": [tuple(rank(t, s, d) for t in range(tp)) for d in range(dp) for s in range(pp)],
        "pp": [tuple(rank(t, s, d) for s in range(pp)) for d in range(dp) for t in range(tp)],
        "dp": [tuple(rank(t, s, d) for d in range(dp)) for s in range(pp) for t in range(tp)],
    }
    groups["ep"] = groups["dp"]  # experts sharded across the replicas
    world = ExplicitWorld([f"s{(r // tp) % pp}" for r in range(world_size)], groups)
    graph = pipeline_graph({f"s{s}": s for s in range(pp)}, pp, spec)
    # Make roles differ a little so symmetric and full runs are not trivially alike.
    roles = {}
    for name, role in graph.roles.items():
        jitter = rng.uniform(0.8, 1.2)
        streams = {
            k: tuple(dataclasses.replace(op, duration_ns=int(op.duration_ns * jitter)) for op in ops)
            for k, ops in role.streams.items()
        }
        roles[name] = RoleGraph(name, streams)
    return ExecutionGraph(graph.metadata, roles), world


def _what_if(rng, world_size):
    if rng.random() < 0.4:
        return WhatIf()
    ranks = rng.sample(range(world_size), k=min(2, world_size))
    return WhatIf(
        stragglers={ranks[0]: rng.uniform(0.5, 3.0)},
        slow_nics={ranks[-1]: rng.uniform(1.0, 4.0)},
        expert_slowdowns={ranks[0]: rng.uniform(1.0, 2.0)},
    )


def _both(problem):
    args = (problem.arrays, problem.num_nodes, len(problem.role_names), problem.num_streams)
    return native_core()(*args), reference.run(*args)


@pytest.mark.parametrize("seed", range(24))
def test_native_and_reference_cores_agree_on_generated_jobs(seed):
    rng = random.Random(seed)
    graph, world = _random_job(rng)
    what_if = _what_if(rng, world.world_size)
    cost = AlphaBetaCost(latency_ns=rng.uniform(0, 2000), ns_per_byte=rng.uniform(0, 0.05))
    problem = build_problem(graph, world, cost, what_if)
    native, python = _both(problem)
    assert native["fault"][0] == "" and native["stuck"] == []
    assert native["makespan_ns"] == python["makespan_ns"]
    for key in ("node_op_base", "timeline"):
        assert np.array_equal(native[key], python[key]), key
    start, ready, end = native["timeline"].T
    assert (end >= ready).all() and (ready >= start).all() and (start >= 0).all()


def _renumber(streams, world):
    """Sequence numbers 0..n-1 again after an op was dropped, as a capture that missed it would write."""
    counters = {}
    out = {}
    for name, ops in streams.items():
        renumbered = []
        for op in ops:
            if op.type != NodeType.COMPUTE and op.type != NodeType.WAIT:
                key = (op.type, op.group, op.offset % world.group_size(op.group) if op.offset else 0)
                key = ("coll", op.group) if op.type == NodeType.COLLECTIVE else key
                op = dataclasses.replace(op, seq=counters.setdefault(key, 0))
                counters[key] += 1
            renumbered.append(op)
        out[name] = tuple(renumbered)
    return out


@pytest.mark.parametrize("seed", range(12))
def test_native_and_reference_cores_find_the_same_stuck_ops(seed):
    rng = random.Random(1000 + seed)
    graph, world = _random_job(rng)
    victim = rng.choice(sorted(graph.roles))
    streams = dict(graph.roles[victim].streams)
    name = rng.choice([k for k, ops in streams.items() if ops])
    ops = list(streams[name])
    # Lose one op (a no-op takes its place, so dependency indices stay valid): its partners then
    # wait forever or meet the wrong op.
    ops[rng.randrange(len(ops))] = Op(type=NodeType.COMPUTE, name="lost")
    streams[name] = tuple(ops)
    damaged = ExecutionGraph(
        graph.metadata, {**graph.roles, victim: RoleGraph(victim, _renumber(streams, world))}
    )
    problem = build_problem(damaged, world, AlphaBetaCost(latency_ns=5), symmetric=False)
    native, python = _both(problem)
    assert native["fault"] == python["fault"]
    assert sorted(native["stuck"]) == sorted(python["stuck"])
    assert np.array_equal(native["timeline"], python["timeline"])
