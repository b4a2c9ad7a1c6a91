"""Peak memory of a real rank, by category: parameters, gradients, optimizer state, activations.

Memory fidelity is the cheap half of emulation: a real rank whose groups say 8192 allocates the
gradient buckets and distributed-optimizer shards of the 8192-GPU job, so measuring what it holds
measures what the production rank would hold. This module measures it.

On CPU there is no allocator with statistics, so `LiveStorageTracker` keeps an account of live
tensor storage: a dispatch mode sees every op's outputs, records each new storage's size, and a weak
reference tells it when the storage dies. Storages that exist before tracking starts (parameters,
gradient buffers) and optimizer state are labelled by `label_model` / `label_optimizer`; everything
else allocated during a step counts as activations (including temporaries of the backward pass).
Limits: storages allocated outside any torch op (by a C++ library writing into its own memory) are
not seen, nor are they when an op makes a view of them (a backend's buffer split on completion);
`UntypedStorage.resize_` is not followed.

On a modelled GPU (fake tensors) the device's own dispatch layer already sees every op, so a tracker
entered there rides it (`carried_by`) instead of adding a Python layer that every op pays for.

On CUDA the caching allocator's statistics give the peak: `max_memory_allocated` (what tensors
held at the peak) and `max_memory_reserved` (what the allocator held from the device, the number
that decides an out-of-memory), over the training steps. The categories at the peak: the static ones
from the labelled storages (they live through the steps), activations the remainder.

For the timeline's memory tracks the CPU account also keeps samples of the live bytes by category
(CLOCK_MONOTONIC ns, at most one per `SAMPLE_INTERVAL_NS` and `MAX_SAMPLES` in all, so sampling costs
an iteration nothing measurable); `last_samples()` gives those of the tracker that ran last.
"""

from __future__ import annotations

import collections
import contextlib
import dataclasses
import os
import pickle
import time
import traceback
import weakref
from collections.abc import Iterable, Iterator
from typing import Any, Protocol

import torch
from torch.utils._python_dispatch import TorchDispatchMode
from torch.utils._pytree import tree_flatten

PARAMETERS = "parameters"
GRADIENTS = "gradients"
OPTIMIZER_STATE = "optimizer_state"
ACTIVATIONS = "activations"
CATEGORIES = (PARAMETERS, GRADIENTS, OPTIMIZER_STATE, ACTIVATIONS)
SAMPLE_INTERVAL_NS = 1_000_000
MAX_SAMPLES = 20_000
_LAST_SAMPLES: list[tuple[int, ...]] = []


@dataclasses.dataclass(frozen=True, kw_only=True)
class MemoryReport:
    """Peak memory of one real rank."""

    peak_bytes: int
    """Highest total of live tracked storage (CPU) or the allocator's peak (CUDA)."""
    at_peak_bytes: dict[str, int]
    """Bytes per category at the moment of the peak."""
    category_peak_bytes: dict[str, int]
    """Each category's own peak (they need not coincide)."""
    method: str
    """How it was measured: 'live-storage' (CPU) or 'cuda-allocator'."""
    reserved_peak_bytes: int | None = None
    """The caching allocator's reserved peak (CUDA); None where nothing reserves (CPU)."""
    requested_peak_bytes: int | None = None
    """The peak of the bytes the program asked the caching allocator for (CUDA: its `requested_bytes`
    statistic). `peak_bytes` counts the blocks the allocator handed out, rounded up to 512 B and, for
    a large request served from a cached block, up to that block's size: that rounding depends on the
    cache's history (which blocks a stream's pending frees kept from reuse), this number does not.
    None on the CPU, whose account counts storage sizes, already what was requested."""
    at_peak_allocations: dict[str, Any] | None = None
    """With --prism-memory-history: the allocations live at the peak of the recorded history (the CUDA
    allocator's, or the live-storage account's on the CPU and a modelled GPU), by the lines that made
    them (`peak_allocations`); None without it."""

    def as_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self)


