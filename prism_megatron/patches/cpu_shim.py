"""The CPU device shim: lets unmodified megatron-core (and Megatron-LM) run a real rank on a CPU.

megatron-core hard-codes CUDA in a few hundred places; the ones a GPT training step actually reaches
are few (see the research notes on CUDA sites): buffers on `torch.cuda.current_device()`,
`device="cuda"` literals, `torch.cuda.synchronize()`, the CUDA RNG tracker, `Tensor.type()` string
checks, streams and events in the MoE dispatcher, and two MoE bugs of 0.16.1 that only show without
Transformer Engine. Each is one record below, installed only for `--prism-device cpu`; the registry
counts calls so a report can say which ones a run used.

Nothing here fakes `torch.cuda.is_available()`: code that asks takes its CPU branch, which is what we
want (faking it made torch.compile crash inside dynamo in testing).
"""

from __future__ import annotations

import contextlib
import logging
import types
from collections.abc import Callable
from typing import Any

import torch
from torch.overrides import TorchFunctionMode

from prism_megatron.passes import memory
from prism_megatron.patches.pipeline_ops import PinnedSend
from prism_megatron.patches.registry import ModePatch, Patch
from prism_megatron.patches.versions import EVERY_VERIFIED

# `Tensor.type()` names that megatron-core's optimizer compares against (distrib_optimizer.py, clip_grads.py).
_CUDA_TYPE_NAMES = {
    torch.float32: "torch.cuda.FloatTensor",
    torch.float16: "torch.cuda.HalfTensor",
    torch.bfloat16: "torch.cuda.BFloat16Tensor",
    torch.float64: "torch.cuda.DoubleTensor",
    torch.int64: "torch.cuda.LongTensor",
    torch.int32: "torch.cuda.IntTensor",
    torch.uint8: "torch.cuda.ByteTensor",
    torch.bool: "torch.cuda.BoolTensor",
}


def _is_cuda_device(device: Any) -> bool:
    if isinstance(device, str):
        return device.startswith("cuda")
    return isinstance(device, torch.device) and device.type == "cuda"


class CudaToCpuMode(TorchFunctionMode):
    """Rewrites `device="cuda"` arguments, `.cuda()` and `.to("cuda")` to the CPU, and drops
    `pin_memory=True` (a CPU-only torch has no pinned allocator; the tensor is on the CPU either way).

    A torch function mode is the only hook that reaches a literal inside a Megatron function body
    (for example `torch.zeros(1, device="cuda")` in optimizer.py and schedules.py, or the pinned index
    of the context-parallel RoPE slice in rope_utils.py) without editing it.
    """

    def __init__(self, count: Callable[[], None]) -> None:
        super().__init__()
        self._count = count

    def __torch_function__(self, func, types, args=(), kwargs=None):
        if func is torch.Tensor.cuda:
            self._count()
            return args[0]
        if not kwargs and func is not torch.Tensor.to:
            # Nearly every call (every tensor method and attribute read of the program goes through
            # this mode): nothing to rewrite, so nothing more to look at.
            return func(*args)
        kwargs = kwargs or {}
        if "device" in kwargs and _is_cuda_device(kwargs["device"]):
            self._count()
            kwargs = {**kwargs, "device": "cpu"}
        if kwargs.get("pin_memory"):
            self._count()
            kwargs = {**kwargs, "pin_memory": False}
        if func is torch.Tensor.to and len(args) > 1 and _is_cuda_device(args[1]):
            self._count()
            args = (args[0], "cpu", *args[2:])
        return func(*args, **kwargs)


