"""A process with cores of its own waits for its real peers by polling (`poll_real_waits`).

Two real processes all-reduce among themselves; one arrives 50 ms late. The waiting side polls the
gloo op with sched_yield instead of blocking in it: the result is the sum, the wait ends only once
the late peer has arrived, and a later activation without the option blocks again. Ops that gloo
only finishes inside wait() (reduce-scatter) are not polled.
"""

from __future__ import annotations

import time

import torch
import torch.distributed as dist

from prism_megatron import _C, backend
from tests.dist.stores import finish_together, shared_store

LATE_S = 0.05


def _worker(physical_rank: int, num_processes: int) -> None:
    store = shared_store(physical_rank, num_processes)
    backend.activate(
        world_size=4, virtual_rank=physical_rank, real_ranks=[0, 1],
        real_store=dist.PrefixStore("prism/", store), timeout_s=30.0, poll_real_waits=True,
    )  # fmt: skip
    try:
        assert _C.backend.poll_real_waits()
        group = dist.new_group([0, 1])
        store.set(f"ready/{physical_rank}", "1")
        store.wait([f"ready/{r}" for r in range(num_processes)])
        if physical_rank == 1:
            time.sleep(LATE_S)
        start = time.monotonic()
        tensor = torch.full((4,), float(physical_rank + 1))
        dist.all_reduce(tensor, group=group)
        waited = time.monotonic() - start
        assert tensor.tolist() == [3.0] * 4
        # gloo runs a reduce-scatter (and a send or recv) inside wait(): polled, it would never end
        # and only the 30 s timeout would stop the loop. Those are waited on at once.
        for dtype in (torch.float32, torch.bfloat16):
            chunk = torch.empty(2, dtype=dtype)
            start = time.monotonic()
            dist.reduce_scatter_tensor(chunk, torch.arange(4, dtype=dtype) * (physical_rank + 1), group=group)
            assert time.monotonic() - start < 5.0, "the reduce-scatter was polled until the timeout"
            assert chunk.float().tolist() == [3.0 * (2 * physical_rank + i) for i in range(2)]
        if physical_rank == 0:
            assert waited >= 0.8 * LATE_S, (
                f"the polled wait ended {waited * 1e3:.1f} ms in, before the peer came"
            )
    finally:
        finish_together(store, physical_rank, num_processes)
        backend.deactivate()
    backend.activate(world_size=2, virtual_rank=0, real_ranks=[0])
    try:
        assert not _C.backend.poll_real_waits(), "every activation sets the option again"
    finally:
        backend.deactivate()


def test_a_polled_wait_gives_the_real_result_once_the_late_peer_arrives(run_processes):
    run_processes(_worker, 2, timeout_s=120)