class _StorageAccount:
    """Live storages keyed by data pointer, with their size and category. With `fake_storage` (a
    modelled GPU: every tensor is a fake tensor, its storage a meta storage without an address) they
    are keyed by the storage object itself and counted, as the GPU would allocate them."""

    def __init__(self, *, fake_storage: bool = False) -> None:
        self.fake_storage = fake_storage
        self.entries: dict[int, tuple[int, str]] = {}
        self.current = dict.fromkeys(CATEGORIES, 0)
        self.category_peak = dict.fromkeys(CATEGORIES, 0)
        self.peak_total = 0
        self.at_peak = dict.fromkeys(CATEGORIES, 0)
        self.samples: list[tuple[int, ...]] = []
        """(time ns, bytes of each of CATEGORIES), throttled (see the module docstring)."""
        self._last_sample_ns = 0
        self.trace: collections.deque[tuple] | None = None
        """With a history (`LiveStorageTracker.start_history`): every storage counted from then on and
        every one dropped, (action, key, bytes, frames as (file, line, name) tuples), the latest
        HISTORY_MAX_ENTRIES of them, as the CUDA allocator keeps its own (`history` spells them out)."""
        self.history_baseline_bytes = 0

    def sample(self, *, force: bool = False) -> None:
        now_ns = time.monotonic_ns()
        if len(self.samples) < MAX_SAMPLES and (force or now_ns - self._last_sample_ns >= SAMPLE_INTERVAL_NS):
            self._last_sample_ns = now_ns
            self.samples.append((now_ns, *(self.current[c] for c in CATEGORIES)))

    def add(self, storage: torch.UntypedStorage, category: str) -> None:
        size_bytes = storage.nbytes()
        meta = storage.device.type == "meta"
        if size_bytes == 0 or (meta and not self.fake_storage):
            return
        ptr = storage._cdata if meta else storage.data_ptr()  # the storage's own address when it has no data
        if ptr in self.entries:
            if category != ACTIVATIONS:  # a label outranks "allocated during the step"
                self.relabel(ptr, category)
            return
        self.entries[ptr] = (size_bytes, category)
        self.current[category] += size_bytes
        weakref.finalize(storage, self._drop, ptr, size_bytes)
        if self.trace is not None:
            self.trace.append(("alloc", ptr, size_bytes, python_frames()))
        self._update_peaks()

    def relabel(self, ptr: int, category: str) -> None:
        size_bytes, old = self.entries[ptr]
        if old == category:
            return
        self.entries[ptr] = (size_bytes, category)
        self.current[old] -= size_bytes
        self.current[category] += size_bytes
        self._update_peaks()

    def _drop(self, ptr: int, size_bytes: int) -> None:
        entry = self.entries.get(ptr)
        if entry is None or entry[0] != size_bytes:
            return
        del self.entries[ptr]
        self.current[entry[1]] -= size_bytes
        if self.trace is not None:
            self.trace.append(("free", ptr, size_bytes, ()))
        self.sample()

    def _update_peaks(self) -> None:
        for category, value in self.current.items():
            self.category_peak[category] = max(self.category_peak[category], value)
        total = sum(self.current.values())
        if total > self.peak_total:
            self.peak_total = total
            self.at_peak = dict(self.current)
        self.sample()


