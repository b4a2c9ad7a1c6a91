"""Megatron's load-balanced split of a sequence over a context-parallel group, as index lists.

The sequence is cut into 2 x CP chunks; CP rank r holds chunks r and 2CP-1-r, in that order
(megatron-core's `get_batch_on_this_cp_rank`). Gathering every rank's two chunks in rank order gives
chunks 0, 2CP-1, 1, 2CP-2, ...; `to_sequence_order` says which gathered chunk is the sequence's
chunk j, `to_rank_order` the reverse (Transformer Engine's `get_seq_chunk_ids_for_reordering_*`).
"""

from __future__ import annotations

import torch


def local_chunks(cp_rank: int, cp_size: int) -> tuple[int, int]:
    """The sequence chunks CP rank `cp_rank` holds."""
    return cp_rank, 2 * cp_size - 1 - cp_rank


def to_sequence_order(cp_size: int, device=None) -> torch.Tensor:
    """Index into rank-ordered chunks (rank j's first chunk at 2j, second at 2j+1) that yields sequence order."""
    ids = [0] * (2 * cp_size)
    for rank in range(cp_size):
        ids[rank] = 2 * rank
        ids[2 * cp_size - 1 - rank] = 2 * rank + 1
    return _index(ids, device)


def to_rank_order(cp_size: int, device=None) -> torch.Tensor:
    """Index into sequence-ordered chunks that yields rank order (the inverse of `to_sequence_order`)."""
    ids = [0] * (2 * cp_size)
    for rank in range(cp_size):
        ids[2 * rank], ids[2 * rank + 1] = local_chunks(rank, cp_size)
    return _index(ids, device)


def _index(ids: list[int], device) -> torch.Tensor:
    """One tensor made from the whole list, one copy to `device`. Element-wise stores into a tensor
    were 2 CP dispatched ops a call (a select and a charged copy each under a modelled device's timing
    mode). Transformer Engine keeps the index per CP size and device after its first call
    (`get_seq_chunk_ids_for_reordering_*`), so a GPU run launches nothing here; this small copy a call
    stays charged on a modelled GPU (under 1 ms an iteration of the Llama 3 CP16 row's 12 s)."""
    return torch.tensor(ids, dtype=torch.long, device=device)
