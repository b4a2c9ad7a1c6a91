"""Creation cost at production scale: W=131072 activates, and groups without this rank stay cheap.

Bounds are loose (a shared 2-core machine); benchmarks/backend measures the real numbers. They still
fail if a non-member group ever reaches the backend or costs memory per world rank.
"""

from __future__ import annotations

import os
import time

import torch
import torch.distributed as dist

from prism_megatron import backend

PAGE_BYTES = os.sysconf("SC_PAGE_SIZE")


def rss_bytes() -> int:
    with open("/proc/self/statm") as f:
        return int(f.read().split()[1]) * PAGE_BYTES


def test_a_world_of_131072_ranks_activates_and_reduces():
    start = time.perf_counter()
    backend.activate(world_size=131072, virtual_rank=70001, real_ranks=[70001])
    try:
        assert time.perf_counter() - start < 10.0
        t = torch.ones(2)
        dist.all_reduce(t)
        assert torch.equal(t, torch.full((2,), 131072.0))
    finally:
        backend.deactivate()


def test_groups_without_this_rank_cost_microseconds_and_no_memory():
    backend.activate(world_size=131072, virtual_rank=5, real_ranks=[5])
    try:
        num_groups = 4000
        groups = [list(range(8 * g, 8 * g + 8)) for g in range(1, num_groups + 1)]  # none holds rank 5
        rss_before = rss_bytes()
        start = time.perf_counter()
        for ranks in groups:
            assert dist.new_group(ranks) is dist.GroupMember.NON_GROUP_MEMBER
        per_group_s = (time.perf_counter() - start) / num_groups
        rss_growth = rss_bytes() - rss_before
        assert per_group_s < 500e-6
        assert rss_growth < 16 * 2**20
        member_start = time.perf_counter()
        tp = dist.new_group(list(range(8)))
        assert time.perf_counter() - member_start < 0.5
        assert tp.size() == 8
    finally:
        backend.deactivate()
