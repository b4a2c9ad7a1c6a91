"""Attention time by the flash-attention algorithm: blocks of queries on SMs, looping over key blocks.

Flash attention (FlashAttention-2/-3, cuDNN's fused attention) tiles the (seq_q x seq_kv) score
matrix of each (batch, query head) into Bm x Bn blocks. The forward pass gives one thread block a
block of Bm query rows and loops over the key/value blocks it must see; the backward pass gives one
thread block a block of Bn key rows and loops over the query blocks that see it. So, in ns:

    forward:  blocks = batch * heads * ceil(seq_q / Bm), block i loops over n_i kv blocks
    backward: blocks = batch * heads * ceil(seq_kv / Bn), block j loops over n_j q blocks
    time      = launch + tau * max(ceil(blocks / num_sms) * (n + o), ...)     (see _schedule)

with n_i = all kv blocks when not causal and only those at or left of the diagonal when causal (the
diagonal block is computed whole, as the kernels do; causal alignment is bottom-right as in
FlashAttention-2+, the same as top-left for seq_q == seq_kv). `o` is a block's fixed cost (load Q,
write O and the log-sum-exp) in units of one inner step, and `tau` the time of one inner step on one
SM. GQA changes neither: the kernels run one block per query head and read shared K/V through L2.

tau and o are not chosen: they are solved, per direction, so that the formula reproduces the
published FlashAttention-3 throughput at sequence 16k and at 512 (constants.py; the paper's shapes:
batch * seq = 16k, 16 heads of 128, non-causal), or cuDNN's fused attention's from the same figures
for a GpuSpec `with_attention_kernel("cudnn")` (the kernel Transformer Engine runs on Hopper). A causal step costs a factor more (masking,
imbalance), solved from the causal forward at 16k and assumed for the backward. Head dims other than 128 scale tau by the published
head-dim-64 / head-dim-128 throughput ratio (forward and backward each its own), interpolated in
log2(head dim) and held constant above 128. FP8 attention is charged at the BF16
rate (an assumption on the slow side). Everything else about the causal mask, short sequences and
wave quantisation follows from the block count, and benchmarks/published/kernels.py checks it
against the paper's causal and other-sequence figures that were not used here.
"""

from __future__ import annotations

import dataclasses
import functools
import math

from prism_megatron.gpu_model.specs import GpuSpec

BLOCK_Q = 128
BLOCK_KV = 128
PAPER_TOKENS = 16384
PAPER_HEADS = 16
PAPER_HEAD_DIM = 128
LONG_SEQ = 16384
SHORT_SEQ = 512
BACKWARD_FLOP_RATIO = 2.5
"""Backward FLOPs per forward FLOP in the flash-attention papers' counts (5 matmuls against 2)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class AttentionCalibration:
    step_ns: float
    """tau: one inner step (one Bm x Bn block, head dim 128) on one SM."""
    block_overhead_steps: float
    """o: a thread block's fixed cost in inner steps."""


