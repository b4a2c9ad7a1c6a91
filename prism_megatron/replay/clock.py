"""The replay engine's clock, typed, for Python callers (tests, benchmarks, diagnostics).

The engine itself waits in C++ (``csrc/replay/clock.cpp``, ``wait_kernel.cu``); this module exists so
Python can use the same clock and the same waits without knowing the extension's layout, and so the
CPU-only and CUDA builds present one API: the CUDA functions raise a clear error on a CPU build.

Host time is ``CLOCK_MONOTONIC`` in ns, the clock of :func:`time.monotonic_ns`. Device time is the
GPU global timer in ns; the two clocks are not the same and are never compared directly.
"""

from __future__ import annotations

import torch  # before _C: the extension links libc10, which importing torch loads

from prism_megatron import _C

_clock = _C.clock


def now_ns() -> int:
    """Host monotonic time in ns; agrees with :func:`time.monotonic_ns`."""
    return _clock.now_ns()


def lower_timer_slack() -> None:
    """Set the calling thread's timer slack to 1 ns (Linux; a no-op elsewhere).

    Timed sleeps then wake ~50 us earlier. Threads started afterwards by this thread inherit it, so
    call it before starting the threads that wait.
    """
    _clock.lower_timer_slack()


def default_spin_window_ns() -> int:
    """How long before a deadline :func:`wait_until_ns` stops sleeping and spins."""
    return _clock.default_spin_window_ns()


def wait_until_ns(deadline_ns: int, spin_window_ns: int | None = None) -> None:
    """Block until :func:`now_ns` reaches ``deadline_ns``; return at once if it already has.

    The GIL is released while waiting. ``spin_window_ns`` overrides the default window (for
    measurements): 0 sleeps only, a window longer than the wait spins only.
    """
    if spin_window_ns is None:
        _clock.wait_until_ns(deadline_ns)
        return
    if spin_window_ns < 0:
        raise ValueError(f"spin_window_ns must be >= 0 or None (the default window), got {spin_window_ns}")
    _clock.wait_until_ns_with_window(deadline_ns, spin_window_ns)


def measure_wait_errors_ns(duration_ns: int, num_waits: int, spin_window_ns: int | None = None) -> list[int]:
    """Perform ``num_waits`` back-to-back waits of ``duration_ns`` in C++; return each one's error.

    The error is the return time minus the deadline (ns, >= 0 up to clock read noise), measured with
    no Python in the loop, so it is the C++ wait's precision alone.
    """
    if spin_window_ns is not None and spin_window_ns < 0:
        raise ValueError(f"spin_window_ns must be >= 0 or None (the default window), got {spin_window_ns}")
    window_ns = -1 if spin_window_ns is None else spin_window_ns
    return _clock.measure_wait_errors_ns(duration_ns, num_waits, window_ns)


def cuda_built() -> bool:
    """Whether the extension was built with CUDA (the device waits exist)."""
    return bool(_C.with_cuda)


def _cuda_clock():
    if not cuda_built():
        raise RuntimeError(
            "prism_megatron._C was built without CUDA, so the device waits are absent; rebuild with a "
            "CUDA torch and CUDA_HOME set (python setup.py build_ext --inplace)"
        )
    return _clock


def cuda_stamp(dst: torch.Tensor) -> None:
    """Enqueue on the current stream a kernel writing the GPU global timer (ns) into ``dst[0]``.

    ``dst`` must be an int64 CUDA tensor with at least one element.
    """
    _cuda_clock().cuda_stamp(dst)


def cuda_wait_until(iteration_start: torch.Tensor, arrival_offset_ns: int, cost_ns: int) -> None:
    """Enqueue on the current stream a wait that completes at the replay engine's completion time.

    The kernel, when the stream reaches it at GPU time ``t0``, spins until
    ``max(t0, iteration_start[0] + arrival_offset_ns) + cost_ns``. Work on other streams keeps running.
    """
    _cuda_clock().cuda_wait_until(iteration_start, arrival_offset_ns, cost_ns)


def cuda_measure_wait_errors_ns(duration_ns: int, num_waits: int) -> list[int]:
    """Stamp, wait ``duration_ns``, stamp, ``num_waits`` times on the current stream; return errors.

    Each error is end stamp - (start stamp + duration) in GPU-timer ns: the wait kernel's lateness
    plus its exit and the next kernel's launch gap, i.e. what the next op on the stream sees.
    """
    return _cuda_clock().cuda_measure_wait_errors_ns(duration_ns, num_waits)


def cuda_sample_timer_steps_ns(num_steps: int) -> list[int]:
    """Sizes (ns) of ``num_steps`` consecutive ticks of the GPU global timer (its resolution)."""
    return _cuda_clock().cuda_sample_timer_steps_ns(num_steps)
