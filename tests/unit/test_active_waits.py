"""A process that owns its core keeps it while its program waits for a virtual peer.

With `poll_real_waits` (a process with cores of its own) the program's waits for the replay
engine's times (a collective's completion in `Work.wait`, a pipeline transfer's, the agreed start)
yield and spin instead of sleeping: on a virtual machine the computation after a sleep runs slower.
Without it they sleep as before, and a future's completion thread sleeps in either case (it must
not take the core from the program's computation). Told apart by the waiting thread's CPU time
against the wall time of a 60 ms wait; the completion is exact either way.
"""

from __future__ import annotations

import time

import pytest
import torch
import torch.distributed as dist

from prism_megatron import _C, backend, replay
from prism_megatron.replay import CostLine

WORLD = 64
SELF = 3
TP = tuple(range(8))
MS = 1_000_000
WAIT_NS = 60 * MS


@pytest.fixture
def activate():
    def start(poll: bool):
        return backend.activate(
            world_size=WORLD,
            virtual_rank=SELF,
            real_ranks=[SELF],
            default_cost=(CostLine(latency_ns=WAIT_NS, ns_per_byte=0.0),),
            poll_real_waits=poll,
        )

    yield start
    backend.deactivate()


def _cpu_share(wait) -> tuple[float, int]:
    """(this thread's CPU time over the wall time of `wait()`, wall ns)."""
    cpu, wall = time.thread_time_ns(), time.monotonic_ns()
    wait()
    return (time.thread_time_ns() - cpu) / (time.monotonic_ns() - wall), time.monotonic_ns() - wall


def _collective():
    group = dist.new_group(list(TP))
    return lambda: dist.all_reduce(torch.ones(4), group=group)


def _deadline():
    deadline = time.monotonic_ns() + WAIT_NS
    return lambda: replay.wait_until_ns(deadline)


@pytest.mark.parametrize("make_wait", [_collective, _deadline], ids=["collective", "deadline"])
def test_an_owned_core_is_kept_through_the_wait_and_a_shared_one_is_given_up(activate, make_wait):
    activate(poll=True)
    assert _C.backend.poll_real_waits()
    wait = make_wait()
    share, wall_ns = _cpu_share(wait)
    assert wall_ns >= WAIT_NS  # never early
    # yielding to nobody, the thread runs the whole wait (other load on the core can take some)
    assert share > 0.5, f"the wait ran on the CPU {share:.0%} of its {wall_ns / MS:.0f} ms: it slept"
    backend.deactivate()

    activate(poll=False)
    wait = make_wait()
    share, wall_ns = _cpu_share(wait)
    assert wall_ns >= WAIT_NS
    assert share < 0.3, f"the wait ran on the CPU {share:.0%} of its {wall_ns / MS:.0f} ms: it spun"


def test_a_future_s_completion_thread_sleeps_even_where_the_core_is_owned(activate):
    activate(poll=True)
    group = dist.new_group(list(TP))
    work = dist.all_reduce(torch.ones(4), group=group, async_op=True)
    future = work.get_future()
    started = time.monotonic_ns()
    process_cpu = time.process_time_ns()
    time.sleep(WAIT_NS / 1e9 + 0.02)  # this thread sleeps; only the completion thread could spin
    spent = time.process_time_ns() - process_cpu
    assert future.done() and time.monotonic_ns() - started >= WAIT_NS
    assert spent < 0.3 * WAIT_NS, f"the process ran {spent / MS:.1f} ms of CPU while its future was pending"
