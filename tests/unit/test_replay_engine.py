"""The replay engine decides when an op with virtual members completes; the backend waits until then.

Completion = max(issue, the virtual members' latest arrival) + cost. Lower bounds are exact (an op
never completes early); upper bounds are loose because a shared 2-core machine can preempt any
thread for milliseconds (benchmarks/backend measures the precision).
"""

from __future__ import annotations

import threading
import time

import pytest
import torch
import torch.distributed as dist

from prism_megatron import backend, replay
from prism_megatron.replay import (
    CostLine,
    LatencyBandwidthCost,
    OpKind,
    ReplaySchedule,
    ScheduledOp,
    timeline,
)

WORLD = 1024
SELF = 3
TP = tuple(range(8))
MS = 1_000_000
SLACK_NS = 40 * MS  # preemption on a busy 2-core machine


def iteration_start_ns() -> int:
    """Start an iteration; its start on the host clock (marks on the host are the host clock)."""
    return timeline.resolve_one(replay.mark_iteration_start())


@pytest.fixture
def activate():
    def start(**kwargs):
        kwargs.setdefault("world_size", WORLD)
        kwargs.setdefault("virtual_rank", SELF)
        kwargs.setdefault("real_ranks", [SELF])
        return backend.activate(**kwargs)

    yield start
    backend.deactivate()


def timed_all_reduce(group, *, size=4):
    """Issue an async all-reduce; return (issue ns, completion ns seen by wait, work)."""
    t = torch.ones(size)
    issued = time.monotonic_ns()
    work = dist.all_reduce(t, group=group, async_op=True)
    work.wait()
    return issued, time.monotonic_ns(), work


def test_instant_mode_without_costs_completes_at_once(activate):
    activate()
    issued, done, _ = timed_all_reduce(dist.new_group(list(TP)))
    assert done - issued < SLACK_NS


def test_default_cost_delays_ops_with_virtual_members_but_not_all_real_ones(activate):
    activate(default_cost=(CostLine(latency_ns=30 * MS, ns_per_byte=0.0),))
    issued, done, _ = timed_all_reduce(dist.new_group(list(TP)))
    assert 30 * MS <= done - issued < 30 * MS + SLACK_NS
    alone = dist.new_group([SELF])  # every member real: no virtual peer to wait for
    issued, done, _ = timed_all_reduce(alone)
    assert done - issued < 30 * MS


def test_group_cost_lines_take_the_cheapest_line_and_override_the_default(activate):
    activate(default_cost=(CostLine(latency_ns=500 * MS, ns_per_byte=0.0),))
    lines = (CostLine(latency_ns=20 * MS, ns_per_byte=0.0), CostLine(latency_ns=1 * MS, ns_per_byte=1000.0))
    replay.set_group_cost(TP, OpKind.ALL_REDUCE, lines)
    group = dist.new_group(list(TP))
    assert replay.group_cost_ns(TP, OpKind.ALL_REDUCE, 16) == 1 * MS + 16_000  # 4 floats: line 2
    assert replay.group_cost_ns(TP, OpKind.ALL_REDUCE, 40_000) == 20 * MS  # large: line 1
    issued, done, _ = timed_all_reduce(group, size=10_000)
    assert 20 * MS <= done - issued < 20 * MS + SLACK_NS


def test_a_cost_model_supplies_lines_for_each_group_it_creates(activate):
    model = LatencyBandwidthCost(latency_us=2.0, bandwidth_gb_per_s=10.0)
    activate(cost_model=model)
    dist.new_group(list(TP))
    for kind in (OpKind.ALL_REDUCE, OpKind.ALL_GATHER, OpKind.BROADCAST):
        expected = replay.cost_ns(model.cost_lines(kind, TP), 1 << 20)
        assert replay.group_cost_ns(TP, kind, 1 << 20) == pytest.approx(expected, abs=1)


def test_replay_mode_completes_at_the_scheduled_arrival_plus_cost(activate):
    activate(mode="replay")
    group = dist.new_group(list(TP))
    schedule = ReplaySchedule(
        virtual_rank=SELF,
        collectives={
            TP: (
                ScheduledOp(OpKind.ALL_REDUCE, 16, arrival_offset_ns=40 * MS, cost_ns=10 * MS),
                ScheduledOp(OpKind.ALL_REDUCE, 16, arrival_offset_ns=0, cost_ns=5 * MS),
            )
        },
        p2p={},
    )
    replay.load_schedule(schedule)
    for _ in range(2):  # the schedule repeats every iteration
        start = iteration_start_ns()
        _, first_done, _ = timed_all_reduce(group)
        assert 50 * MS <= first_done - start < 50 * MS + SLACK_NS
        issued, second_done, _ = timed_all_reduce(group)  # peers long arrived: issue + cost
        assert 5 * MS <= second_done - issued < 5 * MS + SLACK_NS
        issued, third_done, _ = timed_all_reduce(group)  # beyond the schedule: at once
        assert third_done - issued < SLACK_NS


