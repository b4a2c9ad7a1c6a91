"""Full-scale memory: an emulated rank of an 8192-GPU job allocates what that rank of the real job does.

The expected sizes come from an independent count: the parameters of the rank's GPT chunk written out
from the model shape (TP8 shards, one layer per stage), and Megatron's buffer rules for the
distributed optimizer (megatron/core/distributed/param_and_grad_buffer.py, 0.16.1): parameters in
reverse order, each starting at a multiple of 64 elements, the shared embedding in a bucket of its
own, every bucket padded to a multiple of lcm(DP, 128); each DP rank owns 1/DP of every bucket
(distrib_optimizer.py), minus padding.
"""

from __future__ import annotations

import math

import pytest

from prism_megatron.megatron.entry import pretrain

W, TP, PP, DP = 8192, 8, 8, 128
HIDDEN, FFN, SEQ, VOCAB_PADDED = 64, 256, 32, 1024  # vocab 1000 padded to a multiple of 128 * TP

FLAGS = (
    "--num-layers", str(PP), "--hidden-size", str(HIDDEN), "--num-attention-heads", "8",
    "--seq-length", str(SEQ), "--vocab-size", "1000", "--micro-batch-size", "1", "--global-batch-size", "1024",
    "--train-iters", "1", "--tensor-model-parallel-size", str(TP), "--pipeline-model-parallel-size", str(PP),
    "--use-distributed-optimizer", "--prism-device", "cpu", "--prism-emulate", "--prism-world-size", str(W),
)  # fmt: skip


def layer_param_sizes() -> list[int]:
    """One transformer layer on one TP rank (local spec, biases, LayerNorm), in registration order."""
    h, qkv, ffn = HIDDEN, 3 * HIDDEN // TP, FFN // TP
    return [
        h, h,  # input layernorm weight, bias
        h * (h // TP), h,  # attention output projection (row parallel): weight, bias (not split)
        qkv * h, qkv,  # fused QKV (column parallel)
        h, h,  # pre-MLP layernorm
        ffn * h, ffn,  # fc1 (column parallel)
        h * ffn, h,  # fc2 (row parallel)
    ]  # fmt: skip


def stage_params(*, first: bool, last: bool) -> list[tuple[int, bool]]:
    """(numel, is the shared embedding) for each parameter of a stage's chunk, in registration order."""
    word_embedding = (VOCAB_PADDED // TP * HIDDEN, True)
    params = [word_embedding, (SEQ * HIDDEN, False)] if first else []
    params += [(n, False) for n in layer_param_sizes()]
    if last:
        params += [(HIDDEN, False), (HIDDEN, False), word_embedding]  # final layernorm, tied output copy
    return params


def expected_buffer(
    params: list[tuple[int, bool]],
) -> tuple[list[tuple[int, int, int]], list[tuple[int, int]]]:
    """Buckets as (start, end of the last parameter, padded end) and parameter ranges, under
    Megatron's distributed-optimizer padding rules."""
    divisor = math.lcm(DP, 128)
    buckets, ranges = [], []
    start = bucket_start = 0
    open_bucket = False

    def close(content_end: int) -> int:
        end = -(-content_end // divisor) * divisor
        buckets.append((bucket_start, content_end, end))
        return end

    for numel, shared in reversed(params):
        start = -(-start // 64) * 64
        if shared and open_bucket:
            start = bucket_start = close(start)
        ranges.append((start, start + numel))
        start += numel
        open_bucket = True
        if shared:
            start = bucket_start = close(start)
            open_bucket = False
    if open_bucket:
        close(start)
    return buckets, ranges


def expected_shard_numel(buckets, ranges, dp_rank: int) -> int:
    """Elements of real parameters inside this DP rank's 1/DP of every bucket."""
    total = 0
    for bucket_start, _, bucket_end in buckets:
        shard = (bucket_end - bucket_start) // DP
        lo, hi = bucket_start + dp_rank * shard, bucket_start + (dp_rank + 1) * shard
        total += sum(max(0, min(hi, end) - max(lo, start)) for start, end in ranges)
    return total


@pytest.mark.parametrize(
    ("virtual_rank", "first", "last"),
    # virtual rank = pp * 1024 + dp * 8 + tp (order tp-cp-ep-dp-pp)
    [(5, True, False), (3 * 1024 + 77 * 8 + 2, False, False), (W - 1, False, True)],
    ids=["pp0-dp0-tp5", "pp3-dp77-tp2", "pp7-dp127-tp7"],
)
def test_grad_buffer_and_optimizer_shard_have_the_sizes_of_the_real_job(tmp_path, virtual_rank, first, last):
    out = pretrain.run([*FLAGS, "--prism-ranks", str(virtual_rank), "--prism-out", str(tmp_path)])
    params = stage_params(first=first, last=last)
    buckets, ranges = expected_buffer(params)
    numel = buckets[-1][2]
    (buffer,) = out["grad_buffers"]
    assert out["role"]["dp_size"] == DP and out["role"]["tp_size"] == TP
    assert out["num_parameters"] == sum(n for n, _ in params)
    assert buffer["numel_unpadded"] == sum(content_end - start for start, content_end, _ in buckets)
    assert buffer["numel"] == numel and buffer["num_buckets"] == len(buckets)
    assert buffer["grad_bytes"] == 4 * numel
    assert out["optimizer_shard_numel"] == expected_shard_numel(buckets, ranges, out["role"]["dp_rank"])
    assert out["memory"]["at_peak_bytes"]["gradients"] == 4 * numel
