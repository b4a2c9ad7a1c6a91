"""Context-parallel attention over a point-to-point ring: Transformer Engine's `--cp-comm-type p2p`.

The sequence is split into 2 x CP chunks and CP rank r holds chunks r and 2CP-1-r (megatron-core's
`get_batch_on_this_cp_rank`), so under a causal mask every rank has the same work. Keys and values go
round the CP group in CP steps, as Transformer Engine's `AttnFuncWithCPAndKVP2P` sends them:

* forward: the rank's keys and values, flattened into one message of k.numel() + v.numel() elements,
  are sent to the next CP rank and the previous rank's received, CP - 1 times; step i computes with
  the keys and values of CP rank r - i. Step 0 is causal within the rank's two chunks; a step whose
  keys come from an earlier rank (i <= r) attends to their first chunk only; a later rank's keys
  (i > r) are seen only by the rank's second chunk.
* backward: the same keys and values go round the other way (to the previous rank, from the next),
  visiting the blocks in reverse, and the gradient of each rank's keys and values travels with them:
  step 0 sends the keys and values alone, steps 1 .. CP-2 send keys, values and the gradient so far
  in one message of twice the size, and the last step sends the gradient alone, which arrives at its
  owner complete.
* Every exchange posts the send and the receive together, the even CP ranks send first and the odd
  ones receive first; with CP = 2 on a GPU older than Blackwell (and on a CPU, where the emulated
  target is taken to be Hopper) or with NVTE_BATCH_MHA_P2P_COMM set, both go in one
  `batch_isend_irecv`, otherwise as separate `isend` / `irecv`.

What is kept for the backward is what Transformer Engine keeps: the queries, the last keys and values
received, the output and the log-sum-exp.

On a modelled GPU (fake tensors, `attention_blocks.outputs_only`) the ring sends and waits exactly as
above, and what runs between the exchanges is what Transformer Engine launches there, charged kernel
by kernel and not worked out (nothing to compute on fake tensors; a 16-way ring runs hundreds of ops
a layer otherwise): per step one flash-attention kernel, whose output and log-sum-exp it keeps in the
input's dtype (`out_per_step`); the log-sum-exp merged step by step (a clone, then one jit-fused
correction each: read both, write one) and the outputs merged after the ring (one fused correction
per step: the step's output and the log-sum-exp in, the output read and written, written alone at
the first step); backward, per step one flash-attention backward kernel (which works out the row sums
of dO * O itself) and the gradients accumulated in the input's dtype, copied at the first step and
added after (read two, write one). Transformer Engine's `AttnFuncWithCPAndKVP2P` and its
`flash_attn_fwd_*_correction` functions (`attention/dot_product_attention/context_parallel.py`).
"""

from __future__ import annotations

import dataclasses
import math
import os

import torch
import torch.distributed as dist

from prism_megatron.megatron.layers import all_to_all, attention_blocks
from prism_megatron.megatron.layers.attention_blocks import (
    BlockMask,
    Merge,
    block_backward,
    block_forward,
    delta,
)

_BLACKWELL = (10, 0)
_HOPPER = (9, 0)


@dataclasses.dataclass(frozen=True)
class Ring:
    """A CP group seen from one of its ranks: who it sends to and receives from, and how."""

    group: dist.ProcessGroup
    rank: int
    """This rank's index in the ring."""
    size: int
    next_rank: int
    """Global rank the forward sends to (and the backward receives from)."""
    prev_rank: int
    batched: bool
    """Send and receive in one `batch_isend_irecv` (Transformer Engine's rule, see the module doc)."""

    @classmethod
    def of(cls, group: dist.ProcessGroup, global_ranks: list[int], stride: int = 1, offset: int = 0) -> Ring:
        """The ring of `group` (size CP) whose members are `global_ranks[i * stride + offset]`: stride 1
        for plain CP; the a2a group's size and rank for the ring of hierarchical CP (a2a+p2p)."""
        rank, size = dist.get_rank(group=group), dist.get_world_size(group=group)
        return cls(
            group=group,
            rank=rank,
            size=size,
            next_rank=global_ranks[(rank + 1) % size * stride + offset],
            prev_rank=global_ranks[(rank - 1) % size * stride + offset],
            batched=batch_p2p(size),
        )