def test_an_op_that_differs_from_the_schedule_raises_from_wait(activate):
    activate(mode="replay")
    group = dist.new_group(list(TP))
    replay.load_schedule(
        ReplaySchedule(
            virtual_rank=SELF, collectives={TP: (ScheduledOp(OpKind.BROADCAST, 16, 0, 0),)}, p2p={}
        )
    )
    replay.mark_iteration_start()
    work = dist.all_reduce(torch.ones(4), group=group, async_op=True)
    with pytest.raises(dist.DistBackendError, match="diverged from the replay schedule at op 0"):
        work.wait()
    replay.mark_iteration_start()
    with pytest.raises(dist.DistBackendError, match="BROADCAST of 16 bytes, the program issued ALL_REDUCE"):
        dist.all_reduce(torch.ones(4), group=group, async_op=True).get_future().wait()


def test_an_all_gather_of_another_size_than_scheduled_follows_the_schedule_an_all_reduce_does_not(activate):
    # MoE dispatch gathers what the router chose: the graph holds such a collective's median size.
    activate(mode="replay")
    group = dist.new_group(list(TP))
    scheduled = (ScheduledOp(OpKind.ALL_GATHER, 16, 0, 0), ScheduledOp(OpKind.ALL_REDUCE, 16, 0, 0))
    replay.load_schedule(ReplaySchedule(virtual_rank=SELF, collectives={TP: scheduled}, p2p={}))
    replay.mark_iteration_start()
    out = torch.empty(64 * len(TP))
    dist.all_gather_into_tensor(out, torch.ones(64), group=group, async_op=True).wait()  # not 16 bytes
    with pytest.raises(
        dist.DistBackendError, match="ALL_REDUCE of 16 bytes, the program issued ALL_REDUCE of 256"
    ):
        dist.all_reduce(torch.ones(64), group=group, async_op=True).wait()


def test_a_virtual_peer_arriving_after_the_timeout_raises_instead_of_waiting(activate):
    activate(mode="replay", timeout_s=0.2)
    group = dist.new_group(list(TP))
    replay.load_schedule(
        ReplaySchedule(
            virtual_rank=SELF,
            collectives={TP: (ScheduledOp(OpKind.ALL_REDUCE, 16, 3600 * 10**9, 0),)},
            p2p={},
        )
    )
    replay.mark_iteration_start()
    start = time.monotonic()
    with pytest.raises(dist.DistBackendError, match=r"timeout: ALL_REDUCE seq 0 on group .* within 0\.200 s"):
        dist.all_reduce(torch.ones(4), group=group)
    assert time.monotonic() - start < 5.0


def test_p2p_completion_follows_the_p2p_schedule_per_peer_and_direction(activate):
    activate(mode="replay")
    replay.load_schedule(
        ReplaySchedule(
            virtual_rank=SELF,
            collectives={},
            p2p={(4, "recv"): (ScheduledOp(OpKind.RECV, 64, 20 * MS, 1 * MS),)},
        )
    )
    start = iteration_start_ns()
    assert replay.p2p_completion_ns(4, "recv", 64) == start + 21 * MS
    issued = time.monotonic_ns()
    assert issued <= replay.p2p_completion_ns(4, "recv", 64) <= time.monotonic_ns()  # unscheduled: now
    start = iteration_start_ns()
    assert replay.p2p_completion_ns(4, "recv", 64) == start + 21 * MS
    with pytest.raises(ValueError, match="direction must be one of"):
        replay.p2p_completion_ns(4, "sideways", 64)


def test_backend_recv_from_a_virtual_peer_waits_for_the_scheduled_send(activate):
    activate(mode="replay")
    replay.load_schedule(
        ReplaySchedule(
            virtual_rank=SELF, collectives={}, p2p={(2, "recv"): (ScheduledOp(OpKind.RECV, 16, 25 * MS, 0),)}
        )
    )
    start = iteration_start_ns()
    dist.recv(torch.empty(4), src=2)
    assert 25 * MS <= time.monotonic_ns() - start < 25 * MS + SLACK_NS


