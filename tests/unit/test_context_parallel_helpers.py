"""Context parallelism's helpers: Megatron's load-balanced split as index tensors
(`megatron/layers/chunks.py`) and the `--cp-comm-type` values (`megatron/layers/context_parallel.py`)."""

import pytest
import torch

from prism_megatron.megatron.layers import chunks
from prism_megatron.megatron.layers.context_parallel import COMM_TYPES, _comm_type


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


def test_the_reorder_indices_are_transformer_engine_s_and_made_on_the_device_asked():
    # Transformer Engine's get_seq_chunk_ids_for_reordering_before_attn / _after_attn at CP 2.
    assert chunks.to_sequence_order(2).tolist() == [0, 2, 3, 1]
    assert chunks.to_rank_order(2).tolist() == [0, 3, 1, 2]
    assert chunks.to_sequence_order(4, torch.device("meta")).device.type == "meta"


def test_rank_r_holds_chunk_r_and_its_mirror():
    assert chunks.local_chunks(0, 4) == (0, 7)
    assert chunks.local_chunks(3, 4) == (3, 4)


def test_the_communication_types_are_transformer_engine_s_and_allgather_is_refused_naming_the_fix():
    assert _comm_type(None) == "p2p"
    assert [_comm_type(name) for name in COMM_TYPES] == list(COMM_TYPES)
    with pytest.raises(ValueError, match=r"--cp-comm-type allgather: .* use --cp-comm-type all_gather"):
        _comm_type("allgather")
    with pytest.raises(ValueError, match=r"--cp-comm-type ring: .* p2p, a2a, all_gather, a2a\+p2p"):
        _comm_type("ring")