def batch_p2p(cp_size: int) -> bool:
    """Transformer Engine's choice: batched when NVTE_BATCH_MHA_P2P_COMM is set, or CP = 2 before sm100."""
    if int(os.getenv("NVTE_BATCH_MHA_P2P_COMM", "0")):
        return True
    capability = torch.cuda.get_device_capability() if torch.cuda.is_available() else _HOPPER
    return cp_size == 2 and tuple(capability) < _BLACKWELL


def exchange(ring: Ring, send: torch.Tensor, dst: int, recv: torch.Tensor, src: int) -> list:
    """Post one send and one receive in Transformer Engine's order; returns what to wait on."""
    if ring.batched:
        ops = [
            dist.P2POp(dist.isend, send, dst, ring.group),
            dist.P2POp(dist.irecv, recv, src, ring.group),
        ]
        return dist.batch_isend_irecv(ops if ring.rank % 2 == 0 else ops[::-1])
    if ring.rank % 2 == 0:
        return [dist.isend(send, dst, ring.group), dist.irecv(recv, src, ring.group)]
    received = dist.irecv(recv, src, ring.group)
    return [received, dist.isend(send, dst, ring.group)]


def _wait(requests: list) -> None:
    for request in requests:
        request.wait()


@dataclasses.dataclass(frozen=True)
class _Step:
    """Which part of a step's block is computed: the query rows and how many key rows."""

    rows: slice
    key_rows: slice
    mask: BlockMask


def _step(step: int, ring: Ring, half: int, causal: bool, dropout_p: float, seed: int) -> _Step:
    """Forward step `step` on this rank (keys and values of ring rank `ring.rank - step`)."""
    everything = slice(None)
    if not causal:
        return _Step(everything, everything, BlockMask(False, dropout_p, seed))
    if step == 0:
        return _Step(everything, everything, BlockMask(True, dropout_p, seed))
    if step <= ring.rank:
        return _Step(everything, slice(0, half), BlockMask(False, dropout_p, seed))
    return _Step(slice(half, None), everything, BlockMask(False, dropout_p, seed))


def _split(kv: torch.Tensor, k_shape: torch.Size, v_shape: torch.Size) -> tuple[torch.Tensor, torch.Tensor]:
    k_numel = k_shape.numel()
    return kv[:k_numel].view(k_shape), kv[k_numel:].view(v_shape)


def _rows(part: slice, num_rows: int) -> int:
    return len(range(num_rows)[part])


def _bytes(*shape: int, dtype: torch.dtype) -> int:
    return math.prod(shape) * dtype.itemsize


def _charge(num_bytes: int) -> None:
    """One memory-bound kernel on the modelled GPU: nothing runs, its time is charged."""
    with attention_blocks.memory_kernel(num_bytes):
        pass


def _backward_buffers(kv: torch.Tensor) -> list[torch.Tensor]:
    """The backward's two [2, kv] buffers (keys and values, their gradient), the first holding `kv`."""
    buffers = [kv.new_empty((2, kv.numel())), kv.new_empty((2, kv.numel()))]
    buffers[0][0].copy_(kv)
    return buffers


def _backward_step(ctx, i: int, half: int) -> _Step:
    """Backward step `i` is forward step CP - 1 - i (the blocks visited in reverse)."""
    forward_step = ctx.ring.size - 1 - i
    return _step(forward_step, ctx.ring, half, ctx.causal, ctx.dropout_p, ctx.seeds[forward_step])


def _backward_exchange(ring: Ring, buffers: list[torch.Tensor], i: int) -> list:
    """Step `i` of the backward's ring (to the previous rank, from the next), on two [2, kv] buffers
    of keys and values and their gradient: the keys and values alone at the first step, the gradient
    alone at the last, both between."""
    send, recv = buffers[i % 2], buffers[(i + 1) % 2]
    if i == 0:
        send, recv = send[0], recv[0]
    if i == ring.size - 1:
        send, recv = send[1], recv[1]
    return exchange(ring, send, ring.prev_rank, recv, ring.next_rank)