class LiveStorageTracker(TorchDispatchMode):
    """Counts live tensor storage on the CPU by category (see the module docstring).

    Use as a context manager around the training steps, after `label_model` (and `label_optimizer`
    once the optimizer state exists). The most recent tracker is what the `torch.cuda` memory shims
    report while it is active.
    """

    def __init__(self, *, fake_storage: bool = False) -> None:
        super().__init__()
        self.account = _StorageAccount(fake_storage=fake_storage)
        self._carrier: StorageCarrier | None = None

    def label(self, category: str, tensors: Iterable[torch.Tensor | None]) -> None:
        assert category in CATEGORIES, category
        for tensor in tensors:
            if tensor is not None and isinstance(tensor, torch.Tensor):
                self.account.add(tensor.untyped_storage(), category)

    def label_model(self, model_chunks: Iterable[torch.nn.Module]) -> None:
        """Label parameters and their gradient storage (`main_grad` of Megatron's DDP, or `.grad`)."""
        for chunk in model_chunks:
            params = list(chunk.parameters())
            self.label(PARAMETERS, params)
            self.label(GRADIENTS, (getattr(p, "main_grad", None) for p in params))
            self.label(GRADIENTS, (p.grad for p in params))
            self.label(PARAMETERS, torch.nn.Module.buffers(chunk))  # DDP shadows .buffers

    def label_optimizer(self, optimizer: Any) -> None:
        """Label every tensor held in optimizer state, and fp32 main parameters of mixed precision."""
        for inner in _inner_optimizers(optimizer):
            for state in inner.state.values():
                self.label(OPTIMIZER_STATE, (v for v in state.values() if isinstance(v, torch.Tensor)))
        # The fp32 main parameters live on each Megatron optimizer (a chained one holds several).
        for child in getattr(optimizer, "chained_optimizers", None) or [optimizer]:
            for group in getattr(child, "shard_fp32_from_float16_groups", None) or ():
                self.label(OPTIMIZER_STATE, group)

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.observe(func, out)
        return out

    def observe(self, func: Any, out: Any) -> None:
        """Account the storages of what op `func` returned (as this tracker's dispatch layer does,
        or the layer that carries it: `carried_by`)."""
        # Most ops return one tensor: its own leaf, without walking a tree.
        for leaf in (out,) if isinstance(out, torch.Tensor) else tree_flatten(out)[0]:
            if isinstance(leaf, torch.Tensor) and leaf.device.type == "cpu":
                storage = leaf.untyped_storage()
                # A view of a storage no tracked op made is a backend's own buffer seen through
                # its completion (gloo's reduce-scatter splits a clone of its input when the program
                # waits): NCCL and the prism backend have none, so it is not the program's memory.
                # A view of a fake (meta) storage is skipped without asking its address: it has
                # none (`data_ptr` answers 0, in no entry, after a deprecation warning per call).
                if func.is_view and (
                    storage.device.type == "meta" or storage.data_ptr() not in self.account.entries
                ):
                    continue
                self.account.add(storage, ACTIVATIONS)

    def start_history(self) -> None:
        """From now on, keep the history of every storage counted and dropped, with the Python frames
        that allocated it (--prism-memory-history); what is live now is its baseline."""
        self.account.trace = collections.deque(maxlen=HISTORY_MAX_ENTRIES)
        self.account.history_baseline_bytes = sum(self.account.current.values())

    def history(self) -> dict[str, Any] | None:
        """The history in the form of the CUDA allocator's snapshot (`torch.cuda.memory._snapshot`:
        no segments, one device's trace), None without `start_history`."""
        if self.account.trace is None:
            return None
        trace = []
        for action, ptr, size, frames in self.account.trace:
            if action == "alloc":
                spelled = [{"filename": f, "line": line, "name": name} for f, line, name in frames]
                trace.append({"action": "alloc", "addr": ptr, "size": size, "frames": spelled})
            else:  # a drop: requested and completed at once (the viewer reads both)
                for freed in ("free_requested", "free_completed"):
                    trace.append({"action": freed, "addr": ptr, "size": size, "frames": []})
        return {"segments": [], "device_traces": [trace]}

    def __enter__(self) -> LiveStorageTracker:
        global _ACTIVE
        _ACTIVE = self
        self._carrier = _CARRIER
        if self._carrier is not None:
            self._carrier.carry(self)
            return self
        return super().__enter__()

    def __exit__(self, *exc: Any) -> None:
        global _ACTIVE, _LAST_SAMPLES
        _ACTIVE = None
        self.account.sample(force=True)
        _LAST_SAMPLES = self.account.samples
        if self._carrier is not None:
            self._carrier.carry(None)
            self._carrier = None
            return
        super().__exit__(*exc)

    def report(self, history_path: str | None = None) -> MemoryReport:
        """The account's peak; with a history, written to `history_path` (when given) and what was live
        at its peak (`peak_allocations`)."""
        at_peak_allocations = None
        history = self.history()
        if history is not None:
            at_peak_allocations = peak_allocations(
                history, self.account.history_baseline_bytes, max_entries=None
            )
            # Full, the deque has dropped its oldest events: the replay then starts past the baseline.
            at_peak_allocations["cut"] = len(self.account.trace) >= HISTORY_MAX_ENTRIES
            if history_path is not None:
                write_history(history, history_path)
                at_peak_allocations = {"history": history_path, **at_peak_allocations}
        return MemoryReport(
            peak_bytes=self.account.peak_total,
            at_peak_bytes=dict(self.account.at_peak),
            category_peak_bytes=dict(self.account.category_peak),
            method="live-storage",
            at_peak_allocations=at_peak_allocations,
        )


