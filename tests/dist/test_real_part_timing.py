"""The op log tells what an op's real part took apart from the replay engine's deadline.

Two real processes share a group with two virtual members; the schedule has the virtual members
arrive 30 ms after the iteration start. The all-reduce's real part (gloo between the two processes)
is done within milliseconds, the op completes at the engine's time: `OpEvent.real_done_ns` lies
between the two, which is what the closed loop folds for an op with virtual members
(passes/real_costs.py).
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from prism_megatron import backend, replay
from prism_megatron.replay.schedule import OpKind, ReplaySchedule, ScheduledOp
from tests.dist.stores import finish_together, shared_store

GROUP = (0, 1, 2, 3)  # real 0 and 1, virtual 2 and 3
MS = 1_000_000


def _worker(physical_rank: int, num_processes: int) -> None:
    store = shared_store(physical_rank, num_processes)
    backend.activate(
        world_size=8, virtual_rank=physical_rank, real_ranks=[0, 1],
        real_store=dist.PrefixStore("prism/", store), timeout_s=30.0, mode="replay",
    )  # fmt: skip
    try:
        group = dist.new_group(list(GROUP))
        op = ScheduledOp(OpKind.ALL_REDUCE, 16, arrival_offset_ns=30 * MS, cost_ns=1 * MS)
        replay.load_schedule(ReplaySchedule(physical_rank, {GROUP: (op,)}, {}))
        replay.start_recording()
        replay.mark_iteration_start()
        tensor = torch.ones(4)
        dist.all_reduce(tensor, group=group)
        (event,) = replay.stop_recording()
        assert tensor.tolist() == [4.0] * 4
        assert event.has_virtual and event.issue_ns <= event.real_done_ns
        assert event.real_done_ns < event.issue_ns + 25 * MS, (
            "the real part does not wait for the virtual peers"
        )
        assert event.complete_ns >= event.issue_ns + 30 * MS, "the op completes at the engine's time"
    finally:
        finish_together(store, physical_rank, num_processes)
        backend.deactivate()


def test_an_ops_real_part_is_timed_apart_from_the_engines_deadline(run_processes):
    run_processes(_worker, 2, timeout_s=120)