def _modelled_forward(q, k, v, ring: Ring, causal: bool, dropout_p: float, seeds):
    """The forward on a modelled GPU: the same exchanges, Transformer Engine's kernels charged (see the
    module docstring). Returns (output [s, b, n, dv] in q's dtype, log-sum-exp [b, n, s] float32, the
    last keys and values received)."""
    s, b, n, _ = q.shape
    half, value_dim = s // 2, v.shape[3]
    lse_bytes = _bytes(b, n, 1, dtype=torch.float32)  # per query row
    row_bytes = _bytes(b, n, value_dim, dtype=q.dtype)
    buffers = [torch.cat((k.reshape(-1), v.reshape(-1)))]
    steps, requests = [], []
    for i in range(ring.size):
        _wait(requests)
        if i < ring.size - 1:
            buffers.append(torch.empty_like(buffers[i]))
            requests = exchange(ring, buffers[i], ring.next_rank, buffers[i + 1], ring.prev_rank)
        step = _step(i, ring, half, causal, dropout_p, seeds[i])
        rows, keys = _rows(step.rows, s), _rows(step.key_rows, s)
        q_shape, k_shape = (rows, b, n, q.shape[3]), (keys, *k.shape[1:])
        with attention_blocks.block_kernel(q_shape, k_shape, q.dtype, step.mask, backward=False):
            kept = (q.new_empty((rows, b, n, value_dim)), q.new_empty((b, n, rows), dtype=torch.float32))
        _charge(lse_bytes * rows * (2 if i == 0 else 3))  # the log-sum-exp: cloned, then corrected
        steps.append((rows, kept))
    out = q.new_empty((s, b, n, value_dim))
    for i, (rows, _) in enumerate(steps):  # the output's correction by each step
        _charge(row_bytes * rows * (2 if i == 0 else 3) + 2 * lse_bytes * rows)
    return out, q.new_empty((b, n, s), dtype=torch.float32), buffers[-1]


def _modelled_backward(ctx, q, kv, dout):
    """The backward on a modelled GPU: the same exchanges, Transformer Engine's kernels charged."""
    ring, (s, b, n, head_dim) = ctx.ring, q.shape
    half = s // 2
    buffers = _backward_buffers(kv)
    dq = torch.empty_like(q)
    requests = []
    for i in range(ring.size):
        _wait(requests)
        requests = _backward_exchange(ring, buffers, i)
        step = _backward_step(ctx, i, half)
        rows, keys = _rows(step.rows, s), _rows(step.key_rows, s)
        q_shape, k_shape = (rows, b, n, head_dim), (keys, *ctx.k_shape[1:])
        with attention_blocks.block_kernel(q_shape, k_shape, q.dtype, step.mask, backward=True):
            grads = [q.new_empty(shape) for shape in (q_shape, k_shape, (keys, *ctx.v_shape[1:]))]
        moved = 2 if i == 0 else 3  # copied at the first step (read, write), added after
        dq_bytes, dk_bytes, dv_bytes = (g.numel() * g.element_size() for g in grads)
        _charge(dq_bytes * moved)
        _wait(requests)
        requests = []
        _charge(dk_bytes * moved)
        _charge(dv_bytes * moved)
        del grads
    dk, dv = _split(buffers[ring.size % 2][1], ctx.k_shape, ctx.v_shape)
    return dq, dk, dv


