"""Each emulated iteration against its schedule replayed with its own compute (passes/replayed.py).

On the synthetic 1F1B job at full scale (W=8192, TP8 PP8) with real ranks 0 and 1024, the first two
pipeline stages: they share the pipeline transfers and the world's grad-norm all-reduce, every
other op has virtual members only. The replay is checked against the simulator itself: with the
simulated spans it must give every real rank's simulated finish.
"""

from __future__ import annotations

import itertools

from prism_megatron.graph import LayoutWorld, NodeType
from prism_megatron.passes.closed_loop import ClosedLoop
from prism_megatron.sim import AlphaBetaCost, PipelineSpec, WhatIf, layout_pipeline_graph
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


def _loop(what_if=None, virtual_rank=1024):
    return ClosedLoop.start(GRAPH, WORLD, COST, virtual_rank=virtual_rank, real_ranks=REAL, what_if=what_if)


def _simulated_spans(loop, virtual_rank):
    return [
        t.end_ns - t.start_ns for t in loop.result.timeline(virtual_rank) if t.op.type == NodeType.COMPUTE
    ]


def _compute_positions(loop, virtual_rank):
    return [p for p, t in enumerate(loop.result.timeline(virtual_rank)) if t.op.type == NodeType.COMPUTE]


def test_with_the_simulated_spans_the_replay_gives_each_real_ranks_simulated_finish():
    # A virtual straggler in the last stage makes the virtual peers arrive late and unevenly.
    for what_if in (None, WhatIf(stragglers={7168: 1.7, 2049: 1.3})):
        loop = _loop(what_if)
        replayed = loop.replayed_ns({rank: _simulated_spans(loop, rank) for rank in REAL})
        assert replayed == {rank: loop.result.finish_ns(rank) for rank in REAL}


def test_a_span_the_virtual_peers_wait_out_costs_nothing_and_one_after_the_last_shared_op_all_of_it():
    loop = _loop()
    spans = {rank: _simulated_spans(loop, rank) for rank in REAL}
    timeline = loop.result.timeline(1024)
    finish = loop.result.finish_ns(1024)
    # The last span follows the rank's last op with others: longer by 1 ms, the rank ends 1 ms later.
    late = {**spans, 1024: [*spans[1024][:-1], spans[1024][-1] + 1_000_000]}
    assert loop.replayed_ns(late)[1024] == finish + 1_000_000
    # A span before an op whose virtual members arrive later than the rank: up to that slack it is
    # absorbed (the schedule does not move its virtual peers within an iteration).
    arrivals = loop.indices[1024].arrivals(loop.result)
    positions = _compute_positions(loop, 1024)
    slack = {q: arrivals[q] - timeline[q].start_ns for q in arrivals}
    # The first span followed (before the next span) by an op whose virtual members arrive > 1 ms
    # after the rank posts it: a recv of gradients from the next stage, in the 1F1B steady state.
    i, slack_ns = next(
        (i, slack[q])
        for i, (p, after) in enumerate(itertools.pairwise(positions))
        for q in range(p + 1, after)
        if slack.get(q, 0) > 1_000_000
    )
    absorbed = list(spans[1024])
    absorbed[i] += slack_ns // 2
    assert loop.replayed_ns({**spans, 1024: absorbed})[1024] == finish
    # The schedule's own simulation of a longer iteration would say nothing else: it is what the
    # iteration ran, the replay is what the iteration should have taken.
    assert loop.finish_ns == finish


def _simulated_job():
    """The loop, each real rank's simulated spans and finish, and rank 0's grad-norm all-reduce (the
    world's, which both real ranks join): its position in rank 0's timeline."""
    loop = _loop()
    spans = {rank: _simulated_spans(loop, rank) for rank in REAL}
    finish = {rank: loop.result.finish_ns(rank) for rank in REAL}
    timeline = loop.result.timeline(0)
    norm = next(
        p for p, t in enumerate(timeline) if t.op.type == NodeType.COLLECTIVE and t.op.group == "world"
    )
    return loop, spans, finish, norm