def last_samples() -> list[tuple[int, ...]]:
    """The samples of the CPU tracker that exited last: (time ns, bytes per CATEGORIES); [] on CUDA."""
    return list(_LAST_SAMPLES)


def _inner_optimizers(optimizer: Any) -> list[Any]:
    """torch optimizers inside a Megatron optimizer (chained, distributed, or plain)."""
    if hasattr(optimizer, "chained_optimizers"):
        return [inner for child in optimizer.chained_optimizers for inner in _inner_optimizers(child)]
    if hasattr(optimizer, "optimizer") and hasattr(optimizer.optimizer, "state"):
        return [optimizer.optimizer]
    return [optimizer] if hasattr(optimizer, "state") else []


def static_bytes(tensors: Iterable[torch.Tensor | None]) -> int:
    """Bytes of the distinct storages behind tensors (views of one buffer count once)."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        if tensor is not None:
            storage = tensor.untyped_storage()
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values())


def cuda_report(
    model_chunks: Iterable[torch.nn.Module], optimizer: Any, at_peak_allocations: dict[str, Any] | None = None
) -> MemoryReport:
    """CUDA: the allocator's peak; static categories from storage sizes, activations the remainder."""
    chunks = list(model_chunks)
    params = [p for chunk in chunks for p in chunk.parameters()]
    static = {
        PARAMETERS: static_bytes(params),
        GRADIENTS: static_bytes(getattr(p, "main_grad", None) for p in params),
        OPTIMIZER_STATE: static_bytes(
            v for inner in _inner_optimizers(optimizer) for s in inner.state.values() for v in s.values()
            if isinstance(v, torch.Tensor)
        ),
    }  # fmt: skip
    peak_bytes = torch.cuda.max_memory_allocated()
    at_peak = {**static, ACTIVATIONS: max(peak_bytes - sum(static.values()), 0)}
    return MemoryReport(
        peak_bytes=peak_bytes,
        at_peak_bytes=at_peak,
        category_peak_bytes=dict(at_peak),
        method="cuda-allocator",
        reserved_peak_bytes=torch.cuda.max_memory_reserved(),
        requested_peak_bytes=int(torch.cuda.memory_stats().get("requested_bytes.all.peak", 0)) or None,
        at_peak_allocations=at_peak_allocations,
    )


HISTORY_MAX_ENTRIES = 300_000
"""Events kept by --prism-memory-history (CUDA: the allocator's ring, several KB each with their
frames; the CPU account: its own deque); a run with more keeps the latest, and `peak_allocations`
then says the history was cut."""
MODE_FRAMES = ("__torch_dispatch__", "__torch_function__")
"""Frames of torch's dispatch and function modes: a mode that forwards every op would be every op's site."""
TORCH_FRAME_PARTS = ("/torch/", "<frozen", "/contextlib.py", "/functools.py")
"""Frames inside torch and Python's own helpers: an allocation's site is the first frame outside them."""


