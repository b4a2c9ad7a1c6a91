"""What a virtual pipeline stage sends: plausible, deterministic values, drawn in the receive buffer.

The pipeline interceptor fills each receive from a virtual stage in place (no tensor the real rank
would not hold) with a tile of random values repeated over the buffer, so the fill costs what
gloo's copy into the buffer costs; these tests hold the values' scale and determinism to it.
"""

from __future__ import annotations

import math

import pytest
import torch

from prism_megatron.patches.pipeline_ops import TILE_ELEMENTS, PlausibleValues, Transfer
from prism_megatron.replay import OpKind


@pytest.mark.parametrize("numel", [1, 7, TILE_ELEMENTS, TILE_ELEMENTS + 3, 32768, 5 * TILE_ELEMENTS - 1])
def test_activations_are_standard_normal_in_scale_and_gradients_have_norm_one(numel):
    activation, gradient = torch.full((numel,), math.nan), torch.full((numel,), math.nan)
    PlausibleValues(seed=3).fill(activation, gradient=False)
    PlausibleValues(seed=3).fill(gradient, gradient=True)
    assert torch.isfinite(activation).all() and torch.isfinite(gradient).all()
    if numel >= TILE_ELEMENTS:
        assert 0.9 < float(activation.std()) < 1.1
        assert 0.9 < float(gradient.norm()) < 1.1


def test_the_fill_is_in_place_deterministic_and_differs_by_rank_and_kind():
    buffer = torch.empty((128, 2, 128), requires_grad=True)
    pointer = buffer.data_ptr()
    values = PlausibleValues(seed=5)
    values.fill(buffer, gradient=False)
    first = buffer.detach().clone()
    values.fill(buffer, gradient=False)
    assert buffer.data_ptr() == pointer and torch.equal(buffer.detach(), first)
    other = torch.empty_like(first)
    PlausibleValues(seed=6).fill(other, gradient=False)
    assert not torch.equal(other, first)
    PlausibleValues(seed=5).fill(other, gradient=True)
    assert not torch.allclose(other, first)


def test_the_tile_repeats_over_the_buffer():
    buffer = torch.empty(3 * TILE_ELEMENTS + 10)
    PlausibleValues(seed=1).fill(buffer, gradient=False)
    tile = buffer[:TILE_ELEMENTS]
    assert torch.equal(buffer[2 * TILE_ELEMENTS : 3 * TILE_ELEMENTS], tile)
    assert torch.equal(buffer[3 * TILE_ELEMENTS :], tile[:10])
    assert len(set(tile.tolist())) == TILE_ELEMENTS  # drawn, not constant


def test_a_transfer_reads_its_size_and_type_once_at_issue():
    transfer = Transfer(
        kind=OpKind.SEND, self_rank=1, peer=0, tensor=torch.zeros(4, 8, dtype=torch.bfloat16), async_op=False
    )
    assert (transfer.size_bytes, transfer.dtype, transfer.direction) == (64, "BFloat16", "send")
