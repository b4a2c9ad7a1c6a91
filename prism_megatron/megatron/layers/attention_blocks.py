"""Exact attention over one block of queries and keys, forward and backward, as flash attention splits it.

Context-parallel attention computes a rank's output from blocks: its queries against the keys and
values of one rank at a time (the ring), or against a prefix of the gathered sequence. Each block
returns its output and the log-sum-exp of its scores; blocks merge exactly (`merge`), and the
backward of a block needs only the merged output and log-sum-exp, as in flash attention (Dao et al.
2022, section 3.1 and appendix B.2): with D = rowsum(dO * O) and P = exp(S - lse),
dV = P^T dO, dS = P * (dO V^T - D), dQ = scale dS K, dK = scale dS^T Q.

Layout is Megatron's [sequence, batch, heads, head dim]. Keys and values carry the query groups
(grouped-query attention) and are repeated to the query heads inside the block; their gradients are
summed back over each group. The maths runs in float32 whatever the input dtype.

Attention dropout drops probabilities after the softmax (so the log-sum-exp is unaffected). A block's
mask is drawn from a generator seeded per block, so the backward redraws the same mask instead of
keeping it (flash attention keeps its RNG state the same way).

On a modelled GPU (`--prism-device model:<gpu>`) a GPU runs each block as one flash-attention kernel
(Transformer Engine's context-parallel attention calls its fused kernel per block): the modelled device
sets `block_kernel`, and each block runs inside the scope it returns, charged as that kernel. Its
tensors are fake (shapes, no values), so the block is not worked out op by op there: it allocates only
the outputs the kernel writes (`outputs_only`), as flash attention does, not the scores, and a 16-way
context-parallel rank's capture spends its time on the rest of the program. The device also sets
`memory_kernel`, the scope of one memory-bound kernel of so many bytes: the ring (`ring.py`) charges
Transformer Engine's merging and accumulating kernels with it. Both None elsewhere.
"""

from __future__ import annotations

import contextlib
import dataclasses
from collections.abc import Callable
from contextlib import AbstractContextManager

import torch
from torch._subclasses.fake_tensor import FakeTensor

block_kernel: Callable[..., AbstractContextManager[None]] | None = None
"""Set by a modelled device: (q shape [sq, b, heads, d], k shape [sk, b, groups, d], dtype, mask,
backward) -> the scope of the block's flash-attention kernel."""
memory_kernel: Callable[[int], AbstractContextManager[None]] | None = None
"""Set by a modelled device: bytes read and written -> the scope of one memory-bound kernel."""


def _kernel(
    q: torch.Tensor, k: torch.Tensor, mask: BlockMask, *, backward: bool
) -> AbstractContextManager[None]:
    if block_kernel is None:
        return contextlib.nullcontext()
    return block_kernel(q.shape, k.shape, q.dtype, mask, backward=backward)


@dataclasses.dataclass(frozen=True)
class BlockMask:
    """Which keys a block's queries see, and the block's dropout."""

    causal: bool
    """Causal, aligned bottom-right: query i of sq sees key j of sk when j <= i + sk - sq."""
    dropout_p: float = 0.0
    seed: int = 0
    """Seeds the block's dropout mask (unused without dropout)."""