HISTORY_FRAMES = 40
"""Python frames kept per allocation in a live-storage history (the innermost ones)."""


def python_frames() -> tuple[tuple[str, int, str], ...]:
    """The calling Python frames outside this module, innermost first, as (filename, line, name) (no
    source lines read; `LiveStorageTracker.history` spells them as the CUDA allocator's history does)."""
    stack = traceback.StackSummary.extract(
        traceback.walk_stack(None), limit=HISTORY_FRAMES, lookup_lines=False
    )
    frames = [(frame.filename, frame.lineno, frame.name) for frame in stack]
    while frames and frames[0][0] == __file__:  # the account's own frames
        frames.pop(0)
    return tuple(frames)


def start_history() -> int:
    """Begin recording the CUDA caching allocator's events with their Python frames; returns the bytes
    already requested (the history does not see those allocations; its events carry requested sizes,
    so the baseline is the allocator's `requested_bytes`, not its rounded `allocated_bytes`)."""
    torch.cuda.memory._record_memory_history(
        enabled="all", context="alloc", stacks="python", max_entries=HISTORY_MAX_ENTRIES
    )
    stats = torch.cuda.memory_stats()
    return int(stats.get("requested_bytes.all.current", torch.cuda.memory_allocated()))


def dump_history(path: str) -> dict[str, Any]:
    """Write the CUDA allocator's recorded history to `path` and stop recording; returns the snapshot."""
    snapshot = torch.cuda.memory._snapshot()
    torch.cuda.memory._record_memory_history(enabled=None)
    write_history(snapshot, path)
    return snapshot


def write_history(snapshot: dict[str, Any], path: str) -> None:
    """A history in the CUDA snapshot's form, as the pickle pytorch.org/memory_viz opens, written whole."""
    from prism_megatron.files.atomic import atomic_open

    with atomic_open(path, "wb") as f:
        pickle.dump(snapshot, f)


def allocation_site(frames: list[dict[str, Any]], depth: int = 3) -> str:
    """The program's lines that allocated: the first `depth` frames outside torch and outside any
    mode's `__torch_dispatch__` or `__torch_function__` (MODE_FRAMES), innermost first, as
    'file:line function < caller < ...'."""
    kept = [
        f"{_short_path(frame.get('filename', '?'))}:{frame.get('line')} {frame.get('name')}"
        for frame in frames
        if frame.get("name") not in MODE_FRAMES
        and not any(part in frame.get("filename", "") for part in TORCH_FRAME_PARTS)
    ]
    if kept:
        return " < ".join(kept[:depth])
    return (
        f"{_short_path(frames[0].get('filename', '?'))}:{frames[0].get('line')} {frames[0].get('name')}"
        if frames
        else "?"
    )


def _short_path(filename: str) -> str:
    """The path from the package that holds the file (megatron/..., prism_megatron/..., torch/...)."""
    for package in ("/prism_megatron/", "/megatron/", "/torch/", "/benchmarks/"):
        index = filename.rfind(package)
        if index >= 0:
            return filename[index + 1 :]
    return os.path.basename(filename)


