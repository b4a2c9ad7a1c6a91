"""The pipeline interceptor's ops: what a virtual stage sends, and the wait handles of each transfer.

Kept apart from the communicator so the communicator reads as routing only. Every transfer the
interceptor serves is logged to the replay engine's op log (`replay.record_p2p`), since it never
passes through the backend: the capture pass needs them to build the execution graph.
"""

from __future__ import annotations

import dataclasses
import math
from typing import Any

import torch

import prism_megatron.replay as replay
from prism_megatron.replay import OpKind, timeline
from prism_megatron.replay.timeline import Mark

# c10's scalar type names, as the backend's op log writes them.
_C10_DTYPE_NAMES = {
    torch.float32: "Float",
    torch.float16: "Half",
    torch.bfloat16: "BFloat16",
    torch.float64: "Double",
    torch.int64: "Long",
    torch.int32: "Int",
    torch.uint8: "Byte",
}


TILE_ELEMENTS = 1024
"""Elements of a virtual stage's message drawn at random; the rest repeat them (`PlausibleValues.fill`)."""


@dataclasses.dataclass
class PlausibleValues:
    """What a virtual stage sends: deterministic values of a plausible scale, never garbage.

    Activations from a virtual previous stage are standard normal (the scale of a transformer's
    residual stream); gradients from a virtual next stage are normal with a total norm of about one.
    Values are drawn in place into the receive buffer from a generator reseeded per (rank, kind), so
    each receive gets the same values and nothing is allocated that the real rank would not hold.

    Why not mirror what this rank sends: a stage fed its own output (or its own outgoing gradient)
    is a feedback loop through the layers; at W=8192 it grew the grad norm a hundredfold per
    iteration. Uninitialised memory is worse: it gave grad norms of 1e19 or NaN.
    """

    seed: int
    generators: dict[torch.device, torch.Generator] = dataclasses.field(default_factory=dict)

    def fill(self, buffer: torch.Tensor, *, gradient: bool) -> None:
        """Draw the first `TILE_ELEMENTS` in place and repeat them over the rest of the buffer.

        Why a tile: drawing every element of a 128 KiB activation made an exchange with a virtual
        stage cost the host more than the real gloo exchange it stands for (`benchmarks/overhead/
        exchange.py`: 1.2x on a 2-core machine; with the tile, half of it); copying a drawn tile costs
        what gloo's own copy into the buffer does. Each element still comes from the same normal,
        so the scale and the gradient's norm are unchanged.
        """
        generator = self.generators.get(buffer.device)
        if generator is None:
            generator = self.generators[buffer.device] = torch.Generator(device=buffer.device)
        generator.manual_seed(self.seed * 2 + int(gradient))
        numel = buffer.numel()
        std = 1.0 / math.sqrt(max(numel, 1)) if gradient else 1.0
        with torch.no_grad():
            flat = buffer.view(-1)
            if numel <= TILE_ELEMENTS:
                flat.normal_(0.0, std, generator=generator)
                return
            tile = flat[:TILE_ELEMENTS]
            tile.normal_(0.0, std, generator=generator)
            num_tiles = numel // TILE_ELEMENTS
            flat[TILE_ELEMENTS : num_tiles * TILE_ELEMENTS].view(num_tiles - 1, TILE_ELEMENTS).copy_(tile)
            rest = numel - num_tiles * TILE_ELEMENTS
            if rest:
                flat[num_tiles * TILE_ELEMENTS :].copy_(flat[:rest])


class PinnedSend:
    """A send request that keeps the sent storage alive until waited on.

    The schedules free a stage's output right after issuing its send (`deallocate_output_tensor`
    swaps `out.data` for a 1-element tensor). On CUDA the caching allocator cannot hand that memory
    out before the communication stream is done with it; gloo on the CPU reads the buffer from its own
    thread later, so without a pin it reads freed memory (NaN losses were seen with the interleaved
    schedule). Holding a reference until `wait()` restores the CUDA lifetime.
    """

    def __init__(self, work: Any, tensor: torch.Tensor) -> None:
        self._work = work
        self._pinned: torch.Tensor | None = tensor.data

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        result = self._work.wait(*args, **kwargs)
        self._pinned = None
        return result

    def is_completed(self) -> bool:
        return self._work.is_completed()


@dataclasses.dataclass
class Transfer:
    """One send or recv of this rank with a pipeline neighbour, as the op log records it."""

    kind: OpKind
    self_rank: int
    peer: int
    tensor: torch.Tensor
    async_op: bool
    issue: Mark = dataclasses.field(default_factory=timeline.mark)
    """Where the program issued it, on the device timeline."""
    size_bytes: int = dataclasses.field(init=False)
    """The message's bytes."""
    dtype: str = dataclasses.field(init=False)
    """Its element type as c10 names it. Both are read once: on the CPU every tensor query passes
    through the device shim's torch function mode, host time on the exchange's hot path."""

    def __post_init__(self) -> None:
        self.size_bytes = self.tensor.nbytes
        dtype = self.tensor.dtype
        name = _C10_DTYPE_NAMES.get(dtype)
        self.dtype = name if name is not None else str(dtype)

    @property
    def direction(self) -> str:
        return "send" if self.kind == OpKind.SEND else "recv"

    def log(self, *, complete: Mark, has_virtual: bool, wait: Mark | None = None) -> None:
        """Log the transfer; `wait` is where the program began to wait on it (graph/capture.py keeps a
        transfer waited after its pipeline call returned, megatron-core's overlapped p2p, async)."""
        replay.record_p2p(
            kind=self.kind,
            self_rank=self.self_rank,
            peer=self.peer,
            size_bytes=self.size_bytes,
            dtype=self.dtype,
            issue=self.issue,
            complete=complete,
            async_op=self.async_op,
            has_virtual=has_virtual,
            wait=wait,
        )


