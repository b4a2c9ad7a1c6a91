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

import collections
from typing import Any

import torch
from megatron.core.pipeline_parallel.p2p_communication import P2PCommunicator

from prism_megatron.passes.world import VirtualWorld
from prism_megatron.patches.pipeline_ops import PlausibleValues, RealPeerOp, Transfer, VirtualPeerOp
from prism_megatron.patches.registry import Patch
from prism_megatron.patches.versions import EVERY_VERIFIED
from prism_megatron.replay import OpKind

# gloo tags: one per (what, direction of travel) so two real stages' streams never interleave.
TAG_ACTIVATION, TAG_GRADIENT, TAG_SHAPE_FORWARD, TAG_SHAPE_BACKWARD = 7001, 7002, 7003, 7004


def _device() -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )


class PrismP2PCommunicator(P2PCommunicator):
    """`P2PCommunicator` for a real rank among virtual stages (bound to a world by `bind`)."""

    world: VirtualWorld
    values: PlausibleValues
    counts: dict[str, int]
    """Transfers per key (`recv_prev`, ...) and per key and kind of peer (`recv_prev.real`, ...)."""
    checksums: dict[str, float]
    """Sum of the data of every completed transfer with a real peer, per key."""
    forward_shapes: collections.deque
    """Shapes sent forward whose gradients have not come back (variable sequence lengths only)."""

    @classmethod
    def bind(cls, world: VirtualWorld) -> type[PrismP2PCommunicator]:
        """A subclass bound to one virtual world (the schedules construct it with two arguments)."""
        values = PlausibleValues(seed=world.virtual_rank)
        state = {
            "world": world,
            "values": values,
            "counts": {},
            "checksums": {},
            "forward_shapes": collections.deque(),
        }
        return type(cls.__name__, (cls,), state)

    def _count(self, key: str, peer: int) -> None:
        for name in (key, f"{key}.{'real' if self.world.is_real(peer) else 'virtual'}"):
            self.counts[name] = self.counts.get(name, 0) + 1

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
            self._send(self.next_rank, tensor_send_next, "send_next", TAG_ACTIVATION, handles)
        if tensor_send_prev is not None:
            self._send(self.prev_rank, tensor_send_prev, "send_prev", TAG_GRADIENT, handles)
        if config.batch_p2p_comm or wait_on_reqs:
            for handle in handles.values():
                handle.wait_in_call()
            reqs: Any = [] if config.batch_p2p_comm or config.use_ring_exchange_p2p else None
            if config.batch_p2p_comm and config.batch_p2p_sync and torch.cuda.is_available():
                torch.cuda.synchronize()
        else:
            reqs = handles
        return recv_prev_tensor, recv_next_tensor, reqs

    def _transfer(self, kind: OpKind, peer: int, tensor: torch.Tensor) -> Transfer:
        async_op = not self.config.batch_p2p_comm
        return Transfer(
            kind=kind, self_rank=self.world.virtual_rank, peer=peer, tensor=tensor, async_op=async_op
        )

    def _recv(self, peer: int, shape, key: str, tag: int, gradient: bool, handles: dict) -> torch.Tensor:
        buffer = torch.empty(shape, requires_grad=True, device=_device(), dtype=self.config.pipeline_dtype)
        self._count(key, peer)
        transfer = self._transfer(OpKind.RECV, peer, buffer)
        if self.world.is_real(peer):
            work = self.world.real_group.recv([buffer], self.world.physical_rank_of(peer), tag)
            handles[key] = RealPeerOp(work, transfer, self.checksums, key)
        else:
            self.values.fill(buffer, gradient=gradient)
            handles[key] = VirtualPeerOp(transfer)
        return buffer

    def _send(self, peer: int, tensor: torch.Tensor, key: str, tag: int, handles: dict) -> None:
        self._count(key, peer)
        transfer = self._transfer(OpKind.SEND, peer, tensor)
        if self.world.is_real(peer):
            work = self.world.real_group.send([tensor], self.world.physical_rank_of(peer), tag)
            handles[key] = RealPeerOp(work, transfer, self.checksums, key)
        else:
            handles[key] = VirtualPeerOp(transfer)

    def _exchange_shapes(self, send_next, send_prev, recv_prev, recv_next, tensor_shape):
        """Variable sequence lengths: real neighbours exchange int64[3] shapes; a virtual one mirrors.

        A virtual previous stage sends `tensor_shape` (or the shape this rank sends forward); a virtual
        next stage returns each gradient shaped like the activation this rank sent it, first in first
        out, as the schedules consume them.
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
        if send_next is not None:
            self.forward_shapes.append(list(send_next.shape))
        virtual_prev_shape = tensor_shape if tensor_shape is not None else self._last_forward_shape(send_next)
        prev_shape = buffers["prev"].tolist() if "prev" in buffers else virtual_prev_shape
        next_shape = buffers["next"].tolist() if "next" in buffers else None
        if recv_next and next_shape is None:
            next_shape = self.forward_shapes.popleft() if self.forward_shapes else tensor_shape
        return prev_shape, next_shape

    def _last_forward_shape(self, send_next):
        if send_next is not None:
            return list(send_next.shape)
        return self.forward_shapes[-1] if self.forward_shapes else None


def _communicator(original: Any, *, world: VirtualWorld) -> type[PrismP2PCommunicator]:
    return PrismP2PCommunicator.bind(world)


P2P_COMMUNICATOR = Patch(
    name="megatron.p2p_communicator",
    target="megatron.core.pipeline_parallel.schedules:P2PCommunicator",
    make=_communicator,
    needs=("world",),
    verified_on=EVERY_VERIFIED,
    reason="pipeline sends/receives with virtual stages must return plausible tensors at replayed times; "
    "the schedules build P2PCommunicator through this module global when no communicator is passed "
    "(Megatron-LM's train_step never passes one)",
    count_calls=False,
    signature="(pp_group: torch.distributed.distributed_c10d.ProcessGroup, config: megatron.core.model_parallel_config.ModelParallelConfig)",
)
"""Installs a communicator bound to the run's virtual world where the schedules look it up."""