def test_is_completed_and_the_future_follow_the_completion_time(activate):
    activate(default_cost=(CostLine(latency_ns=60 * MS, ns_per_byte=0.0),))
    group = dist.new_group(list(TP))
    t = torch.ones(2)
    issued = time.monotonic_ns()
    work = dist.all_reduce(t, group=group, async_op=True)
    assert not work.is_completed()
    value = work.get_future().wait()
    assert time.monotonic_ns() - issued >= 60 * MS
    assert work.is_completed() and work.is_success()
    assert torch.equal(value[0], torch.full((2,), 8.0))


def test_waiting_releases_the_gil(activate):
    activate(default_cost=(CostLine(latency_ns=150 * MS, ns_per_byte=0.0),))
    group = dist.new_group(list(TP))
    ticks = 0
    stop = threading.Event()

    def count():
        nonlocal ticks
        while not stop.is_set():
            ticks += 1
            time.sleep(0.001)

    thread = threading.Thread(target=count)
    thread.start()
    dist.all_reduce(torch.ones(2), group=group)
    stop.set()
    thread.join()
    assert ticks >= 20  # the other thread ran during most of the 150 ms wait


def test_recording_exports_every_op_and_the_interceptors_p2p_events(activate):
    activate(default_cost=(CostLine(latency_ns=1 * MS, ns_per_byte=0.0),))
    group = dist.new_group(list(TP))
    replay.start_recording()
    dist.all_reduce(torch.ones(4, dtype=torch.bfloat16), group=group)
    # torch 2.11 (the GPU machine's) predates the all_gather_single name; both issue one all-gather.
    all_gather_single = getattr(dist, "all_gather_single", None) or dist.all_gather_into_tensor
    pending = all_gather_single(torch.empty(16), torch.ones(2), group=group, async_op=True)
    now = time.monotonic_ns()
    replay.record_p2p(
        kind=OpKind.SEND,
        self_rank=SELF,
        peer=4,
        size_bytes=128,
        dtype="Float",
        issue=timeline.mark_at(now),
        complete=timeline.mark_at(now + 5),
    )
    replay.record_p2p(
        kind=OpKind.SEND,
        self_rank=SELF,
        peer=4,
        size_bytes=128,
        dtype="Float",
        issue=timeline.mark_at(now),
        complete=None,
    )
    events = replay.stop_recording()
    pending.wait()
    reduce, gather, send0, send1 = events
    assert (reduce.kind, reduce.group, reduce.seq, reduce.size_bytes, reduce.dtype) == (
        OpKind.ALL_REDUCE,
        TP,
        0,
        8,
        "BFloat16",
    )
    assert reduce.complete_ns >= reduce.start_ns + 1 * MS and not reduce.async_op
    assert (gather.kind, gather.seq, gather.size_bytes, gather.async_op) == (OpKind.ALL_GATHER, 1, 64, True)
    assert gather.complete_ns == -1  # not waited when recording stopped
    assert (send0.group, send0.peer, send0.seq, send1.seq) == ((SELF, 4), 4, 0, 1)
    assert send0.complete_ns == now + 5 and send1.complete_ns == -1
    assert replay.stop_recording() == []


def test_wait_until_ns_returns_at_the_deadline():
    deadline = time.monotonic_ns() + 20 * MS
    replay.wait_until_ns(deadline)
    assert 0 <= time.monotonic_ns() - deadline < SLACK_NS


def test_the_log_keeps_when_the_engine_completed_a_scheduled_op_apart_from_when_the_program_saw_it(activate):
    """The engine completes the op at its arrival plus its cost; the program asks 20 ms later and sees
    it complete then. The log keeps both (graph/capture.py gives the host work in between to the
    compute after the op); an op no schedule holds, as in the capture pass, has no engine time."""
    activate(mode="replay")
    group = dist.new_group(list(TP))
    op = ScheduledOp(OpKind.ALL_REDUCE, 16, arrival_offset_ns=10 * MS, cost_ns=2 * MS)
    replay.load_schedule(ReplaySchedule(virtual_rank=SELF, collectives={TP: (op,)}, p2p={}))
    replay.start_recording()
    start = iteration_start_ns()
    work = dist.all_reduce(torch.ones(4), group=group, async_op=True)
    time.sleep(0.032)
    waited_ns = time.monotonic_ns()
    work.wait()
    dist.all_reduce(torch.ones(4), group=group)  # beyond the schedule
    scheduled, unscheduled = replay.stop_recording()
    assert scheduled.engine_done_ns == start + 12 * MS
    assert scheduled.complete_ns >= scheduled.engine_done_ns + 20 * MS
    assert waited_ns <= scheduled.wait_ns <= scheduled.complete_ns  # where the program began to wait
    assert unscheduled.engine_done_ns == -1 and unscheduled.complete_ns >= 0
