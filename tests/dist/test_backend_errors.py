"""Faults across real processes raise from wait() with the promised text instead of hanging.

- Real members that issue different collectives at the same sequence number of a group: an error
  naming the group, the sequence number, both ranks and both ops.
- A wait longer than the timeout: an error naming the op, group and real ranks, with the flight
  recorder's dump.
"""

from __future__ import annotations

import datetime
import os
import subprocess
import sys

import pytest
import torch
import torch.distributed as dist

from prism_megatron import backend

GROUP = [0, 1, 2, 3]  # real 0 and 1, virtual 2 and 3


def _store(physical_rank: int, num_processes: int) -> dist.Store:
    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size=num_processes,
        is_master=physical_rank == 0,
        timeout=datetime.timedelta(seconds=60),
        wait_for_workers=False,
    )


def _mismatched_collectives(physical_rank: int, num_processes: int) -> None:
    store = _store(physical_rank, num_processes)
    backend.activate(
        world_size=8,
        virtual_rank=physical_rank,
        real_ranks=[0, 1],
        real_store=dist.PrefixStore("prism/", store),
        timeout_s=3.0,  # the real ops left pending by the mismatch time out at deactivation
    )
    try:
        group = dist.new_group(GROUP)
        with pytest.raises(dist.DistBackendError) as raised:
            if physical_rank == 0:
                dist.all_reduce(torch.ones(4), group=group)
            else:
                dist.broadcast(torch.zeros(2, dtype=torch.int64), src=0, group=group)
        text = str(raised.value)
        assert "collective mismatch on group" in text and "[0, 1, 2, 3]" in text
        assert "at sequence number 0" in text
        assert "virtual rank 0" in text and "virtual rank 1" in text
        assert "ALL_REDUCE of 16 bytes Float" in text and "BROADCAST of 16 bytes Long" in text
        assert "flight recorder" in text
    finally:
        store.set(f"checked/{physical_rank}", "1")
        store.wait([f"checked/{r}" for r in range(num_processes)])
        backend.deactivate()


def test_real_members_issuing_different_ops_get_an_error_naming_both(run_processes):
    run_processes(_mismatched_collectives, 2)


def _one_member_never_arrives(physical_rank: int, num_processes: int) -> None:
    store = _store(physical_rank, num_processes)
    backend.activate(
        world_size=16,
        virtual_rank=physical_rank,
        real_ranks=[0, 1],
        real_store=dist.PrefixStore("prism/", store),
        timeout_s=2.0,
    )
    try:
        group = dist.new_group(GROUP)
        if physical_rank == 0:
            work = dist.all_reduce(torch.ones(4), group=group, async_op=True)
            with pytest.raises(dist.DistBackendError) as raised:
                work.wait()
            text = str(raised.value)
            assert "prism: timeout: ALL_REDUCE seq 0 on group" in text
            assert "did not complete within 2.000 s" in text
            assert "real members: virtual ranks [0, 1]" in text
            assert "flight recorder of virtual rank 0" in text and "ALL_REDUCE on group" in text
            assert not work.is_success()
        store.set(f"checked/{physical_rank}", "1")
        store.wait([f"checked/{r}" for r in range(num_processes)])
    finally:
        backend.deactivate()


def test_a_wait_longer_than_the_timeout_raises_with_the_flight_recorder(run_processes):
    run_processes(_one_member_never_arrives, 2)


def test_an_uncaught_exception_prints_the_flight_recorder_at_exit():
    script = (
        "import torch, torch.distributed as dist\n"
        "from prism_megatron import backend\n"
        "backend.activate(world_size=64, virtual_rank=3, real_ranks=[3])\n"
        "dist.all_reduce(torch.ones(2))\n"
        "raise RuntimeError('the training step failed')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=120)
    assert done.returncode != 0
    assert "the training step failed" in done.stderr
    assert "prism flight recorder of virtual rank 3" in done.stderr and "ALL_REDUCE on group" in done.stderr


def test_the_init_barrier_variable_never_makes_activation_wait_for_w_ranks():
    script = (
        "import os, torch, torch.distributed as dist\n"
        "os.environ['TORCH_DIST_INIT_BARRIER'] = '1'\n"
        "from prism_megatron import backend\n"
        "backend.activate(world_size=8192, virtual_rank=3, real_ranks=[3])\n"
        "dist.new_group(list(range(8)))\n"
        "backend.deactivate()\n"
        "assert os.environ['TORCH_DIST_INIT_BARRIER'] == '1'\n"
        "print('activated')\n"
    )
    done = subprocess.run([sys.executable, "-c", script], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert "activated" in done.stdout


def _deferred_check_mismatch(physical_rank: int, num_processes: int) -> None:
    from prism_megatron.backend import consistency

    store = _store(physical_rank, num_processes)
    backend.activate(
        world_size=8,
        virtual_rank=physical_rank,
        real_ranks=[0, 1],
        real_store=dist.PrefixStore("prism/", store),
        timeout_s=10.0,
    )
    try:
        assert not consistency.deferred()  # every activation checks before the real op first
        group = dist.new_group(GROUP)
        consistency.defer(True)
        tensor = torch.ones(4)
        dist.all_reduce(tensor, group=group)  # same op on both: its deferred check passes
        consistency.settle(10.0)
        assert tensor.tolist() == [4.0] * 4  # two real ones, two virtual mirrors
        # Same bytes, another dtype: the real ops pair and complete, and the deferred check finds it.
        odd = torch.ones(4) if physical_rank == 0 else torch.ones(4, dtype=torch.int32)
        dist.all_reduce(odd, group=group)
        with pytest.raises(RuntimeError) as raised:
            consistency.settle(10.0)
        text = str(raised.value)
        assert "collective mismatch on group" in text and "at sequence number 1" in text
        assert "ALL_REDUCE of 16 bytes Float" in text and "ALL_REDUCE of 16 bytes Int" in text
    finally:
        store.set(f"checked/{physical_rank}", "1")
        store.wait([f"checked/{r}" for r in range(num_processes)])
        backend.deactivate()


def test_a_deferred_check_still_finds_a_mismatch_between_real_members(run_processes):
    run_processes(_deferred_check_mismatch, 2)