class _DummyEvent:
    """A CUDA event that is always complete: on CPU every op is done when it returns."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def record(self, stream: Any = None) -> None:
        pass

    def wait(self, stream: Any = None) -> None:
        pass

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def elapsed_time(self, end_event: Any) -> float:
        return 0.0


class _DummyStream:
    """A CUDA stream that runs everything in program order, as the CPU does."""

    def __init__(self, *args: Any, **kwargs: Any) -> None:
        pass

    def wait_stream(self, stream: Any) -> None:
        pass

    def wait_event(self, event: Any) -> None:
        pass

    def record_event(self, event: Any = None) -> _DummyEvent:
        return event or _DummyEvent()

    def synchronize(self) -> None:
        pass

    def query(self) -> bool:
        return True

    def __eq__(self, other: object) -> bool:
        return isinstance(other, _DummyStream)

    def __hash__(self) -> int:
        return 0


_THE_STREAM = _DummyStream()


def _cpu_get_rng_state(device: Any = "cuda") -> torch.Tensor:
    return torch.get_rng_state()


def _cpu_set_rng_state(new_state: torch.Tensor, device: Any = "cuda") -> None:
    torch.set_rng_state(new_state)


def _cpu_manual_seed(seed: int) -> None:
    # Not torch.manual_seed: it calls torch.cuda.manual_seed_all, and going through it recursed.
    torch.random.default_generator.manual_seed(int(seed))


def _tensor_type(original: Callable[..., Any]) -> Callable[..., Any]:
    def type_(self: torch.Tensor, *args: Any, **kwargs: Any) -> Any:
        if not args and not kwargs and self.device.type == "cpu" and self.dtype in _CUDA_TYPE_NAMES:
            return _CUDA_TYPE_NAMES[self.dtype]
        return original(self, *args, **kwargs)

    return type_


def _move_to_cpu(original: Callable[..., Any]) -> Callable[..., Any]:
    def maybe_move_tensor_to_cpu(tensor: Any, as_numpy: bool = False, record_stream: bool = False) -> Any:
        if torch.is_tensor(tensor) and not tensor.is_cuda and as_numpy:
            return tensor.numpy()
        return original(tensor, as_numpy=as_numpy, record_stream=record_stream)

    return maybe_move_tensor_to_cpu


def _pin_sends(original: Callable[..., Any]) -> Callable[..., Any]:
    def _p2p_ops(**kwargs: Any) -> dict[str, Any]:
        reqs = original(**kwargs)
        for key in ("send_next", "send_prev"):
            if key in reqs:
                reqs[key] = PinnedSend(reqs[key], kwargs[f"tensor_{key}"])
        return reqs

    return _p2p_ops


def _quiet_rng_logging(original: Any) -> types.SimpleNamespace:
    # The tracker warns when the CPU RNG moved inside a fork; on CPU the CPU RNG *is* the forked one.
    quiet = logging.getLogger("prism_megatron.cpu_rng_fork")
    quiet.setLevel(logging.ERROR)
    return types.SimpleNamespace(getLogger=lambda name=None: quiet)


def _const(value: Any) -> Callable[[Any], Callable[..., Any]]:
    def make(original: Any) -> Callable[..., Any]:
        def shim(*args: Any, **kwargs: Any) -> Any:
            return value

        return shim

    return make


def _use(replacement: Any) -> Callable[[Any], Any]:
    return lambda original: replacement


def _noop(original: Any) -> Callable[..., None]:
    def shim(*args: Any, **kwargs: Any) -> None:
        return None

    return shim


def _record(name: str, target: str, make: Callable[[Any], Any], reason: str, **kw: Any) -> Patch:
    return Patch(name=name, target=target, make=make, verified_on=EVERY_VERIFIED, reason=reason, **kw)


MEGATRON_CORE_SHIMS: tuple[Patch | ModePatch, ...] = (
    _record(
        "cpu.current_device",
        "torch.cuda:current_device",
        _const("cpu"),
        "buffers are allocated on device=torch.cuda.current_device() (param_and_grad_buffer, p2p recv, "
        "GlobalMemoryBuffer, MoE dispatch); 'cpu' puts them on the CPU",
        signature="() -> int",
    ),
    ModePatch(
        name="cpu.device_literals",
        make_mode=CudaToCpuMode,
        verified_on=EVERY_VERIFIED,
        reason="device='cuda' literals, pin_memory=True and .cuda() inside function bodies (optimizer "
        "found_inf, schedules total_num_tokens, clip_grads, rerun state machine, CP RoPE slice) are only "
        "reachable by a function mode",
    ),
    _record(
        "cpu.synchronize",
        "torch.cuda:synchronize",
        _noop,
        "batched p2p and shape exchange call torch.cuda.synchronize(); CPU ops are synchronous",
        signature="(device: torch.device | str | int | None = None) -> None",
    ),
    _record(
        "cpu.get_rng_state",
        "torch.cuda.random:get_rng_state",
        _use(_cpu_get_rng_state),
        "the model-parallel RNG tracker saves and restores CUDA RNG states; the CPU generator stands in",
        importers=("torch.cuda",),
        signature="(device: int | str | torch.device = 'cuda') -> torch.Tensor",
    ),
    _record(
        "cpu.set_rng_state",
        "torch.cuda.random:set_rng_state",
        _use(_cpu_set_rng_state),
        "counterpart of cpu.get_rng_state",
        importers=("torch.cuda",),
        signature="(new_state: torch.Tensor, device: int | str | torch.device = 'cuda') -> None",
    ),
    _record(
        "cpu.manual_seed",
        "torch.cuda.random:manual_seed",
        _use(_cpu_manual_seed),
        "CudaRNGStatesTracker.add seeds a CUDA generator per tracker state",
        importers=("torch.cuda",),
        signature="(seed: int) -> None",
    ),
    _record(
        "cpu.megatron_get_rng_state",
        "megatron.core.tensor_parallel.random:_get_cuda_rng_state",
        _use(lambda device="cuda", clone=False, graph_safe=False: torch.get_rng_state()),
        "fork() of the RNG tracker reads the CUDA generator through this module function",
        signature="(device: Union[int, str, torch.device] = 'cuda', clone: bool = False, graph_safe: bool = False) -> torch.Tensor",
    ),
    _record(
        "cpu.megatron_set_rng_state",
        "megatron.core.tensor_parallel.random:_set_cuda_rng_state",
        _use(lambda new_state, device=-1, graph_safe=False: torch.set_rng_state(new_state)),
        "counterpart of cpu.megatron_get_rng_state",
        signature="(new_state: torch.Tensor, device: int = -1, graph_safe: bool = False)",
    ),
    _record(
        "cpu.quiet_rng_fork_warning",
        "megatron.core.tensor_parallel.random:logging",
        _quiet_rng_logging,
        "fork() warns on every call that the CPU RNG changed inside it; on CPU that is the point",
        count_calls=False,
    ),
    _record(
        "cpu.tensor_type_names",
        "torch:Tensor.type",
        _tensor_type,
        "the distributed optimizer and clip_grads accept only 'torch.cuda.*Tensor' type strings",
        signature=None,
    ),
    _record(
        "cpu.stream",
        "torch.cuda:Stream",
        _use(_DummyStream),
        "the MoE alltoall dispatcher makes a device-to-host side stream",
        count_calls=False,
        signature="(device=None, priority=0, **kwargs)",
    ),
    _record(
        "cpu.event",
        "torch.cuda:Event",
        _use(_DummyEvent),
        "streams record events; CPU work is done when it returns",
        count_calls=False,
        signature="(enable_timing=False, blocking=False, interprocess=False, external=False)",
    ),
    _record(
        "cpu.current_stream",
        "torch.cuda:current_stream",
        _const(_THE_STREAM),
        "MoE dispatcher compares the current stream with its side stream",
        signature="(device: torch.device | str | int | None = None) -> torch.cuda.streams.Stream",
    ),
    _record(
        "cpu.default_stream",
        "torch.cuda:default_stream",
        _const(_THE_STREAM),
        "counterpart of cpu.current_stream",
        signature="(device: torch.device | str | int | None = None) -> torch.cuda.streams.Stream",
    ),
    _record(
        "cpu.stream_context",
        "torch.cuda:stream",
        _use(lambda stream: contextlib.nullcontext()),
        "`with torch.cuda.stream(s)` around MoE DtoH copies; one CPU stream",
        signature="(stream: Optional[ForwardRef('torch.cuda.Stream')]) -> torch.cuda.StreamContext",
    ),
    _record(
        "cpu.memory_allocated",
        "torch.cuda.memory:memory_allocated",
        _use(memory.cuda_memory_allocated_shim),
        "Megatron-LM logs memory through torch.cuda; the CPU tracker answers instead of 0",
        importers=("torch.cuda",),
        signature="(device: 'Device' = None) -> int",
    ),
    _record(
        "cpu.max_memory_allocated",
        "torch.cuda.memory:max_memory_allocated",
        _use(memory.cuda_max_memory_allocated_shim),
        "counterpart of cpu.memory_allocated",
        importers=("torch.cuda",),
        signature="(device: 'Device' = None) -> int",
    ),
    _record(
        "cpu.pin_p2p_send_buffers",
        "megatron.core.pipeline_parallel.p2p_communication:_p2p_ops",
        _pin_sends,
        "the overlapped p2p path frees a sent output before the send completes; gloo reads it later from "
        "its own thread, so the send request pins the storage until it is waited on",
        signature="(*, tensor_send_prev: Optional[torch.Tensor], tensor_recv_prev: Optional[torch.Tensor], "
        "tensor_send_next: Optional[torch.Tensor], tensor_recv_next: Optional[torch.Tensor], "
        "group: torch.distributed.distributed_c10d.ProcessGroup, prev_pipeline_rank: int, next_pipeline_rank: int)",
    ),
    _record(
        "cpu.moe_te_general_gemm",
        "megatron.core.transformer.moe.moe_utils:te_general_gemm",
        _use(None),
        "0.16.1 bug: RouterGatingLinearFunction reads te_general_gemm, defined only when TE imports "
        "(NameError); 0.19 defines it as None without TE, so there it changes nothing",
        count_calls=False,
        must_exist=False,
    ),
    _record(
        "cpu.moe_splits_to_numpy",
        "megatron.core.transformer.moe.moe_utils:maybe_move_tensor_to_cpu",
        _move_to_cpu,
        "converts to numpy only for CUDA tensors, so CPU split sizes stay tensors and all_to_all_single rejects them",
        importers=("megatron.core.transformer.moe.token_dispatcher",),
        signature="(tensor: torch.Tensor, as_numpy: bool = False, record_stream: bool = False) -> torch.Tensor",
    ),
)
