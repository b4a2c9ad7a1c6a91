"""--prism-memory-history: the allocations live at a recorded history's peak, and who may ask for it."""

from __future__ import annotations

import pytest

from prism_megatron.passes import memory


def _frames(*sites: tuple[str, int, str]) -> list[dict]:
    return [{"filename": f, "line": line, "name": name} for f, line, name in sites]


TORCH = ("/env/site-packages/torch/nn/functional.py", 10, "linear")
MODEL = ("/env/site-packages/megatron/core/transformer/mlp.py", 120, "forward")
BACKEND = ("/repo/prism_megatron/backend/activation.py", 33, "stage")


def _alloc(addr: int, size: int, *frames) -> dict:
    return {"action": "alloc", "addr": addr, "size": size, "frames": _frames(*frames)}


def _free(addr: int, size: int) -> dict:
    return {"action": "free_requested", "addr": addr, "size": size, "frames": []}


def test_the_peak_is_where_the_replayed_trace_is_highest_and_groups_its_live_allocations_by_site():
    trace = [
        _alloc(1, 1024, TORCH, MODEL),
        _alloc(2, 1024, TORCH, MODEL),
        _alloc(3, 512, BACKEND),
        {"action": "free_completed", "addr": 3, "size": 512},  # not a moment allocated_bytes moves
        _free(3, 512),
        _alloc(4, 4096, TORCH, MODEL),  # the peak: 1024 + 1024 + 4096 above the baseline
        _free(1, 1024),
        _free(2, 1024),
        _alloc(5, 2048, BACKEND),
        _free(99, 256),  # allocated before the history began: leaves the baseline
    ]
    peak = memory.peak_allocations({"device_traces": [trace]}, baseline_bytes=10_000)
    assert peak["peak_bytes"] == 10_000 + 1024 + 1024 + 4096
    assert peak["groups"] == [
        {"site": "megatron/core/transformer/mlp.py:120 forward", "size": 4096, "count": 1, "bytes": 4096},
        {"site": "megatron/core/transformer/mlp.py:120 forward", "size": 1024, "count": 2, "bytes": 2048},
    ]
    assert not peak["cut"] and peak["events"] == len(trace)


def test_a_history_that_never_rises_above_its_baseline_has_nothing_live_at_the_peak():
    peak = memory.peak_allocations({"device_traces": [[_free(1, 512)]]}, baseline_bytes=4096)
    assert peak["peak_bytes"] == 4096 and peak["groups"] == []


def test_the_difference_of_two_peaks_names_the_site_one_run_holds_more_of():
    a = memory.peak_allocations({"device_traces": [[_alloc(1, 1024, MODEL), _alloc(2, 512, BACKEND)]]})
    b = memory.peak_allocations(
        {"device_traces": [[_alloc(1, 1024, MODEL), _alloc(2, 512, BACKEND), _alloc(3, 512, BACKEND)]]}
    )
    assert memory.diff_peak_allocations(a, b) == [
        {"site": "prism_megatron/backend/activation.py:33 stage", "size": 512, "count_a": 1, "count_b": 2,
         "bytes": 512}
    ]  # fmt: skip
    assert memory.diff_peak_allocations(a, a) == []


def test_the_site_is_the_first_frames_outside_torch_and_outside_dispatch_modes():
    mode = ("/repo/prism_megatron/megatron/run/collectives.py", 64, "__torch_dispatch__")
    assert memory.allocation_site(_frames(TORCH, mode, TORCH, MODEL, BACKEND)) == (
        "megatron/core/transformer/mlp.py:120 forward < prism_megatron/backend/activation.py:33 stage"
    )
    assert memory.allocation_site(_frames(TORCH, BACKEND, MODEL), depth=1) == (
        "prism_megatron/backend/activation.py:33 stage"
    )
    assert memory.allocation_site(_frames(TORCH)) == "torch/nn/functional.py:10 linear"
    assert memory.allocation_site([]) == "?"


def test_memory_history_on_a_run_without_cuda_is_refused_before_anything_starts(tmp_path):
    from prism_megatron.emulation.plan import plan_run

    flags = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "64",
             "--max-position-embeddings", "64", "--vocab-size", "512", "--micro-batch-size", "1",
             "--global-batch-size", "8", "--train-iters", "2", "--prism-emulate", "--prism-world-size", "8",
             "--prism-device", "cpu", "--prism-memory-history", "--prism-out", str(tmp_path / "run")]  # fmt: skip
    with pytest.raises(ValueError, match=r"--prism-memory-history .* device is cpu"):
        plan_run(flags)
    assert not (tmp_path / "run").exists()
