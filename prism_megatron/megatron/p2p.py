"""Pipeline traffic of a real rank with its neighbouring stages, real or virtual.

ARCHITECTURE.md decision 3: a `P2PCommunicator` subclass overriding `_communicate` (all eight public
send/recv methods go through it, and it already knows the neighbours' global ranks, the shapes and
the dtype) is installed where the schedules look it up. `torch.distributed.isend/irecv` are never
wrapped: `P2POp` checks them by identity.

Per direction, by the neighbour's virtual rank:
- real neighbour: real tensors over the real gloo group (physical ranks), one tag per direction so
  activations and gradients between the same two processes never cross;
- virtual neighbour: a send is consumed; a receive returns a tensor of the requested shape and
  pipeline dtype holding plausible values (see `PlausibleValues`), completed when the replay engine
  says the virtual stage's message arrives.

The overlap path (`batch_p2p_comm=False`, `wait_on_reqs=False`) returns the dict of wait handles the
interleaved schedule expects (`send_next`, `recv_prev`, `send_prev`, `recv_next`); a virtual
handle's `wait()` is where the replay wait happens, as NCCL would wait there.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Callable
from typing import Any

import torch
from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

import prism_megatron.replay as replay
from prism_megatron.megatron.distributed import VirtualWorld
from prism_megatron.megatron.patches import Patch

VERIFIED_ON = ("0.16.1",)

# gloo tags: one per (what, direction of travel) so two real stages' streams never interleave.
TAG_ACTIVATION, TAG_GRADIENT, TAG_SHAPE_FORWARD, TAG_SHAPE_BACKWARD = 7001, 7002, 7003, 7004


def _device() -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )


@dataclasses.dataclass
class PlausibleValues:
    """What a virtual stage sends: the mirror of what this rank sends in the same direction.

    A virtual previous stage sends activations like the ones this rank sends to its next stage, and a
    virtual next stage sends gradients like the ones this rank sends back; until this rank has sent
    one, deterministic normal values stand in (unit variance for activations, a gradient of total
    norm about one). Never uninitialised memory: garbage there made grad norms 1e19 or NaN.
    """

    seed: int
    last_activation: torch.Tensor | None = None
    last_gradient: torch.Tensor | None = None
    num_generated: int = 0

    def fill(self, buffer: torch.Tensor, *, gradient: bool) -> None:
        template = self.last_gradient if gradient else self.last_activation
        with torch.no_grad():
            if template is not None and template.shape == buffer.shape:
                buffer.copy_(template)
                return
            generator = torch.Generator().manual_seed(self.seed * 7919 + self.num_generated)
            self.num_generated += 1
            values = torch.randn(buffer.shape, generator=generator, dtype=torch.float32)
            if gradient:
                values /= math.sqrt(max(buffer.numel(), 1))
            buffer.copy_(values.to(buffer.dtype))

    def remember(self, tensor: torch.Tensor | None, *, gradient: bool) -> None:
        if tensor is None:
            return
        snapshot = tensor.detach().clone()
        if gradient:
            self.last_gradient = snapshot
        else:
            self.last_activation = snapshot


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


class _Completed:
    """Wait handle of an op with a virtual peer: waiting is the replay engine's wait."""

    def __init__(self, complete: Callable[[], None]) -> None:
        self._complete = complete
        self._done = False

    def wait(self) -> bool:
        if not self._done:
            self._done = True
            self._complete()
        return True

    def is_completed(self) -> bool:
        return self._done


def _virtual_p2p(peer: int, direction: str, size_bytes: int) -> Callable[[], None]:
    """When the replay engine is there: completion at its time for this message, else at once."""

    def complete() -> None:
        if hasattr(replay, "record_p2p"):
            replay.record_p2p(peer=peer, direction=direction, size_bytes=size_bytes)
        if hasattr(replay, "p2p_completion_ns") and hasattr(replay, "wait_until_ns"):
            replay.wait_until_ns(replay.p2p_completion_ns(peer, direction, size_bytes))

    return complete


def _nbytes(tensor: torch.Tensor) -> int:
    return tensor.numel() * tensor.element_size()


