"""The replay engine's Python face: schedules, iteration marks, costs, waits, the op log.

The engine itself is C++ (``csrc/replay/``, ``prism_megatron._C.replay``): it speaks for every
virtual rank, telling the ``prism`` backend when an op with virtual members completes, and it keeps
the op log (flight recorder and capture-pass recording). This module converts Python types to what
the engine takes and back; it holds no policy.

Time is ``CLOCK_MONOTONIC`` in ns, the clock of :func:`time.monotonic_ns`. An op with virtual
members completes at ``max(own arrival, virtual members' latest arrival) + cost``; in ``instant``
mode (and for ops the loaded schedule does not know) the virtual members arrive when the op is
issued; in ``replay`` mode they arrive at the schedule's offset from the last
:func:`mark_iteration_start`. The cost is the schedule's ``cost_ns`` when it is >= 0, otherwise the
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

__all__ = [
    "CostLine",
    "CostLines",
    "CostModel",
    "LatencyBandwidthCost",
    "OpEvent",
    "OpKind",
    "ReplaySchedule",
    "ScheduledOp",
    "cost_ns",
    "flight_recorder_dump",
    "load_schedule",
    "mark_iteration_start",
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


def mark_iteration_start() -> int:
    """A training iteration starts now; returns its start (CLOCK_MONOTONIC ns).

    Arrival offsets count from here and every group's op index restarts at 0. When CUDA is in use,
    the start is also stamped on the device timer, on the current stream: device waits count their
    arrival offsets from when the device gets there.
    """
    start_ns = _native().mark_iteration_start()
    if hasattr(_native(), "cuda_stamp_iteration_start") and _cuda_in_use():
        _native().cuda_stamp_iteration_start()
    return start_ns


def _cuda_in_use() -> bool:
    import torch

    return torch.cuda.is_available() and torch.cuda.is_initialized()


def iteration_start_ns() -> int:
    """The last :func:`mark_iteration_start`, or -1 before the first."""
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

    For the pipeline interceptor. Advances that (peer, direction)'s op index. Raises RuntimeError
    when the op differs from the schedule's.
    """
    return _native().p2p_completion_ns(peer_virtual_rank, _check_direction(direction), size_bytes)


def wait_until_ns(t_ns: int) -> None:
    """Block until ``t_ns`` (CLOCK_MONOTONIC ns): C++ sleep then spin, GIL released."""
    _native().wait_until_ns(t_ns)


def flight_recorder_dump() -> str:
    """The last ops of this process (oldest first) with their state and times."""
    return _native().flight_recorder_dump()


def set_flight_recorder_capacity(num_ops: int) -> None:
    if num_ops < 1:
        raise ValueError(f"the flight recorder keeps at least one op, got {num_ops}")
    _native().set_flight_recorder_capacity(num_ops)


def start_recording() -> None:
    """Record every op from now on (the capture pass); :func:`stop_recording` returns them."""
    _native().start_recording()


def stop_recording() -> list[OpEvent]:
    """The ops issued since :func:`start_recording`, in issue order; recording stops."""
    return [OpEvent.from_native(raw) for raw in _native().stop_recording()]


def record_p2p(
    *,
    kind: OpKind,
    self_rank: int,
    peer: int,
    size_bytes: int,
    dtype: str,
    issue_ns: int,
    start_ns: int,
    complete_ns: int,
    async_op: bool = True,
    has_virtual: bool = True,
    seq: int | None = None,
) -> None:
    """Log a p2p op served outside the backend (the pipeline interceptor); same fields as OpEvent.

    ``seq`` None: the next sequence number of the (peer, direction), shared with the backend's own
    send/recv. ``complete_ns`` -1: not completed.
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
        issue_ns,
        start_ns,
        complete_ns,
        async_op,
        has_virtual,
    )


def reset(*, keep_log: bool = False) -> None:
    """Forget schedule, costs, counters and mode (back to instant); clear the op log unless keep_log."""
    _native().reset_engine()
    if not keep_log:
        _native().clear_log()
