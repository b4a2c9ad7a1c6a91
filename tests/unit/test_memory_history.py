"""--prism-memory-history: the allocations live at a recorded history's peak, and who may ask for it."""

from __future__ import annotations

import pathlib
import pickle

import torch

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


def test_the_live_storage_account_keeps_the_same_history_and_names_what_is_live_at_its_peak(tmp_path):
    """On the CPU (and a modelled GPU) the account's storages make the history, in the CUDA form."""

    def step_of(tracker: memory.LiveStorageTracker) -> None:
        kept = torch.ones(1024)  # 4096 B, live at the peak
        temporary = torch.zeros(256)  # 1024 B, gone before it
        del temporary
        bigger = kept * 2  # 4096 B: the peak is here
        del bigger

    with memory.LiveStorageTracker() as tracker:
        baseline = torch.ones(64)
        tracker.label(memory.PARAMETERS, [baseline])
        tracker.start_history()
        step_of(tracker)
    report = tracker.report(str(tmp_path / "memory" / "rank-00000.pickle"))
    peak = report.at_peak_allocations
    assert peak["baseline_bytes"] == 256 and peak["peak_bytes"] == report.peak_bytes == 256 + 4096 + 4096
    source = pathlib.Path(__file__).read_text().splitlines()
    line_of = {
        text: next(i for i, line in enumerate(source, 1) if text in line)
        for text in ("kept = torch", "bigger =")
    }
    sites = {(g["site"].split(" < ")[0], g["size"]) for g in peak["groups"]}
    assert sites == {(f"test_memory_history.py:{line} step_of", 4096) for line in line_of.values()}
    assert peak["cut"] is False
    with open(peak["history"], "rb") as f:
        history = pickle.load(f)
    actions = [event["action"] for event in history["device_traces"][0]]
    assert actions.count("alloc") == 3 and actions.count("free_completed") == 3  # all gone by the end
