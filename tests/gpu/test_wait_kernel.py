"""The device-side waits of the replay engine (csrc/replay/wait_kernel.cu), on a real GPU.

Skipped without CUDA. The tests use no fixtures, so benchmarks/gpu/run_tests.py can run them on a
machine without pytest. Bounds are loose (tens of us); benchmarks/gpu/wait_precision.py measures.
"""

from __future__ import annotations

import statistics
import time

import pytest
import torch

from prism_megatron.replay import clock

pytestmark = [
    pytest.mark.gpu,
    pytest.mark.skipif(
        not (torch.cuda.is_available() and clock.cuda_built()),
        reason="needs a GPU and a CUDA build of prism_megatron._C",
    ),
]

# Kernel launch gaps and the global timer's tick (up to ~1 us) make a few us of lateness normal.
LATE_BOUND_NS = 200_000


def stamped_wait_elapsed_ns(arrival_offset_ns: int, cost_ns: int) -> int:
    """Stamp, wait (offset relative to that stamp), stamp on the current stream; GPU ns between stamps."""
    stamps = torch.zeros(2, dtype=torch.int64, device="cuda")
    clock.cuda_stamp(stamps[0:1])
    clock.cuda_wait_until(stamps[0:1], arrival_offset_ns, cost_ns)
    clock.cuda_stamp(stamps[1:2])
    start_ns, end_ns = stamps.tolist()
    return end_ns - start_ns


def test_stamps_on_one_stream_are_ordered_and_nonzero():
    stamps = torch.zeros(8, dtype=torch.int64, device="cuda")
    for i in range(8):
        clock.cuda_stamp(stamps[i : i + 1])
    values = stamps.tolist()
    assert values[0] > 0
    assert values == sorted(values)
    assert values[-1] > values[0]


def test_the_global_timer_counts_nanoseconds_at_the_host_clocks_rate():
    stamps = torch.zeros(2, dtype=torch.int64, device="cuda")
    clock.cuda_stamp(stamps[0:1])
    torch.cuda.synchronize()
    host_start_ns = time.monotonic_ns()
    time.sleep(0.05)
    host_elapsed_ns = time.monotonic_ns() - host_start_ns
    clock.cuda_stamp(stamps[1:2])
    device_elapsed_ns = stamps[1].item() - stamps[0].item()
    # The device stamps bracket the host interval, so the device interval is the longer one, up to
    # a timer tick and rate differences of a few ppm.
    assert 0.999 * host_elapsed_ns <= device_elapsed_ns < host_elapsed_ns + 20_000_000


def test_late_peers_decide_completion_start_plus_offset_plus_cost():
    elapsed_ns = stamped_wait_elapsed_ns(arrival_offset_ns=2_000_000, cost_ns=1_000_000)
    assert 3_000_000 <= elapsed_ns < 3_000_000 + LATE_BOUND_NS


def test_when_peers_arrived_earlier_own_arrival_plus_cost_decides():
    elapsed_ns = stamped_wait_elapsed_ns(arrival_offset_ns=-1_000_000_000, cost_ns=1_000_000)
    assert 1_000_000 <= elapsed_ns < 1_000_000 + LATE_BOUND_NS


def test_a_wait_whose_time_has_passed_completes_at_once():
    elapsed_ns = stamped_wait_elapsed_ns(arrival_offset_ns=-1_000_000_000, cost_ns=0)
    assert elapsed_ns < LATE_BOUND_NS


def test_enqueueing_a_wait_never_blocks_the_host():
    start = torch.zeros(1, dtype=torch.int64, device="cuda")
    clock.cuda_stamp(start)
    host_start_ns = time.monotonic_ns()
    clock.cuda_wait_until(start, 200_000_000, 0)
    enqueue_ns = time.monotonic_ns() - host_start_ns
    torch.cuda.synchronize()
    assert enqueue_ns < 20_000_000
    assert time.monotonic_ns() - host_start_ns >= 150_000_000  # the wait did run on the device


def test_wait_precision_is_within_tens_of_microseconds():
    errors_ns = clock.cuda_measure_wait_errors_ns(100_000, 200)
    assert len(errors_ns) == 200
    assert min(errors_ns) >= 0
    assert statistics.median(errors_ns) < 20_000
    assert sorted(errors_ns)[197] < 100_000  # p99


def test_the_global_timer_ticks_at_least_every_few_microseconds():
    steps_ns = clock.cuda_sample_timer_steps_ns(100)
    assert min(steps_ns) > 0
    assert statistics.median(steps_ns) <= 5_000


def busy_matmuls(n: int, iterations: int) -> None:
    a = torch.randn(n, n, device="cuda", dtype=torch.bfloat16)
    for _ in range(iterations):
        a = (a @ a).clamp_(-1, 1)


def wall_ns(fn) -> int:
    torch.cuda.synchronize()
    start_ns = time.monotonic_ns()
    fn()
    torch.cuda.synchronize()
    return time.monotonic_ns() - start_ns


def test_compute_on_another_stream_overlaps_the_wait():
    compute_stream, comm_stream = torch.cuda.Stream(), torch.cuda.Stream()
    busy_matmuls(4096, 5)  # warm-up: cuBLAS handles and kernels
    compute_ns = wall_ns(lambda: busy_matmuls(4096, 100))
    wait_ns = max(compute_ns, 5_000_000)
    start = torch.zeros(1, dtype=torch.int64, device="cuda")

    def wait_only():
        with torch.cuda.stream(comm_stream):
            clock.cuda_stamp(start)
            clock.cuda_wait_until(start, wait_ns, 0)

    def both():
        wait_only()
        with torch.cuda.stream(compute_stream):
            busy_matmuls(4096, 100)

    wait_alone_ns = wall_ns(wait_only)
    both_ns = wall_ns(both)
    assert wait_alone_ns >= wait_ns
    # Serialised, both would take compute + wait (~2x the longer); overlapped, about the longer.
    assert both_ns < 1.3 * max(compute_ns, wait_alone_ns)


def test_bad_arguments_are_rejected_by_name():
    with pytest.raises(ValueError, match="dst must be a CUDA tensor"):
        clock.cuda_stamp(torch.zeros(1, dtype=torch.int64))
    with pytest.raises(ValueError, match="must be int64"):
        clock.cuda_stamp(torch.zeros(1, dtype=torch.int32, device="cuda"))
    with pytest.raises(ValueError, match="at least one element"):
        clock.cuda_stamp(torch.zeros(0, dtype=torch.int64, device="cuda"))
    with pytest.raises(ValueError, match="cost_ns"):
        clock.cuda_wait_until(torch.zeros(1, dtype=torch.int64, device="cuda"), 0, -1)
    with pytest.raises(ValueError, match="duration_ns"):
        clock.cuda_measure_wait_errors_ns(-1, 1)
