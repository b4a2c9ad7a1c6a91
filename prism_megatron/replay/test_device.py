"""The asynchronous test device: CUDA's timing semantics without a GPU (``csrc/replay/test_device.h``).

Why: the device timeline and the backend's device path are written once for CUDA and for this
stand-in, so what is proven here holds for the code a GPU runs. While it is active:

* work enqueued on a stream runs later, in order, on the stream's worker thread; streams run
  concurrently; the host runs ahead until it synchronises (:func:`synchronize`, an event's
  ``synchronize``, or reading a mark);
* compute is :func:`prism_megatron.replay.timeline.compute` (a sleep on the current stream);
* ops of the ``prism`` backend on CPU tensors take the device path: they complete on the backend's
  stream (wait-until, real parts behind a host flag), and Work.wait() makes the caller's stream
  wait, never the host;
* marks (:mod:`prism_megatron.replay.timeline`) are read by the workers when a stream gets there.

What it leaves out: memory. Tensors stay host tensors and the program's own tensor ops run on the
host in program order; only time runs on the streams. Its clock is CLOCK_MONOTONIC.

Use::

    with test_device.active_device():
        ...  # the program, unchanged
"""

from __future__ import annotations

import contextlib
import functools
from collections.abc import Iterator


@functools.cache
def _native():
    import torch  # noqa: F401  (the extension links libc10, which importing torch loads)

    from prism_megatron import _C

    return _C.test_device


def activate() -> None:
    _native().activate()


def deactivate() -> None:
    """Synchronise every stream; ops and marks go back to the host."""
    _native().deactivate()


def active() -> bool:
    return _native().active()


@contextlib.contextmanager
def active_device() -> Iterator[None]:
    """The test device, active inside (and synchronised and deactivated on the way out)."""
    activate()
    try:
        yield
    finally:
        deactivate()


def new_stream() -> int:
    """A new stream (its own worker thread), for the program's side streams."""
    return _native().new_stream()


def current_stream() -> int:
    return _native().current_stream()


@contextlib.contextmanager
def stream(stream_id: int) -> Iterator[None]:
    """Issue on ``stream_id`` inside (this thread's current stream), as ``torch.cuda.stream``."""
    previous = current_stream()
    _native().set_current_stream(stream_id)
    try:
        yield
    finally:
        _native().set_current_stream(previous)


def synchronize() -> None:
    """The host waits until every stream has run what was enqueued so far."""
    _native().synchronize()


def num_pending() -> int:
    """Items enqueued and not yet run, over all streams (how far the host is ahead)."""
    return _native().num_pending()


def num_streams() -> int:
    """Streams made so far, the default stream included (who asks the device for streams, how often)."""
    return _native().num_streams()


@contextlib.contextmanager
def capturing(stream_id: int | None = None) -> Iterator[None]:
    """Inside, the stream (default: the current one) reads as being captured into a CUDA graph,
    as ``torch.cuda.graph`` would make it: what a backend must refuse is refused here too."""
    stream_id = current_stream() if stream_id is None else stream_id
    _native().set_capturing(stream_id, True)
    try:
        yield
    finally:
        _native().set_capturing(stream_id, False)


@contextlib.contextmanager
def device_error(message: str) -> Iterator[None]:
    """Inside, every query of the device's progress raises ``message``, as CUDA does after a sticky
    error (an illegal address in some kernel): the watchdog must report it, not die of it."""
    _native().set_device_error(message)
    try:
        yield
    finally:
        _native().set_device_error("")


class Event:
    """A point of a stream, as ``torch.cuda.Event(enable_timing=True)``."""

    def __init__(self) -> None:
        self._event = _native().Event()

    def record(self) -> None:
        """At the current stream's end (what was enqueued on it so far)."""
        self._event.record()

    def query(self) -> bool:
        return self._event.query()

    def synchronize(self) -> None:
        """The host waits until the stream has got here."""
        self._event.synchronize()

    def wait(self) -> None:
        """The current stream waits (on the device) until the event's stream has got here."""
        self._event.wait()

    def elapsed_ns(self, end: Event) -> int:
        """Device time from this event to ``end`` (both recorded; waits until both are reached)."""
        from prism_megatron.replay import timeline

        start_ns, end_ns = timeline.resolve([timeline.Mark(self._event.mark), timeline.Mark(end._event.mark)])
        return end_ns - start_ns
