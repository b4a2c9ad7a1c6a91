"""Context-parallel attention with all-to-alls over heads: Transformer Engine's `--cp-comm-type a2a`.

Ulysses-style (Jacobs et al. 2023, "DeepSpeed Ulysses"), as Transformer Engine's
`AttnFuncWithCPAndQKVOA2A` communicates: an all-to-all over the CP group trades the rank's two chunks
of every head for the whole sequence of 1/CP of the heads, separately for q, k and v; attention runs
over the whole sequence; one all-to-all of the output trades back. The backward all-to-alls the output
and its gradient the same way (Transformer Engine keeps the output in the rank's own layout), computes,
and all-to-alls dq, dk, dv back. Every message is a whole tensor, split in CP equal parts. The query
heads and the key/value groups of a TP rank must divide by CP.
"""

from __future__ import annotations

import torch
import torch.distributed as dist

from prism_megatron.megatron.layers import chunks
from prism_megatron.megatron.layers.attention_blocks import BlockMask, block_backward, block_forward, delta


def seq_to_heads(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """[s, b, h, d] (this rank's two chunks) -> [CP s, b, h / CP, d] (the whole sequence, in order)."""
    cp = dist.get_world_size(group=group)
    s, b, h, d = x.shape
    send = x.reshape(s, b, cp, h // cp, d).movedim(2, 0).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    gathered = received.view(2 * cp, s // 2, b, h // cp, d)
    return gathered.index_select(0, chunks.to_sequence_order(cp, x.device)).view(cp * s, b, h // cp, d)


def heads_to_seq(x: torch.Tensor, group: dist.ProcessGroup) -> torch.Tensor:
    """The inverse of `seq_to_heads`: [CP s, b, h / CP, d] -> [s, b, h, d]."""
    cp = dist.get_world_size(group=group)
    total, b, heads, d = x.shape
    s = total // cp
    by_rank = x.view(2 * cp, s // 2, b, heads, d).index_select(0, chunks.to_rank_order(cp, x.device))
    send = by_rank.view(cp, s, b, heads, d).contiguous()
    received = torch.empty_like(send)
    dist.all_to_all_single(received, send, group=group)
    return received.movedim(0, 2).reshape(s, b, cp * heads, d)


class AllToAllAttention(torch.autograd.Function):
    """Exact attention over the whole sequence for a rank holding two chunks of q [s, b, n, d],
    k [s, b, g, d] and v [s, b, g, dv]; returns [s, b, n, dv]."""

    @staticmethod
    def forward(
        ctx, q, k, v, group: dist.ProcessGroup, scale: float, causal: bool, dropout_p: float, seed: int
    ):
        q_heads, k_heads, v_heads = (seq_to_heads(x, group) for x in (q, k, v))
        mask = BlockMask(causal, dropout_p, seed)
        out_heads, lse = block_forward(q_heads, k_heads, v_heads, scale, mask)
        out = heads_to_seq(out_heads.to(q.dtype), group)
        ctx.save_for_backward(q_heads, k_heads, v_heads, out, lse)
        ctx.group, ctx.scale, ctx.mask = group, scale, mask
        return out

    @staticmethod
    def backward(ctx, dout):
        q_heads, k_heads, v_heads, out, lse = ctx.saved_tensors
        out_heads = seq_to_heads(out, ctx.group)
        dout_heads = seq_to_heads(dout.reshape(out.shape), ctx.group)
        grads = block_backward(
            q_heads, k_heads, v_heads, dout_heads, lse, delta(out_heads, dout_heads), ctx.scale, ctx.mask
        )
        dq, dk, dv = (heads_to_seq(g.to(q_heads.dtype), ctx.group) for g in grads)
        return dq, dk, dv, None, None, None, None, None