class PrismP2PCommunicator(P2PCommunicator):
    """`P2PCommunicator` for a real rank among virtual stages (bound to a world by `bind`)."""

    world: VirtualWorld
    values: PlausibleValues
    counts: dict[str, int]

    @classmethod
    def bind(cls, world: VirtualWorld) -> type[PrismP2PCommunicator]:
        """A subclass bound to one virtual world (the schedules construct it with two arguments)."""
        values = PlausibleValues(seed=world.virtual_rank)
        counts: dict[str, int] = {}
        return type(cls.__name__, (cls,), {"world": world, "values": values, "counts": counts})

    def _count(self, key: str) -> None:
        self.counts[key] = self.counts.get(key, 0) + 1

    def _communicate(
        self,
        *,
        tensor_send_next,
        tensor_send_prev,
        recv_prev: bool,
        recv_next: bool,
        tensor_shape,
        wait_on_reqs: bool = True,
    ):
        config = self.config
        if (recv_prev or recv_next) and config.pipeline_dtype is None:
            raise RuntimeError("pipeline_dtype must be provided to receive from a pipeline neighbour")
        prev_shape, next_shape = tensor_shape, tensor_shape
        if config.variable_seq_lengths or config.mtp_standalone:
            prev_shape, next_shape = self._exchange_shapes(
                tensor_send_next, tensor_send_prev, recv_prev, recv_next, tensor_shape
            )
        if (recv_prev and prev_shape is None) or (recv_next and next_shape is None):
            raise RuntimeError("tensor_shape must be given to receive from a pipeline neighbour")
        handles: dict[str, Any] = {}
        recv_prev_tensor = (
            self._recv(self.prev_rank, prev_shape, "recv_prev", TAG_ACTIVATION, False, handles)
            if recv_prev
            else None
        )
        recv_next_tensor = (
            self._recv(self.next_rank, next_shape, "recv_next", TAG_GRADIENT, True, handles)
            if recv_next
            else None
        )
        if tensor_send_next is not None:
            self._send(self.next_rank, tensor_send_next, "send_next", TAG_ACTIVATION, False, handles)
        if tensor_send_prev is not None:
            self._send(self.prev_rank, tensor_send_prev, "send_prev", TAG_GRADIENT, True, handles)
        if config.batch_p2p_comm or wait_on_reqs:
            for handle in handles.values():
                handle.wait()
            reqs: Any = [] if config.batch_p2p_comm or config.use_ring_exchange_p2p else None
            if config.batch_p2p_comm and config.batch_p2p_sync and torch.cuda.is_available():
                torch.cuda.synchronize()
        else:
            reqs = handles
        return recv_prev_tensor, recv_next_tensor, reqs

    def _recv(self, peer: int, shape, key: str, tag: int, gradient: bool, handles: dict) -> torch.Tensor:
        buffer = torch.empty(shape, requires_grad=True, device=_device(), dtype=self.config.pipeline_dtype)
        self._count(key)
        if self.world.is_real(peer):
            handles[key] = self.world.real_group.recv([buffer], self.world.physical_rank_of(peer), tag)
        else:
            self.values.fill(buffer, gradient=gradient)
            handles[key] = _Completed(_virtual_p2p(peer, "recv", _nbytes(buffer)))
        return buffer

    def _send(
        self, peer: int, tensor: torch.Tensor, key: str, tag: int, gradient: bool, handles: dict
    ) -> None:
        self._count(key)
        self.values.remember(tensor, gradient=gradient)
        if self.world.is_real(peer):
            work = self.world.real_group.send([tensor], self.world.physical_rank_of(peer), tag)
            handles[key] = PinnedSend(work, tensor)
        else:
            handles[key] = _Completed(_virtual_p2p(peer, "send", _nbytes(tensor)))

    def _exchange_shapes(self, send_next, send_prev, recv_prev, recv_next, tensor_shape):
        """Variable sequence lengths: real neighbours exchange int64[3] shapes; a virtual one mirrors.

        A virtual previous stage is taken to send the shape this rank sends forward (or
        `tensor_shape`); a virtual next stage returns gradients shaped like this rank's last activation.
        """
        works, buffers = [], {}
        for wanted, peer, key, tag in (
            (recv_prev, self.prev_rank, "prev", TAG_SHAPE_FORWARD),
            (recv_next, self.next_rank, "next", TAG_SHAPE_BACKWARD),
        ):
            if wanted and self.world.is_real(peer):
                buffers[key] = torch.empty(3, dtype=torch.int64)
                works.append(
                    self.world.real_group.recv([buffers[key]], self.world.physical_rank_of(peer), tag)
                )
        for tensor, peer, tag in (
            (send_next, self.next_rank, TAG_SHAPE_FORWARD),
            (send_prev, self.prev_rank, TAG_SHAPE_BACKWARD),
        ):
            if tensor is not None and self.world.is_real(peer):
                shape = torch.tensor(list(tensor.shape), dtype=torch.int64)
                works.append(self.world.real_group.send([shape], self.world.physical_rank_of(peer), tag))
        for work in works:
            work.wait()
        mirror_next = (
            self.values.last_activation.shape if self.values.last_activation is not None else tensor_shape
        )
        mirror_prev = send_next.shape if send_next is not None else tensor_shape
        prev_shape = buffers["prev"].tolist() if "prev" in buffers else mirror_prev
        next_shape = buffers["next"].tolist() if "next" in buffers else mirror_next
        return prev_shape, next_shape


def p2p_patch(world: VirtualWorld) -> Patch:
    """The record installing a communicator bound to `world` where the schedules look it up."""
    return Patch(
        name="megatron.p2p_communicator",
        target="megatron.core.pipeline_parallel.schedules:P2PCommunicator",
        make=lambda original: PrismP2PCommunicator.bind(world),
        verified_on=VERIFIED_ON,
        reason="pipeline sends/receives with virtual stages must return plausible tensors at replayed times; "
        "the schedules build P2PCommunicator through this module global when no communicator is passed "
        "(Megatron-LM's train_step never passes one)",
        count_calls=False,
        signature="(pp_group: torch.distributed.distributed_c10d.ProcessGroup, config: megatron.core.model_parallel_config.ModelParallelConfig)",
    )
