"""The device timeline: the one source of every time the passes use.

Capture, emulation, the closed loop and the report never read a clock themselves. They record a
:class:`Mark` where the program issues work (an iteration's start and end, a pipeline call's span, a
p2p transfer), the backend records its ops' marks itself, and the marks are read after the
iteration (:func:`resolve`). Where a mark lands depends on the device in use:

* on the host (CPU tensors), a mark reads the host clock (CLOCK_MONOTONIC, the clock of
  :func:`time.monotonic_ns`) at once: on CPU that is when the work happens;
* on CUDA (:func:`use_cuda`), a mark is a kernel on the current stream that writes the GPU global
  timer when the stream gets there, the clock the replay engine's wait kernels spin on; the host,
  which runs ahead of the device, never stands in for the device's time;
* on the asynchronous test device (:mod:`prism_megatron.replay.test_device`), the stream's worker
  reads the host clock when the stream gets there.

So a compute span (the time between two consecutive ops on the compute stream) is device time on
every device, and an iteration's time is the span between its start and end marks.

On a modelled GPU (``--prism-device model:<gpu>``) the program runs on fake tensors on the host and
the GPU model charges each op's kernel time to a clock of its own; marks are recorded on the host
(the backend's included) and :func:`resolve` reads each as the modelled device's time at that moment
(:func:`set_time_map`, installed by the modelled device), so compute spans are modelled device time.

Reading a mark blocks until the device has passed it (at most the timeout: --prism-timeout).
Marks live in a ring of 2^18 slots (``csrc/replay/timeline.h``): read an iteration's marks before
it records that many more.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
from collections.abc import Callable, Iterator, Sequence

DEFAULT_TIMEOUT_S = 300.0
_timeout_s = DEFAULT_TIMEOUT_S
_time_map: Callable[[int], int] | None = None
"""Host time -> modelled device time while a modelled GPU is in use (see set_time_map)."""
_on_mark: Callable[[], None] | None = None
"""Called before each mark this module records while a modelled GPU is in use (see set_time_map)."""


@functools.cache
def _native():
    import torch  # noqa: F401  (the extension links libc10, which importing torch loads)

    from prism_megatron import _C

    return _C.timeline


@dataclasses.dataclass(frozen=True, slots=True)
class Mark:
    """A point of the device timeline: where a stream was when it got there (read it with resolve)."""

    id: int


def mark() -> Mark:
    """A mark on the active device's current stream (the host clock on the host)."""
    if _on_mark is not None:
        _on_mark()
    return Mark(_native().mark())


def mark_at(t_ns: int) -> Mark:
    """A host time as a mark (already resolved), for work timed on the host."""
    return Mark(_native().mark_at(t_ns))


def resolve(marks: Sequence[Mark], timeout_s: float | None = None) -> list[int]:
    """The marks' times (ns on the device's clock), waiting until the device has passed each.

    Raises:
        RuntimeError: a mark was not reached within the timeout (a stream is stuck), or it expired.
    """
    timeout_ns = round((_timeout_s if timeout_s is None else timeout_s) * 1e9)
    values = _native().resolve([m.id for m in marks], timeout_ns)
    return values if _time_map is None else [_time_map(v) for v in values]


def set_time_map(time_map: Callable[[int], int] | None, on_mark: Callable[[], None] | None = None) -> None:
    """Read every host mark as ``time_map(host_ns)`` from now on (None: as it is), calling
    ``on_mark()`` before each mark :func:`mark` records.

    A modelled GPU installs its clock's history here: the host time at which each op's modelled
    kernel time was charged, so a mark recorded between two ops reads the modelled time in between;
    its ``on_mark`` advances the clock by a nanosecond, so marks with no op between them (two
    pipeline calls in a row) keep their order in time, as on a device. Only host marks are mapped:
    a modelled device records no CUDA or test-device marks.
    """
    global _time_map, _on_mark
    _time_map, _on_mark = time_map, on_mark


def modelled() -> bool:
    """Whether a modelled GPU is in use (a time map is installed, `set_time_map`)."""
    return _time_map is not None


def map_time(t_ns: int) -> int:
    """A host time read on the device timeline: itself, or on a modelled GPU its modelled time."""
    return t_ns if _time_map is None else _time_map(t_ns)


def resolve_one(m: Mark, timeout_s: float | None = None) -> int:
    return resolve([m], timeout_s)[0]


def is_reached(m: Mark) -> bool:
    """Whether the device has passed the mark (never blocks)."""
    return _native().value(m.id) > 0


def device_name() -> str:
    """Where marks are recorded now: "host", "test" (the test device) or "cuda"."""
    return _native().active_name()


def use_cuda(on: bool) -> None:
    """Record marks (and device p2p ops) on the current CUDA stream from now on (CUDA builds)."""
    if on:
        from prism_megatron.replay import clock

        if not clock.cuda_built():
            raise RuntimeError(
                "--prism-device cuda needs prism_megatron._C built with CUDA (python setup.py build_ext "
                "--inplace with a CUDA torch and CUDA_HOME set)"
            )
    _native().use_cuda(on)


def set_timeout_s(timeout_s: float) -> None:
    """How long resolve waits for the device by default (the run's --prism-timeout)."""
    global _timeout_s
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")
    _timeout_s = float(timeout_s)


def compute(duration_s: float) -> None:
    """Compute lasting ``duration_s`` where the program issues work (the sleep-compute workload).

    On the host a wait of that length (the replay engine's C++ wait: a sleep, then a spin over the
    last 100 us, GIL released; a plain ``time.sleep`` wakes tens of milliseconds late on a loaded
    machine); on a device a kernel of that length on the current stream (the host moves on at once,
    as it does after launching a kernel).
    """
    if duration_s < 0:
        raise ValueError(f"duration_s must be >= 0, got {duration_s}")
    if _work is None:
        _native().compute(round(duration_s * 1e9))
        return
    begin = mark()
    _native().compute(round(duration_s * 1e9))
    _work.append((begin, mark()))


_work: list[tuple[Mark, Mark]] | None = None
"""(begin, end) marks of each `compute` call since `record_work(True)`; None when not recording."""


def record_work(on: bool) -> list[tuple[Mark, Mark]]:
    """Start (on) or stop recording where device work runs; returns the marks recorded until now.

    The capture keeps them apart from the gaps between ops, so that a compute span's host overhead
    (what the program did around its work) is known and a straggler what-if stretches only the work.
    """
    global _work
    recorded = _work or []
    _work = [] if on else None
    return recorded


@contextlib.contextmanager
def host_clock_marks() -> Iterator[None]:
    """Diagnostics: inside, every mark reads the host clock when recorded, on any device.

    What a capture that took the host's clock for the device's would measure: on a device whose host
    runs ahead, launch gaps instead of compute spans. Tests use it to show the difference.
    """
    _native().force_host_clock(True)
    try:
        yield
    finally:
        _native().force_host_clock(False)
