"""Mock data of the built-in entry: Megatron's sample order, identical on every TP rank."""

from __future__ import annotations

import itertools

import torch

from prism_megatron.megatron.entry import data


def test_each_global_batch_is_split_once_over_microbatches_and_data_parallel_ranks():
    seen = []
    for dp_rank in range(4):
        for micro_batch in range(3):
            seen += data.micro_batch_indices(
                iteration=2,
                micro_batch=micro_batch,
                micro_batch_size=2,
                global_batch_size=24,
                dp_rank=dp_rank,
                dp_size=4,
            )
    assert sorted(seen) == list(range(48, 72))


def test_a_micro_batch_spans_consecutive_samples_per_data_parallel_rank():
    assert data.micro_batch_indices(
        iteration=0, micro_batch=1, micro_batch_size=2, global_batch_size=8, dp_rank=1, dp_size=2
    ) == [6, 7]


def test_batches_are_a_pure_function_of_seed_and_position_and_labels_are_shifted_tokens():
    kwargs = dict(
        seed=7, seq_length=16, vocab_size=50, micro_batch_size=2, global_batch_size=4, dp_rank=0, dp_size=1
    )
    first = list(itertools.islice(data.mock_batches(**kwargs), 3))
    again = list(itertools.islice(data.mock_batches(**kwargs), 3))
    for a, b in zip(first, again, strict=True):
        assert all(torch.equal(a[k], b[k]) for k in a)
    batch = first[0]
    assert batch["tokens"].shape == (2, 16) and batch["tokens"].max() < 50
    assert torch.equal(batch["tokens"][:, 1:], batch["labels"][:, :-1])
    assert torch.equal(batch["position_ids"][1], torch.arange(16))
    assert not torch.equal(first[0]["tokens"], first[1]["tokens"])
