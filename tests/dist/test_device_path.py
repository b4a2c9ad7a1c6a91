"""The backend's device path with two real processes, on the asynchronous test device.

This is the path ops on CUDA tensors take when several real ranks share a GPU (gloo sub-communicators:
NCCL refuses a duplicate device): the real part is issued in program order, a helper thread waits for
it, and the backend's stream waits on a host flag, so neither the program's thread nor the device
blocks where NCCL would not block them. Every op family must give, after the device has run, exactly
what the host path gives; a mismatch between the real members must still raise.
"""

from __future__ import annotations

import datetime
import json
import os
import warnings

import pytest
import torch
import torch.distributed as dist

from benchmarks.gpu import backend_ops
from prism_megatron import backend
from prism_megatron.replay import test_device

WORLD = 8
REAL = (1, 5)  # one real member in each half: TP groups of 4 are mixed, (1, 5) is all real
TIMEOUT = datetime.timedelta(seconds=60)


def _store(physical_rank: int, num_processes: int) -> dist.Store:
    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size=num_processes,
        is_master=physical_rank == 0,
        timeout=TIMEOUT,
        wait_for_workers=False,
    )


def _worker_families(physical_rank: int, num_processes: int, out_dir: str) -> None:
    backend_ops.process_main(physical_rank, num_processes, "cpu", out_dir)


@pytest.mark.parametrize("num_processes", [1, 2])
def test_every_op_family_on_the_device_path_matches_the_host_path(run_processes, tmp_path, num_processes):
    """The GPU script's stage (benchmarks/gpu/backend_ops.py), on the test device."""
    run_processes(_worker_families, num_processes, str(tmp_path), timeout_s=180)
    for physical_rank in range(num_processes):
        record = json.loads((tmp_path / f"process-{num_processes}-{physical_rank}.json").read_text())
        assert record["created"], record.get("error")
        wrong = {name: op for name, op in record["ops"].items() if not op["ok"]}
        assert not wrong, wrong
        assert len(record["ops"]) == (14 if num_processes == 2 else 7)


def _worker_mismatch(physical_rank: int, num_processes: int) -> None:
    warnings.filterwarnings("ignore", category=FutureWarning)
    me = REAL[physical_rank]
    store = _store(physical_rank, num_processes)
    test_device.activate()
    backend.activate(
        world_size=WORLD, virtual_rank=me, real_ranks=list(REAL), real_store=dist.PrefixStore("prism/", store),
        timeout_s=3.0,  # the real ops the mismatch leaves pending time out at deactivation
    )  # fmt: skip
    try:
        pair = dist.new_group(list(REAL))
        # The two real members disagree on the op (same size, so gloo survives). The host waits for a
        # collective's real part among real members sharing a device, so the call itself raises.
        with pytest.raises(dist.DistBackendError, match="collective mismatch on group"):
            if physical_rank == 0:
                dist.all_reduce(torch.ones(4), group=pair)
            else:
                dist.broadcast(torch.zeros(2, dtype=torch.int64), src=REAL[0], group=pair)
        test_device.synchronize()  # the device moves on: the failed run ended every device wait
        with pytest.raises(dist.DistBackendError) as raised:
            dist.all_reduce(torch.ones(4), group=pair)  # every later call raises the run's failure
        text = str(raised.value)
        assert "collective mismatch on group" in text and "at sequence number 0" in text
        assert "ALL_REDUCE of 16 bytes Float" in text and "BROADCAST of 16 bytes Long" in text
        assert "flight recorder" in text
    finally:
        store.set(f"checked/{physical_rank}", "1")
        store.wait([f"checked/{r}" for r in range(num_processes)])
        backend.deactivate()
        test_device.deactivate()


def test_a_mismatch_between_real_members_raises_on_the_device_path(run_processes):
    run_processes(_worker_mismatch, 2, timeout_s=120)


def _worker_release(physical_rank: int, num_processes: int) -> None:
    import gc
    import weakref

    from prism_megatron.replay import timeline

    warnings.filterwarnings("ignore", category=FutureWarning)
    store = _store(physical_rank, num_processes)
    test_device.activate()
    backend.activate(world_size=2, virtual_rank=0, real_ranks=[0], real_store=dist.PrefixStore("prism/", store))
    try:
        timeline.compute(2.0)  # the device is busy: the op ends on it two seconds from now
        tensor = torch.ones(1024)
        work = dist.all_reduce(tensor, async_op=True)  # rank 1 is virtual: the device path
        work.wait()  # the program's stream waits for the op; the host does not
        alive = weakref.ref(tensor)
        del tensor, work
        gc.collect()
        # As NCCL after wait(): the program let the tensor go, so nothing of the backend holds it,
        # although the device has not run the op yet (the allocator's peak then matches NCCL's).
        assert alive() is None, "the backend held the op's tensor after wait() until the device was done"
        assert test_device.num_pending() > 0  # the op is still ahead on the device
    finally:
        backend.deactivate()
        test_device.deactivate()


def test_an_op_lets_its_tensors_go_once_the_program_waited_for_it(run_processes):
    """The allocator frees a block when the program drops its tensor; the backend holding an op's
    tensors until the device is done kept them live at the peak on an H200 (3 x 16 KiB in the main
    claim's job, 5 x 128 KiB in TP2 x DP2) where NCCL, which lets its tensors go at wait(), did not."""
    run_processes(_worker_release, 1, timeout_s=60)
