"""Start a run's processes on this machine and collect what each returns.

Processes are forked from the benchmark after torch and megatron-core are imported, so 16-64 of them
start in a second instead of each spending seconds of a shared core on imports. Each child gets
torchrun's environment variables (rank, world size, a free port on loopback) and its own request;
its result comes back through a queue. A child that fails takes the run down with its traceback.
"""

from __future__ import annotations

import multiprocessing
import os
import queue
import socket
import time
import traceback
from collections.abc import Callable, Sequence
from typing import Any

_TORCHRUN_VARIABLES = ("MASTER_ADDR", "MASTER_PORT", "RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE")


def environment_for(physical_rank: int, num_processes: int, port: int) -> dict[str, str]:
    """torchrun's variables for one of `num_processes` processes on this machine."""
    return {
        "MASTER_ADDR": "127.0.0.1",
        "MASTER_PORT": str(port),
        "RANK": str(physical_rank),
        "LOCAL_RANK": str(physical_rank),
        "WORLD_SIZE": str(num_processes),
        "LOCAL_WORLD_SIZE": str(num_processes),
        "OMP_NUM_THREADS": "1",
    }


def free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _child(
    target: Callable[[Any], Any], request: Any, index: int, variables: dict[str, str], results
) -> None:
    for name in _TORCHRUN_VARIABLES:
        os.environ.pop(name, None)
    os.environ.update(variables)
    try:
        results.put((index, "ok", target(request)))
    except BaseException:  # the parent reports it; the child must not hang the run
        results.put((index, "error", traceback.format_exc()))


def run_processes(
    target: Callable[[Any], Any],
    requests: Sequence[Any],
    *,
    connected: bool = True,
    timeout_s: float = 600.0,
    local_ranks: Sequence[int] | None = None,
) -> list[Any]:
    """Run `target(request)` in one forked process per request; results in request order.

    Args:
        connected: the processes form one torch.distributed job (torchrun variables, physical rank =
            index); otherwise each runs alone (no rendezvous variables).
        local_ranks: LOCAL_RANK of each process (default: its index, as torchrun gives it).

    Raises:
        RuntimeError: a process failed (its traceback is in the message), died without a result (a
            signal, an exit from native code: said within a second), or the run timed out.
    """
    context = multiprocessing.get_context("fork")
    results = context.Queue()
    port = free_port()
    children = []
    for index, request in enumerate(requests):
        variables = environment_for(index, len(requests), port) if connected else {"OMP_NUM_THREADS": "1"}
        if local_ranks is not None:
            variables["LOCAL_RANK"] = str(local_ranks[index])
        child = context.Process(target=_child, args=(target, request, index, variables, results), daemon=True)
        child.start()
        children.append(child)
    collected: dict[int, Any] = {}
    deadline = time.monotonic() + timeout_s
    try:
        while len(collected) < len(requests):
            try:
                index, status, value = results.get(timeout=min(max(deadline - time.monotonic(), 0.1), 1.0))
            except queue.Empty:
                dead = [
                    i for i, c in enumerate(children) if i not in collected and c.exitcode not in (None, 0)
                ]
                if dead:
                    raise RuntimeError(
                        f"process {dead[0]} exited with status {children[dead[0]].exitcode} without a result"
                    ) from None
                if time.monotonic() < deadline:
                    continue
                raise RuntimeError(
                    f"{len(requests) - len(collected)} processes still running after {timeout_s} s"
                ) from None
            if status != "ok":
                raise RuntimeError(f"process {index} failed:\n{value}")
            collected[index] = value
    finally:
        for child in children:
            child.join(timeout=5)
            if child.is_alive():
                child.kill()
                child.join()
    return [collected[i] for i in range(len(requests))]