def peak_allocations(
    snapshot: dict[str, Any],
    baseline_bytes: int = 0,
    limit: int = 200,
    max_entries: int | None = HISTORY_MAX_ENTRIES,
) -> dict[str, Any]:
    """The allocations live at the highest point of a recorded history, by site and size.

    Replays the longest device trace (a process uses one device; 'alloc' adds a block, 'free_requested'
    removes it: the moments the allocator's statistics move, each event with its requested size) from
    `baseline_bytes` (requested before the history began);
    returns the peak the history reaches, the groups live there (site, size, count, bytes; the largest
    `limit` by bytes) and whether the history was cut (it holds `max_entries` events, the most a CUDA
    history keeps: its first event may not be the first of the run; None: never cut)."""
    traces = snapshot.get("device_traces") or [[]]
    trace = max(traces, key=len)
    live: dict[int, tuple[int, str]] = {}
    current, peak, peak_index = baseline_bytes, baseline_bytes, -1
    for index, event in enumerate(trace):
        action = event.get("action")
        if action == "alloc":
            live[event["addr"]] = (event["size"], "")
            current += event["size"]
        elif action == "free_requested":
            size, _ = live.pop(event["addr"], (event["size"], ""))
            current -= size
        if current > peak:
            peak, peak_index = current, index
    live.clear()
    for event in trace[: peak_index + 1]:
        if event.get("action") == "alloc":
            live[event["addr"]] = (event["size"], allocation_site(event.get("frames") or []))
        elif event.get("action") == "free_requested":
            live.pop(event["addr"], None)
    groups: dict[tuple[str, int], int] = {}
    for size, site in live.values():
        groups[(site, size)] = groups.get((site, size), 0) + 1
    rows = [
        {"site": site, "size": size, "count": count, "bytes": size * count}
        for (site, size), count in groups.items()
    ]
    rows.sort(key=lambda row: (-row["bytes"], row["site"]))
    return {
        "peak_bytes": peak,
        "baseline_bytes": baseline_bytes,
        "events": len(trace),
        "cut": max_entries is not None and len(trace) >= max_entries,
        "groups": rows[:limit],
        "num_groups": len(rows),
    }


def diff_peak_allocations(a: dict[str, Any], b: dict[str, Any]) -> list[dict[str, Any]]:
    """The groups (site, size) whose live count at the peak differs between two histories' peaks,
    largest difference in bytes first: what one run holds at its peak that the other does not."""
    count_a = {(g["site"], g["size"]): g["count"] for g in a["groups"]}
    count_b = {(g["site"], g["size"]): g["count"] for g in b["groups"]}
    rows = []
    for key in count_a.keys() | count_b.keys():
        delta = count_b.get(key, 0) - count_a.get(key, 0)
        if delta:
            rows.append({"site": key[0], "size": key[1], "count_a": count_a.get(key, 0),
                         "count_b": count_b.get(key, 0), "bytes": delta * key[1]})  # fmt: skip
    rows.sort(key=lambda row: (-abs(row["bytes"]), row["site"]))
    return rows


_ACTIVE: LiveStorageTracker | None = None


class StorageCarrier(Protocol):
    """A dispatch layer that sees every op's output and calls `tracker.observe(func, out)` for the
    tracker it carries (None: none), so that a tracker entered while it is active is not a dispatch
    layer of its own: each layer costs every op a Python call (and torch's dynamo guard around it),
    and on a modelled GPU most ops are a fake tensor's `prim.device`, which allocates nothing."""

    def carry(self, tracker: LiveStorageTracker | None) -> None: ...


_CARRIER: StorageCarrier | None = None


@contextlib.contextmanager
def carried_by(layer: StorageCarrier) -> Iterator[None]:
    """While this block runs, a `LiveStorageTracker` entered is carried by `layer` (an active
    dispatch mode that reports every op's output to it) instead of pushing a mode of its own."""
    global _CARRIER
    previous, _CARRIER = _CARRIER, layer
    try:
        yield
    finally:
        _CARRIER = previous


def cuda_memory_allocated_shim(device: Any = None) -> int:
    """`torch.cuda.memory_allocated` on the CPU device: live tracked bytes (0 when nothing tracks)."""
    return sum(_ACTIVE.account.current.values()) if _ACTIVE is not None else 0


def cuda_max_memory_allocated_shim(device: Any = None) -> int:
    """`torch.cuda.max_memory_allocated` on the CPU device: the tracked peak (0 when nothing tracks)."""
    return _ACTIVE.account.peak_total if _ACTIVE is not None else 0
