"""The rendezvous store of a multi-process test's workers (`conftest.run_processes` sets the address)."""

from __future__ import annotations

import datetime
import os

import torch.distributed as dist


def shared_store(physical_rank: int, num_processes: int, timeout_s: float = 60.0) -> dist.TCPStore:
    """A TCP store at MASTER_ADDR:MASTER_PORT, hosted by physical rank 0."""
    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size=num_processes,
        is_master=physical_rank == 0,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )


def finish_together(store: dist.Store, physical_rank: int, num_processes: int) -> None:
    """Wait until every worker has checked its results (none tears its groups down under another)."""
    store.set(f"checked/{physical_rank}", "1")
    store.wait([f"checked/{r}" for r in range(num_processes)])
