"""Context-parallel attention with gathered keys and values: `--cp-comm-type all_gather`.

As Transformer Engine's `AttnFuncWithCPAndKVAllGather` (the scheme of the Llama 3 paper, section
3.3.2): the forward all-gathers k and v over the CP group (one all-gather each, into a [CP s, ...]
tensor), puts the chunks in sequence order, and computes each of the rank's two query chunks against
the keys up to its own end. Only the local k and v are kept: the backward gathers them again, computes
the gradients of the whole gathered sequence, puts them back in rank order and reduce-scatters dk and
dv (one each) so every rank gets the sum for its own chunks.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from prism_megatron.megatron.layers import chunks
from prism_megatron.megatron.layers.attention_blocks import BlockMask, block_backward, block_forward, delta


def _gather_in_sequence_order(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    cp = dist.get_world_size(group=group)
    gathered = x.new_empty((cp * x.shape[0], *x.shape[1:]))
    dist.all_gather_into_tensor(gathered, x.contiguous(), group=group)
    by_chunk = gathered.view(2 * cp, x.shape[0] // 2, *x.shape[1:])
    return by_chunk.index_select(0, chunks.to_sequence_order(cp, x.device)).view_as(gathered)


def _reduce_scatter_from_sequence_order(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    cp = dist.get_world_size(group=group)
    by_chunk = x.view(2 * cp, x.shape[0] // (2 * cp), *x.shape[1:])
    by_rank = by_chunk.index_select(0, chunks.to_rank_order(cp, x.device)).view_as(x).contiguous()
    local = x.new_empty((x.shape[0] // cp, *x.shape[1:]))
    dist.reduce_scatter_tensor(local, by_rank, group=group)
    return local


def _key_end(chunk: int, chunk_len: int, num_chunks: int, causal: bool) -> int:
    """How many keys (from the start) query chunk `chunk` sees."""
    return (chunk + 1) * chunk_len if causal else num_chunks * chunk_len


class AllGatherAttention(torch.autograd.Function):
    """Exact attention over the whole sequence for a rank holding two chunks of q [s, b, n, d],
    k [s, b, g, d] and v [s, b, g, dv]; returns [s, b, n, dv]."""

    @staticmethod
    def forward(ctx, q, k, v, group: dist.ProcessGroup, scale: float, causal: bool, dropout_p: float, seeds):
        cp, cp_rank = dist.get_world_size(group=group), dist.get_rank(group=group)
        half = q.shape[0] // 2
        k_all, v_all = _gather_in_sequence_order(k, group), _gather_in_sequence_order(v, group)
        outs, lses = [], []
        for i, chunk in enumerate(chunks.local_chunks(cp_rank, cp)):
            end = _key_end(chunk, half, 2 * cp, causal)
            out, lse = block_forward(
                q[i * half : (i + 1) * half],
                k_all[:end],
                v_all[:end],
                scale,
                BlockMask(causal, dropout_p, seeds[i]),
            )
            outs.append(out)
            lses.append(lse)
        out = torch.cat(outs).to(q.dtype)
        lse = torch.cat(lses, dim=-1)
        ctx.save_for_backward(q, k, v, out, lse)
        ctx.group, ctx.scale, ctx.causal, ctx.dropout_p, ctx.seeds = group, scale, causal, dropout_p, seeds
        return out

    @staticmethod
    def backward(ctx, dout):
        q, k, v, out, lse = ctx.saved_tensors
        group = ctx.group
        cp, cp_rank = dist.get_world_size(group=group), dist.get_rank(group=group)
        half = q.shape[0] // 2
        dout = dout.reshape(out.shape)
        row_delta = delta(out, dout)
        k_all, v_all = _gather_in_sequence_order(k, group), _gather_in_sequence_order(v, group)
        dq = torch.empty(q.shape, dtype=q.dtype, device=q.device)
        dk_all, dv_all = torch.zeros_like(k_all), torch.zeros_like(v_all)
        for i, chunk in enumerate(chunks.local_chunks(cp_rank, cp)):
            rows = slice(i * half, (i + 1) * half)
            end = _key_end(chunk, half, 2 * cp, ctx.causal)
            dq_i, dk_i, dv_i = block_backward(
                q[rows], k_all[:end], v_all[:end], dout[rows], lse[..., rows], row_delta[..., rows],
                ctx.scale, BlockMask(ctx.causal, ctx.dropout_p, ctx.seeds[i]),
            )  # fmt: skip
            dq[rows] = dq_i.to(dq.dtype)
            dk_all[:end] += dk_i.to(dk_all.dtype)
            dv_all[:end] += dv_i.to(dv_all.dtype)
        dk = _reduce_scatter_from_sequence_order(dk_all, group)
        dv = _reduce_scatter_from_sequence_order(dv_all, group)
        return dq, dk, dv, None, None, None, None, None
