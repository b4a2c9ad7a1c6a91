"""Multi-process tests: real processes on free ports, spawned fresh, with a hard time limit.

`run_processes(worker, num_processes, *args)` starts `num_processes` spawned processes, each calling
`worker(physical_rank, num_processes, *args)` with MASTER_ADDR/MASTER_PORT set to a free local port
(as torchrun would), waits for all of them, and fails the test with the first child's traceback if
any raised, or if they are not done within `timeout_s` (then they are killed). Workers must be
module-level functions (spawn pickles them by name).
"""

from __future__ import annotations

import os
import socket
import time

import pytest
import torch.multiprocessing as mp


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def _entry(physical_rank, worker, num_processes, port, args):
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    worker(physical_rank, num_processes, *args)


def _run(worker, num_processes, *args, timeout_s: float = 120.0):
    context = mp.start_processes(
        _entry,
        args=(worker, num_processes, free_port(), args),
        nprocs=num_processes,
        join=False,
        start_method="spawn",
    )
    deadline = time.monotonic() + timeout_s
    try:
        while not context.join(timeout=0.5):
            if time.monotonic() > deadline:
                pytest.fail(f"{worker.__name__}: {num_processes} processes still running after {timeout_s} s")
    finally:
        for process in context.processes:
            if process.is_alive():
                process.kill()
                process.join()


@pytest.fixture
def run_processes():
    return _run
