"""Megatron's load-balanced context-parallel split as index tensors (`megatron/layers/chunks.py`)."""

import pytest
import torch

from prism_megatron.megatron.layers import chunks


@pytest.mark.parametrize("cp", [1, 2, 3, 4, 8, 16])
def test_the_reorder_indices_put_gathered_chunks_in_sequence_order_and_back(cp):
    # Every rank's two chunks, gathered in rank order (what an all-gather over the CP group holds).
    gathered = [c for rank in range(cp) for c in chunks.local_chunks(rank, cp)]
    to_sequence = chunks.to_sequence_order(cp)
    to_rank = chunks.to_rank_order(cp)
    assert to_sequence.dtype == to_rank.dtype == torch.long
    assert [gathered[i] for i in to_sequence.tolist()] == list(range(2 * cp))
    assert to_rank.tolist() == gathered
    assert to_sequence[to_rank].tolist() == list(range(2 * cp))


def test_rank_r_holds_chunk_r_and_its_mirror():
    assert chunks.local_chunks(0, 4) == (0, 7)
    assert chunks.local_chunks(3, 4) == (3, 4)
