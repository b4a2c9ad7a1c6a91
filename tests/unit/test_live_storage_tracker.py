"""The CPU memory tracker counts what the program's ops allocate, not a backend's own buffers.

gloo's reduce-scatter between real processes clones its input and splits the clone when the
program waits (the split runs under the tracker); NCCL and the prism backend have no such buffer,
so an all-real CPU run used to peak one [s, b, h] tensor above an emulated rank under sequence
parallelism. A view of a storage no tracked op made is therefore not counted.
"""

from __future__ import annotations

import torch

from prism_megatron.passes.memory import LiveStorageTracker


def test_a_view_of_a_buffer_made_outside_the_tracked_ops_is_not_counted():
    backend_buffer = torch.zeros(2048)  # 8 KiB made before tracking, as a C++ backend makes its own
    with LiveStorageTracker() as tracker:
        pieces = backend_buffer.split(1024)
        kept = torch.ones(1024)  # 4 KiB the program allocates
        view = kept.view(32, 32)  # a view of the program's own storage counts once
        assert tracker.account.peak_total == 4096
    assert len(pieces) == 2 and view.shape == (32, 32)


def test_what_the_program_allocates_still_counts_through_views_and_in_place_ops():
    with LiveStorageTracker() as tracker:
        a = torch.ones(256)
        b = a.view(16, 16).t().contiguous()  # a new 1 KiB storage
        b.add_(1.0)
        assert tracker.account.peak_total == 2048
    del a, b
