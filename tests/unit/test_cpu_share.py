"""A CPU rank's device is a fixed share of the machine: its intra-op threads and cores of its own."""

from __future__ import annotations

import os

import pytest
import torch

from prism_megatron.config import EmulationConfig
from prism_megatron.megatron.run import cpu_share


def test_each_local_rank_gets_cores_of_its_own_wrapping_round_when_there_are_more_ranks():
    assert cpu_share.cores_for([0, 1], local_rank=0, threads=1) == (0,)
    assert cpu_share.cores_for([0, 1], local_rank=1, threads=1) == (1,)
    assert cpu_share.cores_for([0, 1], local_rank=2, threads=1) == (0,)
    assert cpu_share.cores_for([4, 5, 6, 7, 8, 9, 10, 11], local_rank=1, threads=4) == (8, 9, 10, 11)
    assert cpu_share.cores_for([3, 1, 2, 0], local_rank=1, threads=2) == (2, 3)


def test_a_process_already_held_to_its_share_is_not_pinned():
    assert cpu_share.cores_for([0], local_rank=3, threads=1) is None
    assert cpu_share.cores_for([0, 1], local_rank=0, threads=2) is None


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs sched_setaffinity")
def test_taking_a_share_sets_threads_and_affinity_and_restoring_gives_them_back():
    allowed, threads = os.sched_getaffinity(0), torch.get_num_threads()
    share = cpu_share.take(EmulationConfig(cpu_threads_per_rank=1), {"LOCAL_RANK": "1"})
    try:
        assert torch.get_num_threads() == 1 and share.threads == 1
        if len(allowed) > 1:
            assert share.pinned and os.sched_getaffinity(0) == set(share.cores) and len(share.cores) == 1
            assert share.cores == (sorted(allowed)[1],)
        assert share.as_dict() == {
            "threads": 1,
            "cores": list(share.cores),
            "pinned": share.pinned,
            "own_cores": False,  # no LOCAL_WORLD_SIZE: whether others share its core is unknown
        }
    finally:
        share.restore()
    assert os.sched_getaffinity(0) == allowed and torch.get_num_threads() == threads


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs sched_setaffinity")
def test_a_modelled_gpu_s_process_is_not_pinned_so_captures_at_once_do_not_share_one_core():
    allowed, threads = os.sched_getaffinity(0), torch.get_num_threads()
    share = cpu_share.take(EmulationConfig(device="model:h100", cpu_threads_per_rank=1), {"LOCAL_RANK": "0"})
    try:
        assert not share.pinned and share.cores == tuple(sorted(allowed))
        assert os.sched_getaffinity(0) == allowed and torch.get_num_threads() == 1
    finally:
        share.restore()
    assert os.sched_getaffinity(0) == allowed and torch.get_num_threads() == threads


@pytest.mark.skipif(not hasattr(os, "sched_getaffinity"), reason="needs sched_setaffinity")
@pytest.mark.parametrize("extra", [0, 1])
def test_cores_are_its_own_only_when_the_machine_s_processes_fit_on_its_cores(extra):
    """Own cores let the backend poll for real peers; with one process more than cores, two share."""
    allowed = os.sched_getaffinity(0)
    if len(allowed) < 2:
        pytest.skip("needs two cores to pin one process to one")
    environ = {"LOCAL_RANK": "0", "LOCAL_WORLD_SIZE": str(len(allowed) + extra)}
    share = cpu_share.take(EmulationConfig(cpu_threads_per_rank=1), environ)
    try:
        assert share.pinned and share.own_cores == (extra == 0)
    finally:
        share.restore()
    modelled = cpu_share.take(EmulationConfig(device="model:h100", cpu_threads_per_rank=1), environ)
    modelled.restore()
    assert not modelled.own_cores  # not pinned: it shares whatever it runs on