def _steps(seq_outer: int, seq_inner: int, causal: bool, *, backward: bool) -> list[int]:
    """Inner steps of each outer block of one (batch, head)."""
    if not backward:
        n_outer, block_outer, block_inner = math.ceil(seq_outer / BLOCK_Q), BLOCK_Q, BLOCK_KV
    else:
        n_outer, block_outer, block_inner = math.ceil(seq_outer / BLOCK_KV), BLOCK_KV, BLOCK_Q
    n_inner = math.ceil(seq_inner / block_inner)
    if not causal:
        return [n_inner] * n_outer
    # Forward: query row r sees keys up to r + (seq_kv - seq_q). Backward (outer = keys): key row c
    # is seen by queries from c - (seq_kv - seq_q) on.
    offset = seq_inner - seq_outer if not backward else seq_outer - seq_inner
    steps = []
    for i in range(n_outer):
        if not backward:
            last = min(seq_inner, (i + 1) * block_outer + offset)
            steps.append(max(0, math.ceil(last / block_inner)))
        else:
            first = max(0, i * block_outer - offset)
            steps.append(max(0, n_inner - first // block_inner))
    return steps


def _schedule_steps(steps: list[int], copies: int, overhead: float, num_sms: int) -> float:
    """Inner steps on the busiest SM when `copies` x `steps` blocks run on `num_sms` SMs.

    Equal blocks run in ceil(blocks / SMs) waves. Unequal blocks (causal) are scheduled longest
    first, as FlashAttention-3's scheduler does: the busiest SM then carries about the average load,
    and never less than the longest block.
    """
    blocks = copies * len(steps)
    if blocks == 0:
        return 0.0
    if min(steps) == max(steps):
        return math.ceil(blocks / num_sms) * (steps[0] + overhead)
    total = copies * (sum(steps) + overhead * len(steps))
    return max(total / num_sms, max(steps) + overhead)


def _paper_steps(gpu: GpuSpec, seq: int, overhead: float) -> float:
    batch = PAPER_TOKENS // seq
    return _schedule_steps(
        _steps(seq, seq, False, backward=False), batch * PAPER_HEADS, overhead, gpu.num_sms
    )


@functools.cache
def calibration(gpu: GpuSpec, *, backward: bool) -> AttentionCalibration:
    """Solve tau and o from the published long- and short-sequence throughput.

    t(S) = launch + tau * waves(S) * (n(S) + o); the ratio t(long) / t(short) fixes o, then t(long)
    fixes tau. Forward and backward are calibrated separately (the backward on its own figures).
    """
    if backward:
        long_rate, short_rate = gpu.attention_bwd_flops_per_s, gpu.attention_bwd_short_flops_per_s
    else:
        long_rate, short_rate = gpu.attention_fwd_flops_per_s, gpu.attention_fwd_short_flops_per_s
    factor = BACKWARD_FLOP_RATIO if backward else 1.0

    def paper_ns(seq: int, rate: float) -> float:
        flops = 4 * PAPER_TOKENS * seq * PAPER_HEADS * PAPER_HEAD_DIM * factor
        return flops / rate * 1e9 - gpu.launch_ns

    t_long, t_short = paper_ns(LONG_SEQ, long_rate), paper_ns(SHORT_SEQ, short_rate)
    # waves(S) * (n(S) + o) is linear in o: a(S) + b(S) * o.
    a_long, b_long = _paper_steps(gpu, LONG_SEQ, 0.0), _paper_steps(gpu, LONG_SEQ, 1.0)
    a_short, b_short = _paper_steps(gpu, SHORT_SEQ, 0.0), _paper_steps(gpu, SHORT_SEQ, 1.0)
    b_long, b_short = b_long - a_long, b_short - a_short
    ratio = t_long / t_short
    overhead = (a_long - ratio * a_short) / (ratio * b_short - b_long)
    if overhead < 0:
        raise ValueError(
            f"attention anchors of {gpu.name} give a negative block overhead; check constants.py"
        )
    step_ns = t_long / (a_long + b_long * overhead)
    return AttentionCalibration(step_ns=step_ns, block_overhead_steps=overhead)


@functools.cache
def causal_scale(gpu: GpuSpec) -> float:
    """Step time with the causal mask over step time without it.

    Block counting alone gives causal attention the non-causal efficiency (slightly more, as the
    unequal blocks schedule without whole waves), but the kernels lose some to masking the diagonal
    blocks and to their imbalance. The factor is solved so that the causal forward at the paper's
    16k shape reproduces its published throughput; the backward is assumed to lose the same.
    """
    cal = calibration(gpu, backward=False)
    batch = PAPER_TOKENS // LONG_SEQ
    steps = _steps(LONG_SEQ, LONG_SEQ, True, backward=False)
    busiest = _schedule_steps(steps, batch * PAPER_HEADS, cal.block_overhead_steps, gpu.num_sms)
    flops = 4 * PAPER_TOKENS * LONG_SEQ * PAPER_HEADS * PAPER_HEAD_DIM / 2
    published_ns = flops / gpu.attention_fwd_causal_flops_per_s * 1e9
    return (published_ns - gpu.launch_ns) / (busiest * cal.step_ns)


def head_dim_scale(gpu: GpuSpec, head_dim: int, *, backward: bool) -> float:
    """Time of one inner step at `head_dim` relative to head dim 128 (the FLOPs and the efficiency)."""
    d = max(1, head_dim)
    flop_ratio = d / PAPER_HEAD_DIM
    if backward:
        efficiency_64 = gpu.attention_bwd_d64_flops_per_s / gpu.attention_bwd_flops_per_s
    else:
        efficiency_64 = gpu.attention_fwd_d64_flops_per_s / gpu.attention_fwd_flops_per_s
    position = min(1.0, max(0.0, math.log2(d / 64)))  # 0 at d <= 64, 1 at d >= 128
    efficiency = efficiency_64 + (1.0 - efficiency_64) * position
    if d < 64:
        efficiency = efficiency_64 * d / 64  # small heads cannot fill the tensor cores either
    return flop_ratio / efficiency


@functools.cache
def attention_time(
    gpu: GpuSpec,
    *,
    batch: int,
    num_heads: int,
    num_kv_heads: int,
    seq_q: int,
    seq_kv: int,
    head_dim: int,
    causal: bool,
    dtype: object = None,
    backward: bool = False,
) -> int:
    """Device time in ns of one flash-attention forward (or backward) call.

    Args:
        num_kv_heads: K/V heads (GQA); must divide num_heads. It does not change the time (see
            the module docstring) but is checked, as a shape mistake would be.
        dtype: accepted for the interface; every floating dtype is charged at the BF16 rate.
    """
    if num_kv_heads <= 0 or num_heads % num_kv_heads:
        raise ValueError(f"attention: num_heads {num_heads} is not a multiple of num_kv_heads {num_kv_heads}")
    if min(batch, num_heads, seq_q, seq_kv) <= 0:
        return 0
    cal = calibration(gpu, backward=backward)
    if not backward:
        steps = _steps(seq_q, seq_kv, causal, backward=False)
    else:
        steps = _steps(seq_kv, seq_q, causal, backward=True)
    busiest = _schedule_steps(steps, batch * num_heads, cal.block_overhead_steps, gpu.num_sms)
    scale = head_dim_scale(gpu, head_dim, backward=backward)
    if causal:
        # The mask's cost, but never more than computing the whole score matrix: with fewer blocks
        # than SMs the diagonal-to-end block is as long as a non-causal one and sets the time.
        unmasked = (
            _steps(seq_q, seq_kv, False, backward=False)
            if not backward
            else _steps(seq_kv, seq_q, False, backward=True)
        )
        full = _schedule_steps(unmasked, batch * num_heads, cal.block_overhead_steps, gpu.num_sms)
        busiest = min(busiest * causal_scale(gpu), full)
    return round(gpu.launch_ns + busiest * cal.step_ns * scale)
