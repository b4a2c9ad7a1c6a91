"""The replay engine's Python face: schedules, iteration marks, costs, waits, the op log.

The engine itself is C++ (``csrc/replay/``, ``prism_megatron._C.replay``): it speaks for every
virtual rank, telling the ``prism`` backend when an op with virtual members completes, and it keeps
the op log (flight recorder and capture-pass recording). This module converts Python types to what
the engine takes and back; it holds no policy.

Every time comes from the device timeline (:mod:`prism_megatron.replay.timeline`): marks where the
program issues work, read after the iteration; host times (``*_ns`` arguments and results below)
are ``CLOCK_MONOTONIC`` ns, the clock of :func:`time.monotonic_ns`. An op with virtual members
completes at ``max(own arrival, virtual members' latest arrival) + cost``; in ``instant`` mode (and
for ops the loaded schedule does not know) the virtual members arrive when the op is issued; in
``replay`` mode they arrive at the schedule's offset from the last :func:`mark_iteration_start`. On
a device (CUDA, the test device) the rule is decided on the device, own arrival being when the
stream gets to the op. The cost is the schedule's ``cost_ns`` when it is >= 0, otherwise the
group's cost lines (:func:`set_group_cost`), else the default lines (:func:`set_default_cost`),
else zero.

The extension is imported on first use, so importing ``prism_megatron.replay.schedule`` (pure data
types) never needs the compiled extension.
"""

from __future__ import annotations

import functools
from collections.abc import Sequence

from prism_megatron.replay.cost import CostLines, CostModel, LatencyBandwidthCost
from prism_megatron.replay.events import OpEvent
from prism_megatron.replay.schedule import CostLine, OpKind, ReplaySchedule, ScheduledOp, cost_ns
from prism_megatron.replay.timeline import Mark

__all__ = [
    "CostLine",
    "CostLines",
    "CostModel",
    "LatencyBandwidthCost",
    "Mark",
    "OpEvent",
    "OpKind",
    "ReplaySchedule",
    "ScheduledOp",
    "cost_ns",
    "device_p2p",
    "flight_recorder_dump",
    "load_schedule",
    "mark_iteration_start",
    "op_activity",
    "p2p_completion_ns",
    "record_p2p",
    "set_default_cost",
    "set_group_cost",
    "set_mode",
    "start_recording",
    "stop_recording",
    "wait_until_ns",
]

MODES = ("instant", "replay")
DIRECTIONS = ("send", "recv")


@functools.cache
def _native():
    import torch  # noqa: F401  (the extension links libc10, which importing torch loads)

    from prism_megatron import _C

    return _C.replay


def _raw_ops(ops: Sequence[ScheduledOp]) -> list[tuple[int, int, int, int]]:
    return [(int(op.kind), op.size_bytes, op.arrival_offset_ns, op.cost_ns) for op in ops]


def _raw_lines(lines: Sequence[CostLine]) -> list[tuple[float, float]]:
    return [(float(line.latency_ns), float(line.ns_per_byte)) for line in lines]


def _check_direction(direction: str) -> bool:
    if direction not in DIRECTIONS:
        raise ValueError(f"direction must be one of {DIRECTIONS}, got {direction!r}")
    return direction == "send"


def set_mode(mode: str) -> None:
    """``"instant"``: virtual peers arrive when an op is issued; ``"replay"``: as the schedule says."""
    if mode not in MODES:
        raise ValueError(f"mode must be one of {MODES}, got {mode!r}")
    _native().set_mode(mode == "replay")


def mode() -> str:
    return "replay" if _native().is_replay_mode() else "instant"


def load_schedule(schedule: ReplaySchedule) -> None:
    """Replace the engine's schedule with ``schedule`` (this process's virtual rank, one iteration)."""
    _native().load_schedule(
        schedule.virtual_rank,
        [(list(members), _raw_ops(ops)) for members, ops in schedule.collectives.items()],
        [
            (peer, _check_direction(direction), _raw_ops(ops))
            for (peer, direction), ops in schedule.p2p.items()
        ],
        schedule.iteration_time_ns,
    )


def mark_iteration_start() -> Mark:
    """A training iteration starts now; returns its start's mark on the device timeline.

    Arrival offsets count from here and every group's op index restarts at 0. On a device the mark
    is on the current stream: device waits read the start from its slot, so they count their
    arrival offsets from when the device got there.
    """
    return Mark(_native().mark_iteration_start())


def iteration_start_ns() -> int:
    """The last :func:`mark_iteration_start` on the host clock, or -1 before the first."""
    return _native().iteration_start_ns()


def set_group_cost(members: Sequence[int], kind: OpKind, lines: Sequence[CostLine]) -> None:
    """Cost lines for ops of ``kind`` on the group ``members`` (global virtual ranks, group order)."""
    if not lines:
        raise ValueError("set_group_cost needs at least one CostLine")
    _native().set_group_cost(list(members), int(kind), _raw_lines(lines))