def _wait_mark() -> Mark | None:
    """Where the program begins to wait on a transfer, recorded where the capture is to keep a
    transfer waited after its pipeline call returned apart from the call (graph/capture.py): on a GPU
    and a modelled GPU, where NCCL moves it on streams of its own beside the compute. On the CPU device
    a transfer is gloo's work on the cores the compute runs on, so it stays in its call (None): run
    beside the compute instead, the sleep-compute fidelity suite's interleaved case (PP8 x DP2, VPP2)
    went from -0.02 % to -2.15 % and its straggler case from +1.90 % to +0.98 % (2026-12-06)."""
    if timeline.device_name() == "host" and not timeline.modelled():
        return None
    return timeline.mark()


_NOT_WAITED: dict[int, RealPeerOp | VirtualPeerOp] = {}
"""Transfers posted and not yet waited on (and so not yet logged), by id."""


def settle_unwaited() -> int:
    """Wait for, and so log, every pipeline transfer the program posted and never waited on; returns
    how many. Called where a training step ends, before its op log is read: with overlapped p2p,
    megatron-core's interleaved schedule never waits its last forward send, and a transfer logged
    only when waited would be missing from the capture (its stage's receiver then waits forever in
    the simulation). The receiver took it long before the step ended, so this does not block."""
    pending = list(_NOT_WAITED.values())
    for op in pending:
        op.wait()
    return len(pending)


class VirtualPeerOp:
    """A transfer with a virtual stage: it completes when the replay engine says, and `wait()` waits.

    The completion is decided at issue (that also advances the engine's op index for the
    (peer, direction)); waiting happens where the schedule waits, as it would on NCCL. On the host
    `wait()` blocks until the completion time; on a device (CUDA, the test device) the transfer is
    timed on a stream of its own and `wait()` makes the caller's stream wait, never the host
    (`replay.device_p2p`, which also logs it).
    """

    def __init__(self, transfer: Transfer) -> None:
        self._transfer = transfer
        self._device_op = None
        if timeline.device_name() != "host":
            self._device_op = replay.device_p2p(
                self_rank=transfer.self_rank,
                peer_virtual_rank=transfer.peer,
                direction=transfer.direction,
                size_bytes=transfer.size_bytes,
                dtype=transfer.dtype,
                async_op=transfer.async_op,
            )
        else:
            self._complete_ns = replay.p2p_completion_ns(
                transfer.peer, transfer.direction, transfer.size_bytes
            )
            _NOT_WAITED[id(self)] = self
        self._done = False

    def wait(self, *args: Any, **kwargs: Any) -> bool:
        return self._wait(in_call=False)

    def wait_in_call(self) -> bool:
        """The wait the pipeline call itself makes before it returns (no overlap): no wait is
        recorded, so the capture keeps the transfer in its call whatever the clock's resolution."""
        return self._wait(in_call=True)

    def _wait(self, *, in_call: bool) -> bool:
        if not self._done:
            self._done = True
            if self._device_op is not None:
                self._device_op.wait(record_wait=not in_call)
            else:
                waited = None if in_call else _wait_mark()
                replay.wait_until_ns(self._complete_ns)
                self._transfer.log(
                    complete=timeline.mark_at(self._complete_ns), has_virtual=True, wait=waited
                )
                _NOT_WAITED.pop(id(self), None)
        return True

    def is_completed(self) -> bool:
        if self._device_op is not None:
            return self._device_op.is_completed()
        return self._done


class RealPeerOp:
    """A transfer with a real stage over the real gloo group; logged and summed when it completes.

    Pins the tensor's storage until waited on (see `PinnedSend`). The sum of every completed transfer
    is kept per direction so two real stages can show they exchanged the same data.
    """

    def __init__(self, work: Any, transfer: Transfer, checksums: dict[str, float], key: str) -> None:
        self._work = work
        self._transfer = transfer
        self._data: torch.Tensor | None = transfer.tensor.data
        self._checksums = checksums
        self._key = key
        _NOT_WAITED[id(self)] = self

    def wait(self, *args: Any, **kwargs: Any) -> Any:
        return self._wait(args, kwargs, in_call=False)

    def wait_in_call(self) -> Any:
        """As `VirtualPeerOp.wait_in_call`."""
        return self._wait((), {}, in_call=True)

    def _wait(self, args: tuple, kwargs: dict, *, in_call: bool) -> Any:
        waited = _wait_mark() if self._data is not None and not in_call else None
        result = self._work.wait(*args, **kwargs)
        if self._data is not None:
            self._checksums[self._key] = self._checksums.get(self._key, 0.0) + float(
                self._data.double().sum()
            )
            self._data = None
            self._transfer.log(complete=timeline.mark(), has_virtual=False, wait=waited)
            _NOT_WAITED.pop(id(self), None)
        return result

    def is_completed(self) -> bool:
        return self._work.is_completed()
