"""Mock GPT data for the built-in entry: the same batch on every TP rank without a broadcast.

Megatron-LM builds data only on TP-rank 0 of the first and last stage and broadcasts it to the other
TP ranks. Here every rank that needs data computes it from (seed, global sample index), so a rank
that is not TP-rank 0 trains even when its TP source is a virtual peer, and no collective is added
that the real job would not have (the real job's broadcast is a TP-group collective that the prism
backend serves; the built-in entry simply does not need it).

Sample order follows Megatron's pretraining sampler: global batch `i` holds samples
`[i * global_batch, (i + 1) * global_batch)`; within it, micro-batch `m` spans
`micro_batch * dp` consecutive samples and data-parallel rank `d` takes its `micro_batch` slice.
"""

from __future__ import annotations

from collections.abc import Iterator

import torch


def sample_tokens(seed: int, sample_index: int, seq_length: int, vocab_size: int) -> torch.Tensor:
    """`seq_length + 1` token ids of one sample, a pure function of (seed, sample_index)."""
    generator = torch.Generator().manual_seed(seed * 1_000_003 + sample_index)
    return torch.randint(0, vocab_size, (seq_length + 1,), generator=generator)


def micro_batch_indices(
    *,
    iteration: int,
    micro_batch: int,
    micro_batch_size: int,
    global_batch_size: int,
    dp_rank: int,
    dp_size: int,
) -> list[int]:
    """Global sample indices of one data-parallel rank's micro-batch."""
    start = (
        iteration * global_batch_size + micro_batch * micro_batch_size * dp_size + dp_rank * micro_batch_size
    )
    return list(range(start, start + micro_batch_size))


def mock_batches(
    *,
    seed: int,
    seq_length: int,
    vocab_size: int,
    micro_batch_size: int,
    global_batch_size: int,
    dp_rank: int,
    dp_size: int,
    start_iteration: int = 0,
) -> Iterator[dict[str, torch.Tensor]]:
    """Endless micro-batches for one data-parallel rank, in the order the schedules consume them."""
    num_micro_batches = global_batch_size // (micro_batch_size * dp_size)
    iteration = start_iteration
    while True:
        for micro_batch in range(num_micro_batches):
            indices = micro_batch_indices(
                iteration=iteration,
                micro_batch=micro_batch,
                micro_batch_size=micro_batch_size,
                global_batch_size=global_batch_size,
                dp_rank=dp_rank,
                dp_size=dp_size,
            )
            samples = torch.stack([sample_tokens(seed, i, seq_length, vocab_size) for i in indices])
            yield {
                "tokens": samples[:, :-1].contiguous(),
                "labels": samples[:, 1:].contiguous(),
                "loss_mask": torch.ones(micro_batch_size, seq_length),
                "position_ids": torch.arange(seq_length)
                .unsqueeze(0)
                .expand(micro_batch_size, -1)
                .contiguous(),
            }
        iteration += 1
