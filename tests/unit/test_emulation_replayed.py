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


def _late(spans, rank, ms):
    """`spans` with the rank's last span, after every op it shares, `ms` longer."""
    return {**spans, rank: [*spans[rank][:-1], spans[rank][-1] + ms * 1_000_000]}


def test_the_expected_time_is_the_median_replay_of_the_window_the_schedule_was_simulated_from():
    loop, spans, finish, norm = _simulated_job()
    # The first schedule, simulated from the capture, has no window: its simulated finish. Judging
    # an iteration gives the expected time from before it: rank 0 running 2 ms late at its end moves
    # its replay, not the expected time it is compared with.
    expected, replayed = loop.judge(_late(spans, 0, 2), _late(spans, 0, 2))
    assert expected == finish and replayed == {0: finish[0] + 2_000_000, 1024: finish[1024]}
    assert loop.expected_ns() == {0: finish[0] + 2_000_000, 1024: finish[1024]}  # now in the window
    # Three iterations in the window: rank 0 2 ms late, rank 1024 1 ms early, as simulated. Each
    # rank's expected finish is the middle one of its three replays.
    loop.judge(_late(spans, 1024, -1), _late(spans, 1024, -1))
    assert loop.expected_ns() == {0: finish[0] + 2_000_000, 1024: finish[1024]}  # the larger middle one
    loop.judge(spans, spans)
    assert loop.expected_ns() == finish
    loop.judge(_late(spans, 0, 3), _late(spans, 0, 3))  # the window keeps the last three
    assert loop.expected_ns() == {0: finish[0], 1024: finish[1024]}
    loop.judge(_late(spans, 0, 4), _late(spans, 0, 4))  # early 1, as simulated, late 3 and 4 ms
    assert loop.expected_ns() == {0: finish[0] + 3_000_000, 1024: finish[1024]}
    # A span rank 0 runs 5 ms longer before the grad-norm all-reduce, which both real ranks join,
    # delays rank 1024 too: in two iterations of three, the expected time is that replay's.
    before = max(i for i, p in enumerate(_compute_positions(loop, 0)) if p < norm)
    slow = {**spans, 0: [v + 5_000_000 if i == before else v for i, v in enumerate(spans[0])]}
    for _ in range(2):
        loop.judge(slow, slow)
    assert loop.expected_ns() == loop.replayed_ns(slow) and loop.expected_ns()[1024] > finish[1024]


def test_the_window_keeps_the_spans_as_folded_and_the_costs_measured_and_a_gap_stops_the_expected_time():
    loop, spans, finish, norm = _simulated_job()
    # A span that ended in a wait the schedule decided is measured long but folded at its assumed
    # value: the replay takes the measurement, the window the folded spans.
    _, replayed = loop.judge(_late(spans, 0, 2), spans)
    assert replayed[0] == finish[0] + 2_000_000 and loop.expected_ns() == finish
    # The costs the real ranks measured of the grad-norm all-reduce stay with their iteration.
    _, keys = loop.real_ops[0]
    key = next(k for k, positions in keys.items() if norm in positions)
    op = loop.result.timeline(0)[norm]
    slow = {rank: {key: op.end_ns - op.ready_ns + 3_000_000} for rank in REAL}
    for _ in range(2):
        loop.judge(spans, spans, slow)
    assert loop.expected_ns() == {rank: finish[rank] + 3_000_000 for rank in REAL}
    # An iteration a real rank ran otherwise than the graph: no replay, and no expected time while
    # it is in the window (three more iterations).
    expected, replayed = loop.judge(None, None)
    assert expected == {rank: finish[rank] + 3_000_000 for rank in REAL} and replayed is None
    expected, replayed = loop.judge(spans, spans)
    assert expected is None and replayed == finish
    for _ in range(2):
        assert loop.judge(spans, spans)[0] is None
    assert loop.expected_ns() == finish
    # `fold` measures one rank alone: it leaves a gap too.
    loop.fold(loop.graph_streams)
    assert loop.expected_ns() is None