def _heads_first(x: torch.Tensor, num_heads: int) -> torch.Tensor:
    """[s, b, g, d] -> [b, num_heads, s, d] in float32, each of g groups repeated num_heads / g times."""
    x = x.float().permute(1, 2, 0, 3)
    if x.shape[1] != num_heads:
        x = x.repeat_interleave(num_heads // x.shape[1], dim=1)
    return x


def _sum_groups(grad: torch.Tensor, num_groups: int) -> torch.Tensor:
    """[b, n, s, d] head gradients -> [s, b, num_groups, d], summed over each group's heads."""
    b, n, s, d = grad.shape
    if n != num_groups:
        grad = grad.view(b, num_groups, n // num_groups, s, d).sum(dim=2)
    return grad.permute(2, 0, 1, 3)


def _probabilities(q, k, scale: float, mask: BlockMask, lse: torch.Tensor | None):
    """Scaled scores [b, n, sq, sk] with the causal mask applied; normalised by `lse` when given."""
    scores = torch.matmul(q, k.transpose(-1, -2)) * scale
    if mask.causal:
        sq, sk = scores.shape[-2:]
        allowed = torch.ones(sq, sk, dtype=torch.bool, device=scores.device).tril(diagonal=sk - sq)
        scores = scores.masked_fill(~allowed, float("-inf"))
    if lse is None:
        return scores
    return torch.exp(scores - lse.unsqueeze(-1))


def _dropout_keep(shape, mask: BlockMask, device) -> torch.Tensor | None:
    """The block's kept-probability scale (0 or 1 / (1 - p)), or None without dropout."""
    if mask.dropout_p <= 0.0:
        return None
    generator = torch.Generator(device=device).manual_seed(mask.seed)
    kept = torch.rand(shape, generator=generator, device=device) >= mask.dropout_p
    return kept.float() / (1.0 - mask.dropout_p)


def block_forward(
    q: torch.Tensor, k: torch.Tensor, v: torch.Tensor, scale: float, mask: BlockMask
) -> tuple[torch.Tensor, torch.Tensor]:
    """One block's (output [sq, b, n, dv] float32, log-sum-exp [b, n, sq] float32)."""
    with _kernel(q, k, mask, backward=False):
        if outputs_only(q):
            sq, b, n, _ = q.shape
            out = q.new_empty((b, n, sq, v.shape[3]), dtype=torch.float32).permute(2, 0, 1, 3)
            return out, q.new_empty((b, n, sq), dtype=torch.float32)
        return _block_forward(q, k, v, scale, mask)


def outputs_only(q: torch.Tensor) -> bool:
    """A modelled GPU's block (`block_kernel` set) on fake tensors: nothing to compute but shapes."""
    return block_kernel is not None and isinstance(q, FakeTensor)


def _block_forward(q, k, v, scale: float, mask: BlockMask) -> tuple[torch.Tensor, torch.Tensor]:
    num_heads = q.shape[2]
    qh, kh, vh = _heads_first(q, num_heads), _heads_first(k, num_heads), _heads_first(v, num_heads)
    scores = _probabilities(qh, kh, scale, mask, lse=None)
    lse = torch.logsumexp(scores, dim=-1)
    probs = torch.exp(scores - lse.unsqueeze(-1))
    keep = _dropout_keep(probs.shape, mask, probs.device)
    if keep is not None:
        probs = probs * keep
    return torch.matmul(probs, vh).permute(2, 0, 1, 3), lse


def block_backward(
    q: torch.Tensor,
    k: torch.Tensor,
    v: torch.Tensor,
    dout: torch.Tensor,
    lse: torch.Tensor,
    delta: torch.Tensor,
    scale: float,
    mask: BlockMask,
) -> tuple[torch.Tensor, torch.Tensor, torch.Tensor]:
    """Gradients (dq [sq, b, n, d], dk and dv [sk, b, g, d], float32) of one block, given the merged
    log-sum-exp of its query rows and delta = rowsum(dout * merged output), both [b, n, sq]."""
    with _kernel(q, k, mask, backward=True):
        if outputs_only(q):
            (sq, b, n, d), sk, g = q.shape, k.shape[0], k.shape[2]
            dq = q.new_empty((b, n, sq, d), dtype=torch.float32).permute(2, 0, 1, 3)
            dk, dv = (
                x.new_empty((b, g, sk, x.shape[3]), dtype=torch.float32).permute(2, 0, 1, 3) for x in (k, v)
            )
            return dq, dk, dv
        return _block_backward(q, k, v, dout, lse, delta, scale, mask)


def _block_backward(q, k, v, dout, lse, delta, scale: float, mask: BlockMask):
    num_heads, num_groups = q.shape[2], k.shape[2]
    qh, kh, vh = _heads_first(q, num_heads), _heads_first(k, num_heads), _heads_first(v, num_heads)
    dh = _heads_first(dout, num_heads)
    probs = _probabilities(qh, kh, scale, mask, lse=lse)
    keep = _dropout_keep(probs.shape, mask, probs.device)
    dprobs = torch.matmul(dh, vh.transpose(-1, -2))
    if keep is None:
        dv = torch.matmul(probs.transpose(-1, -2), dh)
    else:
        dv = torch.matmul((probs * keep).transpose(-1, -2), dh)
        dprobs = dprobs * keep
    dscores = probs * (dprobs - delta.unsqueeze(-1))
    dq = torch.matmul(dscores, kh) * scale
    dk = torch.matmul(dscores.transpose(-1, -2), qh) * scale
    return dq.permute(2, 0, 1, 3), _sum_groups(dk, num_groups), _sum_groups(dv, num_groups)


def delta(out: torch.Tensor, dout: torch.Tensor) -> torch.Tensor:
    """rowsum(dout * out) as [b, n, s] (flash attention's D)."""
    return (dout.float() * out.float()).sum(dim=-1).permute(1, 2, 0)


class Merge:
    """Accumulates blocks over query rows [0, sq) into one output and log-sum-exp (flash attention's
    rescaling). A block may cover only some rows (`rows`, a slice)."""

    def __init__(self) -> None:
        self._blocks: list[tuple[slice, torch.Tensor, torch.Tensor]] = []

    def add(self, rows: slice, out: torch.Tensor, lse: torch.Tensor) -> None:
        self._blocks.append((rows, out, lse))

    def result(self, num_rows: int) -> tuple[torch.Tensor, torch.Tensor]:
        """(output [sq, b, n, dv] float32, log-sum-exp [b, n, sq]); every row must be covered."""
        first_out, first_lse = self._blocks[0][1], self._blocks[0][2]
        b, n = first_lse.shape[:2]
        lse = torch.full((b, n, num_rows), float("-inf"), device=first_lse.device)
        for rows, _, block_lse in self._blocks:
            lse[..., rows] = torch.logaddexp(lse[..., rows], block_lse)
        out = first_out.new_zeros((num_rows, *first_out.shape[1:]))
        for rows, block_out, block_lse in self._blocks:
            weight = torch.exp(block_lse - lse[..., rows]).permute(2, 0, 1).unsqueeze(-1)
            out[rows] += block_out * weight
        return out, lse