def set_default_cost(lines: Sequence[CostLine]) -> None:
    """Cost lines for groups without their own; an empty sequence means zero cost."""
    _native().set_default_cost(_raw_lines(lines))


def group_cost_ns(members: Sequence[int], kind: OpKind, size_bytes: int) -> int:
    """What the engine charges for an op of ``kind`` and ``size_bytes`` on ``members`` (lines only)."""
    return _native().cost_ns(list(members), int(kind), size_bytes)


def p2p_completion_ns(peer_virtual_rank: int, direction: str, size_bytes: int) -> int:
    """When a send to / recv from a virtual peer issued now completes (absolute CLOCK_MONOTONIC ns).

    For the pipeline interceptor on the host. Advances that (peer, direction)'s op index. Raises
    RuntimeError when the op differs from the schedule's.
    """
    return _native().p2p_completion_ns(peer_virtual_rank, _check_direction(direction), size_bytes)


def device_p2p(
    *,
    self_rank: int,
    peer_virtual_rank: int,
    direction: str,
    size_bytes: int,
    dtype: str,
    async_op: bool = True,
):
    """A send to / recv from a virtual peer on the device, issued now (the pipeline interceptor's).

    It is timed on a stream of its own after the current stream's work (own arrival: when the device
    gets there) and logged with device marks; its ``wait()`` makes the caller's stream wait for it,
    never the host, and ``is_completed()`` asks the device. Advances the (peer, direction)'s op index
    like :func:`p2p_completion_ns`. Raises ValueError without a device, RuntimeError when the op
    differs from the schedule's.
    """
    is_send = _check_direction(direction)
    return _native().device_p2p(self_rank, peer_virtual_rank, is_send, size_bytes, dtype, async_op)


def wait_until_ns(t_ns: int) -> None:
    """Block the program until ``t_ns`` (CLOCK_MONOTONIC ns), GIL released: a peer's time. C++ sleep
    then spin, or, where the process owns its core (``backend.activate(poll_real_waits=True)``),
    yield then spin without giving the core up (`clock::await_until_ns`)."""
    _native().wait_until_ns(t_ns)


def flight_recorder_dump() -> str:
    """The last ops of this process (oldest first) with their state and times."""
    return _native().flight_recorder_dump()


def op_activity() -> tuple[int, int]:
    """(ops issued plus ops settled by this process so far, `time.monotonic_ns()` of the last of
    them, 0 before the first): the count grows while the process makes progress through its ops.
    The rank watchdog reads it; cheap, never blocks on an op."""
    count, last_ns = _native().op_activity()
    return int(count), int(last_ns)


def set_flight_recorder_capacity(num_ops: int) -> None:
    if num_ops < 1:
        raise ValueError(f"the flight recorder keeps at least one op, got {num_ops}")
    _native().set_flight_recorder_capacity(num_ops)


def start_recording() -> None:
    """Record every op from now on (the capture pass); :func:`stop_recording` returns them."""
    _native().start_recording()


def stop_recording(timeout_s: float | None = None) -> list[OpEvent]:
    """The ops issued since :func:`start_recording`, in issue order; recording stops.

    Their device marks are read here: this waits until the device has passed each (at most
    ``timeout_s`` per mark, default the timeline's timeout).
    """
    from prism_megatron.replay import timeline

    seconds = timeline._timeout_s if timeout_s is None else timeout_s
    events = [OpEvent.from_native(raw) for raw in _native().stop_recording(round(seconds * 1e9))]
    return [e.on_timeline() for e in events]


def record_p2p(
    *,
    kind: OpKind,
    self_rank: int,
    peer: int,
    size_bytes: int,
    dtype: str,
    issue: Mark,
    complete: Mark | None,
    async_op: bool = True,
    has_virtual: bool = True,
    seq: int | None = None,
    wait: Mark | None = None,
) -> None:
    """Log a p2p op served outside the backend (the pipeline interceptor); same fields as OpEvent.

    ``issue``, ``complete`` and ``wait`` are marks on the device timeline (``complete`` None: not
    completed; ``wait``, where the program began to wait on it, None: not recorded); the op's start
    is its issue. ``seq`` None: the next sequence number of the (peer, direction),
    shared with the backend's own send/recv.
    """
    if kind not in (OpKind.SEND, OpKind.RECV):
        raise ValueError(f"record_p2p kind must be OpKind.SEND or OpKind.RECV, got {kind!r}")
    _native().record_p2p(
        int(kind),
        self_rank,
        peer,
        -1 if seq is None else seq,
        size_bytes,
        dtype,
        0,
        0,
        -1,
        async_op,
        has_virtual,
        issue.id,
        -1 if complete is None else complete.id,
        -1 if wait is None else wait.id,
    )


def reset(*, keep_log: bool = False) -> None:
    """Forget schedule, costs, counters and mode (back to instant); clear the op log unless keep_log."""
    _native().reset_engine()
    if not keep_log:
        _native().clear_log()
