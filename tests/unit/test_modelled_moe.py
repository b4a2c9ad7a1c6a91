"""Balanced routing, the stand-in of a modelled GPU for MoE token counts (`patches/modelled_moe.py`):
its arithmetic, the all-to-all split sizes it gives every rank of a group (they must agree), the
selections it serves on fake tensors, and that on tensors with data the records change nothing."""

from __future__ import annotations

import itertools
import types

import numpy as np
import pytest
import torch

from prism_megatron.megatron.run.modelled_device import ModelledDevice
from prism_megatron.patches import modelled_moe
from prism_megatron.patches.modelled_moe import balanced_counts, group_counts


@pytest.mark.parametrize(("num_routed", "num_experts"), [(4096, 8), (37 * 2, 8), (5, 7), (3, 256)])
def test_balanced_counts_split_every_routed_token_within_one_of_each_other(num_routed, num_experts):
    for first in range(num_experts):
        counts = balanced_counts(num_routed, num_experts, first=first)
        assert sum(counts) == num_routed and max(counts) - min(counts) <= 1
        extra = [e for e, c in enumerate(counts) if c > num_routed // num_experts]
        assert extra == sorted((first + i) % num_experts for i in range(num_routed % num_experts))


def test_the_remainders_of_a_group_go_round_the_experts():
    counts = group_counts(5, topk=2, num_experts=4, group_size=4)  # 10 routed per rank: remainder 2
    assert counts.tolist() == [[3, 3, 2, 2], [2, 2, 3, 3], [3, 3, 2, 2], [2, 2, 3, 3]]
    totals = group_counts(37, topk=2, num_experts=8, group_size=8).sum(axis=0)  # 74 per rank: remainder 2
    assert totals.sum() == 8 * 74 and totals.max() - totals.min() <= 1


def test_capacity_caps_each_expert():
    assert group_counts(64, topk=2, num_experts=4, group_size=2, capacity=20).tolist() == [[20] * 4] * 2


def _config(**fields):
    base = dict(
        moe_router_topk=2,
        moe_expert_capacity_factor=None,
        moe_router_padding_for_quantization=False,
        num_moe_experts=8,
    )
    return types.SimpleNamespace(**{**base, **fields})


def _alltoall_dispatcher(*, ep_rank, tp_rank, ep_size, tp_size, num_experts, config):
    num_local = num_experts // ep_size
    return types.SimpleNamespace(
        config=config, num_experts=num_experts, num_local_experts=num_local, tp_size=tp_size, ep_size=ep_size,
        tp_rank=tp_rank, local_expert_indices=list(range(ep_rank * num_local, (ep_rank + 1) * num_local)),
        num_out_tokens=None,
    )  # fmt: skip


@pytest.mark.parametrize(("ep_size", "tp_size", "num_tokens"), [(4, 2, 37), (2, 1, 2048), (8, 1, 5)])
def test_every_rank_s_all_to_all_splits_agree_with_its_peers(ep_size, tp_size, num_tokens):
    num_experts, config = 8, _config()
    ranks = {}
    for ep_rank, tp_rank in itertools.product(range(ep_size), range(tp_size)):
        d = _alltoall_dispatcher(ep_rank=ep_rank, tp_rank=tp_rank, ep_size=ep_size, tp_size=tp_size,
                                 num_experts=num_experts, config=config)  # fmt: skip
        local = modelled_moe.set_balanced_alltoall_counts(d, num_tokens, place=ep_rank * tp_size + tp_rank)
        ranks[ep_rank, tp_rank] = (d, local)
    for (ep_i, tp), (receiver, local) in ranks.items():
        # What EP peer j sends this rank is what this rank expects from j (the all-to-all over the EP group).
        for ep_j in range(ep_size):
            assert ranks[ep_j, tp][0].input_splits[ep_i] == receiver.output_splits[ep_j]
        # What the TP all-gather brings from TP peer t is what t received in its all-to-all.
        for t in range(tp_size):
            assert receiver.output_splits_tp[t] == ranks[ep_i, t][0].output_splits.sum()
        # The local experts process all of it, and each about its share of the group's tokens.
        assert local.sum() == receiver.output_splits_tp.sum()
        share = num_tokens * ep_size * tp_size * config.moe_router_topk / num_experts
        assert all(abs(c - share) < ep_size * tp_size for c in local)
    # Every token topk times, on each of the tp ranks that hold a shard of its expert.
    total = sum(local.sum() for _, local in ranks.values())
    assert total == num_tokens * ep_size * tp_size * config.moe_router_topk * tp_size


def test_a_split_of_even_counts_is_each_rank_s_tokens_times_topk_over_experts():
    # Mixtral 8x22B's MoE layer on the shipped layout: TP2 with SP (2048 tokens a rank), EP8, top-2.
    config = _config(moe_router_topk=2)
    d = _alltoall_dispatcher(ep_rank=3, tp_rank=1, ep_size=8, tp_size=2, num_experts=8, config=config)
    local = modelled_moe.set_balanced_alltoall_counts(d, 2048, place=3 * 2 + 1)
    assert d.input_splits.tolist() == [512] * 8  # 2048 x 2 / 8 to each expert, one expert per EP rank
    assert d.output_splits.tolist() == [512] * 8 and d.output_splits_tp.tolist() == [4096, 4096]
    assert local.tolist() == [8192]  # 16 ranks x 512


def test_padding_for_fp8_has_no_stand_in_and_says_which_flag():
    d = _alltoall_dispatcher(ep_rank=0, tp_rank=0, ep_size=2, tp_size=1, num_experts=8,
                             config=_config(moe_router_padding_for_quantization=True))  # fmt: skip
    with pytest.raises(NotImplementedError, match="--moe-router-padding-for-quantization"):
        modelled_moe.set_balanced_alltoall_counts(d, 16, place=0)


def _routing(num_tokens: int, num_experts: int, topk: int) -> torch.Tensor:
    routing = torch.zeros(num_tokens, num_experts, dtype=torch.bool)
    for token in range(num_tokens):
        routing[token, [(token + i) % num_experts for i in range(topk)]] = True
    return routing


def test_on_fake_tensors_the_permutation_selects_each_token_topk_times():
    from megatron.core.transformer.moe import moe_utils

    permute = modelled_moe._permute_known_length(moe_utils.permute)
    device = ModelledDevice("h100")
    with device.active():
        tokens = torch.empty(64, 32, dtype=torch.bfloat16)
        routing = torch.empty(64, 8, dtype=torch.bool)
        probs = torch.empty(64, 8)
        permuted, permuted_probs, indices = permute(tokens, routing, probs=probs, num_out_tokens=128)[:3]
    assert permuted.shape == (128, 32) and permuted_probs.shape == (128,) and indices.shape == (128,)


def test_on_tensors_with_data_the_records_change_nothing():
    from megatron.core.transformer.moe import moe_utils

    routing, tokens, probs = _routing(12, 4, 2), torch.randn(12, 6), torch.rand(12, 4)
    expected = moe_utils.permute(tokens, routing, probs=probs, num_out_tokens=24)
    got = modelled_moe._permute_known_length(moe_utils.permute)(
        tokens, routing, probs=probs, num_out_tokens=24
    )
    for a, b in zip(expected, got, strict=True):  # 0.19 returns two more values, None where unused
        assert (a is None and b is None) or torch.equal(a, b)
    # The dispatchers' records hand a routing map or tokens with data to the original, untouched.
    marker = object()
    dispatcher = types.SimpleNamespace(drop_and_pad=False)
    assert modelled_moe._balanced_alltoall_counts(lambda self, rm: marker)(dispatcher, routing) is marker
    allgather = modelled_moe._balanced_allgather_counts(lambda self, h, p: marker)
    assert allgather(dispatcher, tokens, probs) is marker


def test_the_stand_in_counts_are_host_arrays_as_a_gpu_run_s_device_to_host_copies_leave_them():
    d = _alltoall_dispatcher(ep_rank=0, tp_rank=0, ep_size=2, tp_size=1, num_experts=8, config=_config())
    local = modelled_moe.set_balanced_alltoall_counts(d, 16, place=0)
    for value in (local, d.input_splits, d.output_splits, d.num_global_tokens_per_local_expert):
        assert isinstance(value, np.ndarray) and value.dtype == np.int64
    assert d.sort_input_by_local_experts.tolist() == [0, 4, 1, 5, 2, 6, 3, 7]
    assert d.restore_output_by_local_experts.tolist() == [0, 2, 4, 6, 1, 3, 5, 7]