def test_a_real_rank_waits_in_the_replay_for_the_other_real_rank_it_shares_ops_with():
    loop, spans, finish, norm = _simulated_job()
    # Rank 0 computes its last span before the grad-norm all-reduce 5 ms longer: rank 1024 waits for
    # it there, as it would in the emulation.
    before = max(i for i, p in enumerate(_compute_positions(loop, 0)) if p < norm)
    slow = list(spans[0])
    slow[before] += 5_000_000
    replayed = loop.replayed_ns({**spans, 0: slow})
    assert replayed[0] > finish[0] and replayed[1024] > finish[1024]
    # Replayed alone, rank 1024 keeps the simulated arrival of its real peer.
    assert loop.replayed_ns({1024: spans[1024]}) == {1024: finish[1024]}


def test_each_iteration_is_compared_with_the_ranks_own_simulated_finish_not_the_jobs():
    # A straggler in the last stage finishes after everyone: the job's iteration is its finish.
    loop = _loop(WhatIf(stragglers={7168: 3.0}), virtual_rank=0)
    assert loop.finish_ns == max(t.end_ns for t in loop.result.timeline(0))
    assert loop.finish_ns < loop.iteration_time_ns


def test_an_op_among_real_ranks_costs_in_the_replay_what_they_measured_of_it_in_that_iteration():
    loop, spans, finish, norm = _simulated_job()
    _, keys = loop.real_ops[0]
    key = next(k for k, positions in keys.items() if norm in positions)
    op = loop.result.timeline(0)[norm]
    simulated_ns = op.end_ns - op.ready_ns
    # Both real ranks measured the grad-norm all-reduce (real part through the host) 3 ms above its cost.
    slow = {rank: {key: simulated_ns + 3_000_000} for rank in REAL}
    assert loop.replayed_ns(spans, slow) == {rank: finish[rank] + 3_000_000 for rank in REAL}
    # Below the network model's cost, an op with virtual members keeps that cost (real_op_costs).
    fast = {rank: {key: 1} for rank in REAL}
    assert loop.replayed_ns(spans, fast) == finish
    # A measurement only one of its real members published is not used.
    assert loop.replayed_ns(spans, {0: slow[0]}) == finish


def test_the_expected_time_is_the_median_replay_of_the_window_the_schedule_was_simulated_from():
    loop, spans, finish, norm = _simulated_job()
    # The first schedule, simulated from the capture, has no window: its simulated finish.
    assert loop.expected_ns() == finish
    last = {rank: len(spans[rank]) - 1 for rank in REAL}

    def late(rank, ms):  # the rank's last span, after every op it shares, `ms` longer
        return {**spans, rank: [*spans[rank][: last[rank]], spans[rank][last[rank]] + ms * 1_000_000]}

    # Three iterations: one as simulated, one with rank 0 2 ms late at its end, one with rank 1024
    # 1 ms early there. The median replay of each rank is the one of its three in the middle.
    for compute in (spans, late(0, 2), late(1024, -1)):
        loop.remember(compute)
    expected = loop.expected_ns()
    assert expected == {0: finish[0], 1024: finish[1024]}
    loop.remember(late(0, 3))  # the window keeps the last three: late 2, early 1, late 3 ms
    assert loop.expected_ns() == {0: finish[0] + 2_000_000, 1024: finish[1024]}
    # A moved span that the virtual peers wait out moves nothing; one every later op waits for does,
    # in two of the three iterations: the expected time is above the schedule's simulation.
    slow = list(spans[0])
    before = max(i for i, p in enumerate(_compute_positions(loop, 0)) if p < norm)
    slow[before] += 5_000_000
    for _ in range(2):
        loop.remember({**spans, 0: slow})
    assert loop.expected_ns()[1024] > finish[1024]
    assert loop.expected_ns()[1024] == loop.replayed_ns({**spans, 0: slow})[1024]
