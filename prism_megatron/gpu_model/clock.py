"""One process's modelled device clock, and the dispatch mode that advances it op by op.

A modelled run dispatches hundreds of thousands of aten ops (a 405B rank of a 16,384-GPU job), most
of them repeats of a few dozen (op, shapes) pairs, layer after layer. So the answer of `op_time` is
cached per (GPU, op, argument shapes/strides/dtypes and plain argument values), and the common
no-cost ops (views, `prim.device`, detach) are decided from the op alone before any key is built.
The cache is shared by all clocks of a process (answers depend only on the key), so a second
modelled run in the same process costs only the lookups.

The clock is one serial device stream: `now_ns` is the sum of all charged times. What overlaps on a
GPU (communication on its own stream) is the caller's to model with `advance`.
"""

from __future__ import annotations

import contextlib

import torch
from torch.utils._python_dispatch import TorchDispatchMode

from prism_megatron.gpu_model.ops import KINDS, NONE, OpTime, classify, op_time
from prism_megatron.gpu_model.specs import GpuSpec, gpu_spec

_KIND_OF_FUNC: dict[object, str] = {}
"""OpOverload -> classify(func), filled as ops are first seen."""

_CACHE: dict[tuple, OpTime] = {}
"""((gpu name, attention kernel), func, argument key) -> OpTime."""


def _key(value):
    """A hashable stand-in for an argument: tensors by shape, stride and dtype; the rest by value."""
    if isinstance(value, torch.Tensor):
        return (value.shape, value.stride(), value.dtype)  # torch.Size and the stride tuple hash as is
    if isinstance(value, (list, tuple)):
        return tuple([_key(v) for v in value])
    if value is None or isinstance(value, (bool, int, float, str, torch.dtype, torch.device, torch.layout)):
        return value
    if isinstance(value, dict):
        return tuple(sorted((k, _key(v)) for k, v in value.items()))
    return repr(value)


class ModelledClock:
    """The modelled device time of one process on one GPU.

    Attributes:
        gpu: the modelled GPU.
        now_ns: device time charged so far (ns since the clock was made).
        by_kind_ns: `now_ns` split by kind ("gemm", "attention", "memory", "launch", "none" and any
            kind a caller passes to `advance`); its values always sum to `now_ns`.
        num_ops: ops charged (those of kind "none" included).
        flops: FLOPs of the charged ops by torch's count (ops.py), for TFLOP/s and MFU.
    """

    def __init__(self, gpu: GpuSpec | str) -> None:
        self.gpu = gpu if isinstance(gpu, GpuSpec) else gpu_spec(gpu)
        self._gpu_key = (self.gpu.name, self.gpu.attention_kernel)
        self.now_ns = 0
        self.by_kind_ns: dict[str, int] = dict.fromkeys(KINDS, 0)
        self.num_ops = 0
        self.flops = 0
        self._uncharged_depth = 0
        self.last_key: object = None
        """The cache key (GPU, op, its arguments' shapes, strides, dtypes and values) of the last op
        charged a time: callers that keep per-call accounts key them by it instead of building one."""

    def use(self, gpu: GpuSpec) -> None:
        """Time the ops charged from now on on `gpu` (the same GPU with another attention kernel,
        `GpuSpec.with_attention_kernel`, once the program's flags say which one a GPU run takes)."""
        self.gpu = gpu
        self._gpu_key = (gpu.name, gpu.attention_kernel)

    @contextlib.contextmanager
    def uncharged(self):
        """Ops charged inside this block cost nothing and are not counted: for unfused CPU ops that
        stand for a fused GPU kernel the caller charges itself with `advance` (see fused.py)."""
        self._uncharged_depth += 1
        try:
            yield self
        finally:
            self._uncharged_depth -= 1

    def charge(self, func, args, kwargs, out) -> OpTime:
        """Time `func(*args, **kwargs) -> out` on the GPU and advance the clock by it."""
        if self._uncharged_depth:
            return NONE
        self.num_ops += 1
        kind = _KIND_OF_FUNC.get(func)
        if kind is None:
            kind = _KIND_OF_FUNC[func] = classify(func)
        if kind == "none":
            return NONE
        key = (self._gpu_key, func, _key(args), _key(kwargs) if kwargs else None)
        try:
            timed = _CACHE.get(key)
        except TypeError:  # a symbolic size (SymInt) does not hash: key by its printed form
            key = repr(key)
            timed = _CACHE.get(key)
        if timed is None:
            timed = _CACHE[key] = op_time(self.gpu, func, args, kwargs or {}, out)
        self.last_key = key
        self.now_ns += timed.time_ns
        self.flops += timed.flops
        self.by_kind_ns[timed.kind] = self.by_kind_ns.get(timed.kind, 0) + timed.time_ns
        return timed

    def advance(self, time_ns: int, kind: str) -> None:
        """Add `time_ns` of device time the caller modelled itself (a fused kernel, a wait)."""
        if time_ns < 0:
            raise ValueError(f"ModelledClock.advance: time_ns must be >= 0, got {time_ns}")
        self.now_ns += int(time_ns)
        self.by_kind_ns[kind] = self.by_kind_ns.get(kind, 0) + int(time_ns)


class ModelledTiming(TorchDispatchMode):
    """Every aten op dispatched under this mode runs (on whatever tensors it was given: fake ones in
    a modelled run) and is then charged to `clock`. Enter it inside a FakeTensorMode so that the ops
    reach it with fake tensors and run as fake ops."""

    def __init__(self, clock: ModelledClock) -> None:
        super().__init__()
        self.clock = clock

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        out = func(*args, **(kwargs or {}))
        self.clock.charge(func, args, kwargs, out)
        return out


def clear_cache() -> None:
    """Forget every cached op time (tests that change the constants table use it)."""
    _CACHE.clear()
    _KIND_OF_FUNC.clear()