class RingAttention(torch.autograd.Function):
    """softmax(q k^T scale) v over the whole sequence, for a rank holding two chunks of q, k and v.

    q [s, b, n, d], k [s, b, g, d], v [s, b, g, dv] with s = 2 chunks; returns [s, b, n, dv].
    """

    @staticmethod
    def forward(
        ctx, q, k, v, ring: Ring, scale: float, causal: bool, dropout_p: float, seeds, a2a_group=None
    ):
        dtype = q.dtype
        if a2a_group is not None:  # hierarchical CP: heads over the a2a level first, then the ring
            q, k, v = (all_to_all.seq_to_heads(x, a2a_group) for x in (q, k, v))
        if attention_blocks.outputs_only(q):
            out, lse, last_kv = _modelled_forward(q, k, v, ring, causal, dropout_p, seeds)
        else:
            out, lse, last_kv = _forward(q, k, v, ring, scale, causal, dropout_p, seeds)
            out = out.to(dtype)
        if a2a_group is not None:
            out = all_to_all.heads_to_seq(out, a2a_group)
        ctx.save_for_backward(q, last_kv, out, lse)
        ctx.ring, ctx.scale, ctx.causal, ctx.dropout_p, ctx.seeds = ring, scale, causal, dropout_p, seeds
        ctx.k_shape, ctx.v_shape, ctx.a2a_group = k.shape, v.shape, a2a_group
        return out

    @staticmethod
    def backward(ctx, dout):
        q, kv, out, lse = ctx.saved_tensors
        dout = dout.reshape(out.shape)
        a2a_group = ctx.a2a_group
        if a2a_group is not None:
            out, dout = all_to_all.seq_to_heads(out, a2a_group), all_to_all.seq_to_heads(dout, a2a_group)
        if attention_blocks.outputs_only(q):
            dq, dk, dv = _modelled_backward(ctx, q, kv, dout)
        else:
            dq, dk, dv = _backward(ctx, q, kv, out, lse, dout)
        if a2a_group is not None:
            dq, dk, dv = (all_to_all.heads_to_seq(g, a2a_group) for g in (dq, dk, dv))
        return dq, dk, dv, None, None, None, None, None, None


def _forward(q, k, v, ring: Ring, scale: float, causal: bool, dropout_p: float, seeds):
    """The forward worked out: (output [s, b, n, dv] float32, log-sum-exp, the last keys and values)."""
    half = q.shape[0] // 2
    buffers = [torch.cat((k.reshape(-1), v.reshape(-1)))]
    merge, requests = Merge(), []
    for i in range(ring.size):
        _wait(requests)
        if i < ring.size - 1:
            buffers.append(torch.empty_like(buffers[i]))
            requests = exchange(ring, buffers[i], ring.next_rank, buffers[i + 1], ring.prev_rank)
        k_i, v_i = _split(buffers[i], k.shape, v.shape)
        step = _step(i, ring, half, causal, dropout_p, seeds[i])
        out, lse = block_forward(q[step.rows], k_i[step.key_rows], v_i[step.key_rows], scale, step.mask)
        merge.add(step.rows, out, lse)
    out, lse = merge.result(q.shape[0])
    return out, lse, buffers[-1]


def _backward(ctx, q, kv, out, lse, dout):
    """The backward worked out: dq, dk, dv in q's dtype."""
    ring, half = ctx.ring, q.shape[0] // 2
    row_delta = delta(out, dout)
    buffers = _backward_buffers(kv)
    dq = torch.zeros(q.shape, dtype=torch.float32, device=q.device)
    requests = []
    for i in range(ring.size):
        _wait(requests)
        requests = _backward_exchange(ring, buffers, i)
        step = _backward_step(ctx, i, half)
        k_i, v_i = _split(buffers[i % 2][0], ctx.k_shape, ctx.v_shape)
        dq_i, dk_i, dv_i = block_backward(
            q[step.rows], k_i[step.key_rows], v_i[step.key_rows], dout[step.rows],
            lse[..., step.rows], row_delta[..., step.rows], ctx.scale, step.mask,
        )  # fmt: skip
        dq[step.rows] += dq_i
        _wait(requests)
        requests = []
        dkv = buffers[(i + 1) % 2][1]
        if i == 0:
            dkv.zero_()  # it held nothing yet: step 0 received keys and values only
        dk, dv = _split(dkv, ctx.k_shape, ctx.v_shape)
        dk[step.key_rows] += dk_i.to(dk.dtype)
        dv[step.key_rows] += dv_i.to(dv.dtype)
    dk, dv = _split(buffers[ring.size % 2][1], ctx.k_shape, ctx.v_shape)
    return dq.to(q.dtype), dk, dv
