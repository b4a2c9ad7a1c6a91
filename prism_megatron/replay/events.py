"""Recorded communication ops: what the capture pass hands to the execution-graph builder.

The backend logs every op it serves (C++ op log, ``csrc/replay/op_log.h``); while recording is on,
the log keeps them all and :func:`prism_megatron.replay.stop_recording` exports them as ``OpEvent``s.
The pipeline interceptor adds the p2p ops it serves itself through
:func:`prism_megatron.replay.record_p2p`, with the same fields.

Message sizes follow the nccl-tests convention (the largest buffer the op touches on this rank):
all-reduce, broadcast, reduce, send, recv: the tensor(s); all-gather and gather: the gathered output
(group size x input); reduce-scatter and scatter: the whole input (group size x output); all-to-all:
the input; barrier: 0.
"""

from __future__ import annotations

import dataclasses

from prism_megatron.replay.schedule import OpKind


@dataclasses.dataclass(frozen=True, slots=True)
class OpEvent:
    """One communication op as this process issued it.

    Attributes:
        kind: the op kind.
        group: the group's members (global virtual ranks, group order); for p2p ``(self, peer)``.
        peer: the p2p peer's virtual rank; -1 for collectives.
        seq: the op's sequence number on its group (p2p: among the ops to / from that peer in that
            direction), counted from 0 since activation.
        size_bytes: message size (see the module docstring for which buffer).
        dtype: the element type as torch names it (``"Float"``, ``"BFloat16"``, ``"Long"``, ...).
        issue_ns: when the program issued it (CLOCK_MONOTONIC ns, as :func:`time.monotonic_ns`).
        start_ns: when every member had arrived (for ops with virtual members, as the replay engine
            says; for all-real ops, the issue time).
        complete_ns: when it completed (-1: it had not when recording stopped).
        async_op: the program issued it with ``async_op=True`` (send and recv always count as async:
            the backend cannot tell ``send`` from ``isend``).
        has_virtual: a member (for p2p: the peer) is virtual.
        real_done_ns: when the op's real part (its work among the real members) was seen complete,
            on the host path; -1 when it has none, or on a device. With virtual members too, the
            op completes later still, at the replay engine's time; this is what the real members
            took.
        engine_done_ns: when the replay engine completed it (its virtual members' arrival in the
            replay schedule plus its cost), on the host path; -1 without virtual members, for an op
            no schedule holds (the capture pass), or on a device. Where the program asked for the
            op later than that, it saw it complete later (`complete_ns`): the host work in between
            (torch's Python after the issue, the local part) is the program's, and the graph gives
            it to the compute after the op (`graph.capture`).
        wait_ns: when the program first waited on it (``Work.wait``; in a coalesced batch, each
            op's wait begins when the batch's wait reaches it), on the host path; -1 where it never
            did (it asked through ``is_completed`` or a future), for the p2p ops the pipeline
            interceptor serves itself (`record_p2p`), or on a device. An async op's compute stream
            stops here, not at the completion: a wait that returned late was waiting, not computing.
    """

    kind: OpKind
    group: tuple[int, ...]
    peer: int
    seq: int
    size_bytes: int
    dtype: str
    issue_ns: int
    start_ns: int
    complete_ns: int
    async_op: bool
    has_virtual: bool
    real_done_ns: int = -1
    engine_done_ns: int = -1
    wait_ns: int = -1

    def on_timeline(self) -> OpEvent:
        """The event with its times read on the device timeline (a modelled GPU's time, where one is
        in use: `timeline.set_time_map`); -1 (not completed) stays."""
        from prism_megatron.replay import timeline

        if timeline._time_map is None:
            return self
        issue, start = timeline.map_time(self.issue_ns), timeline.map_time(self.start_ns)
        complete = self.complete_ns if self.complete_ns < 0 else timeline.map_time(self.complete_ns)
        wait = self.wait_ns if self.wait_ns < 0 else timeline.map_time(self.wait_ns)
        # A modelled device's ops complete at its modelled times; host work has no place there.
        return dataclasses.replace(
            self, issue_ns=issue, start_ns=start, complete_ns=complete, engine_done_ns=-1, wait_ns=wait
        )

    @classmethod
    def from_native(cls, raw: tuple) -> OpEvent:
        """Build from the tuple the C++ op log exports (same field order)."""
        kind, group, *rest = raw
        return cls(OpKind(kind), tuple(group), *rest)
