"""A modelled GPU as the device of a real rank: the real program on fake tensors, timed by the GPU model.

With `--prism-device model:<gpu>` a rank runs the training program exactly as configured (full
sizes) on torch's fake tensors on the CPU: every op computes its output's shape, dtype and strides
and no data, so a 405B model's rank needs no memory. Two dispatch layers see every op:

1. `_Timed` (here): collectives and values read out of tensors (below); every other op goes down,
   then is charged to the GPU model's `ModelledClock` (`charge`: GEMM, attention, memory-bound,
   launch), as the GPU model's own `ModelledTiming` does, unless a fused kernel stands for it
   (`fused_kernel`); then the host time and the clock's new time are logged, so the device
   timeline reads every host mark (the backend's issue and completion times included) as the
   modelled time at that moment (`prism_megatron.replay.timeline.set_time_map`). One layer, not
   ModelledTiming under this one: a layer costs every op a Python call, and a 405B rank runs
   hundreds of thousands. For the same reason it carries the memory tracker of the training steps
   (`passes.memory.carried_by`: each op's output is accounted here) and answers a fake tensor's
   `prim.device` itself (two of three ops: C++ asks it of the arguments) as the fake mode would.
2. torch's `FakeTensorMode`: runs the op's shape rules.

Collectives (`c10d` ops) do not go down: fake tensors carry no storage, and on fake tensors torch
answers them without calling the backend. They go to the CPU kernel of the same op with meta
tensors of the same shapes, so the `prism` backend serves them as on the CPU (its op log records
the full-size bytes; its data steps are torch ops, no-ops on meta tensors). A collective takes no
modelled device time on the rank: the capture pass times compute, and the simulation gives every
collective its network cost. Under `--tp-comm-overlap`, `tp_overlap` serves the sequence-parallel
collectives Transformer Engine overlaps with a GEMM: issued async, waited inside that GEMM
(`log_at` places the wait in modelled time), so the graph overlaps them.

Values read out of a tensor (`.item()`, `bool(t)`: `aten._local_scalar_dense`): where torch's fake
tensors keep the value (a small tensor made from Python numbers and what is computed from such alone,
like the optimizer's step counter), it is read as it is. Every other value has no data to read; the
stand-in is zero of the tensor's dtype, and why that is what a healthy step reads:

| read | stand-in | effect |
|---|---|---|
| loss (`.item()` of the reduced loss) | 0.0 | logged only |
| grad norm (`get_grad_norm_fp32`) | 0.0 | below --clip-grad: no clipping kernel, as in most steps |
| found-inf (fp16 loss scaler) | 0.0 | no overflow: the step is taken |
| update_successful, skipped-iteration flags | 0 | reduced and logged only |
| Megatron-LM's do_train / do_valid / do_test (a 3-element tensor) | its own rule, on every rank (`patches/arguments.py`) | the script trains |
| MoE token counts (split sizes, tokens per expert) | balanced: each expert gets T x topk / E of a rank's T routed tokens, the remainder spread round the experts (`patches/modelled_moe.py`) | every expert GEMM has its even share; the all-to-all sends T x topk rows |
| MoE aux-loss logging (Megatron-LM's `track_moe_metrics`) | 0.0 | logged only |

What a GPU run fuses is charged as the fused kernel (`gpu_model/README.md`, "Fused Transformer Engine
kernels", has the bytes and sources): the ops run inside a `fused_kernel` scope and are not charged,
or a handler in `op_fusions` re-prices one op. Per flag:

| fused on a GPU | off with | charged by |
|---|---|---|
| norms | (always) | `fuse_norms` here |
| attention | (always) | the attention op itself |
| the context-parallel ring's merges and gradient accumulations | (always) | `layers/ring.py` (`memory_kernel`) |
| gradient accumulation into FP32 main grads | `--no-gradient-accumulation-fusion` | `modelled_fusions` (`op_fusions`) |
| bias + GeLU / bias + SwiGLU | `--no-bias-gelu-fusion` / `--no-bias-swiglu-fusion` | `modelled_fusions` |
| bias + dropout + residual add | `--no-bias-dropout-fusion` | `modelled_fusions` |
| RoPE | `--no-rope-fusion` | `modelled_fusions` |
| cross-entropy | on only with `--cross-entropy-loss-fusion --cross-entropy-fusion-impl te` (the native impl is charged op by op) | `modelled_fusions` |
| Adam (multi-tensor FusedAdam) | (always) | `modelled_fusions` |

Each op is charged as if it ran alone; what the communication kernels overlapping it take from it
on a GPU is charged by the simulation (`sim/contention.py`), which knows the schedule: the graph
records the device (`metadata.extra["device"]`).

The modelled clock starts at `CLOCK_ORIGIN_NS`. Why a log and not a clock in C++: the marks of the
timeline and of the backend are host times recorded in C++; one op runs at a time in this process, so
the modelled time at any host time is the clock's value after the last op that ended before it, and
reading the marks through that step function gives the same times without a second clock in C++.
"""

from __future__ import annotations

import bisect
import contextlib
import time
from collections.abc import Iterator
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode
from torch.utils._python_dispatch import TorchDispatchMode, _disable_current_modes
from torch.utils._pytree import tree_map

from prism_megatron import gpu_model
from prism_megatron.gpu_model import fused
from prism_megatron.megatron.layers import attention_blocks
from prism_megatron.passes import memory
from prism_megatron.patches import modelled_device as modelled_patches
from prism_megatron.replay import timeline

CLOCK_ORIGIN_NS = 1_000_000_000
"""Where the modelled device's clock starts (any positive time: marks of 0 read "not written")."""

_CPU_KEYS = torch._C.DispatchKeySet(torch._C.DispatchKey.CPU)


_DEVICE_OF = torch.ops.prim.device.default


def _fake_device(tensor: FakeTensor) -> torch.device:
    """`prim.device` of a fake tensor, as torch's FakeTensorMode answers it (the meta device while a
    fake kernel runs, else the device it stands for). C++ asks it of nearly every argument of every
    op (about two of three ops a modelled rank dispatches); answered here, it costs one Python call
    instead of going down through the fake mode. It allocates nothing and takes no device time."""
    return torch.device("meta") if tensor.fake_mode.in_kernel_invocation else tensor.fake_device


def _as_meta(value: Any, originals: dict[int, Any]) -> Any:
    if (
        isinstance(value, torch.Tensor) and value.device.type != "meta"
    ):  # fake (or a real one the program made before)
        meta = torch.empty_strided(value.shape, value.stride(), dtype=value.dtype, device="meta")
        originals[id(meta)] = value
        return meta
    return value


TOP_OPS = 40
"""aten ops kept in a rank's results with their charged time (the largest), to hold against a GPU's
profile of the same program (benchmarks/published/against_gpu.py)."""


class ModelledDevice:
    """The modelled GPU of this process: enter it around everything the program computes."""

    def __init__(self, gpu_name: str) -> None:
        self.gpu = gpu_model.gpu_spec(gpu_name)
        self.gpu_name = gpu_name
        self.clock = gpu_model.ModelledClock(self.gpu)
        self.fake_mode = FakeTensorMode(allow_non_fake_inputs=True)
        self.by_op_ns: dict[str, int] = {}
        """Charged time by aten op name (for where a modelled iteration's time goes)."""
        self.num_fused_scopes = 0
        """Open `fused_kernel` scopes: their ops are not charged, the fused kernel is."""
        self.op_fusions: dict[Any, Any] = {}
        """aten op -> `handler(func, args, kwargs, out) -> bool`, asked before an op outside fused
        scopes is charged; True: the handler charged it (a fusion of `modelled_fusions`)."""
        self.op_calls: dict[object, list] = {}
        """The clock's key of each memory-bound op call -> [count, charged ns, (name, each tensor
        argument's shape, dtype and strides)]: where a GPU profile of the same program differs, by
        shape and layout."""
        self.gemms: dict[tuple, list[int]] = {}
        """(aten op name, its operands' shapes) -> [count, charged ns, FLOPs] of every GEMM charged op
        by op (not those a fusion re-priced): which shapes the model was asked to time."""
        self.num_collectives = 0
        self.num_scalar_reads = 0
        self.fused_modules: dict[str, int] = {}
        """Per fusion charged as fused kernels, how many modules it covers (`modelled_fusions`)."""
        self.iterations_by_kind_ns: list[dict[str, int]] = []
        """Per finished training iteration, the modelled device time charged in it, by kind."""
        self._iteration_start: dict[str, int] | None = None
        self.tp_overlap = None
        """`tp_overlap.TpCommOverlap` under --tp-comm-overlap: TE's userbuffers overlap, else None."""
        self.attention_kernel: str | None = self.gpu.attention_kernel
        """The fused attention kernel attention is timed as (`use_attention_kernel`); None where the
        program's flags run none."""

    def use_attention_kernel(self, kernel: str | None) -> None:
        """Time fused attention from now on as `kernel` runs it (`gpu_model.specs.ATTENTION_KERNELS`):
        the kernel a GPU run of the program's flags takes (`modelled_fusions.attention_kernel`). None:
        the run has no fused attention kernel (its attention's ops are timed one by one)."""
        self.attention_kernel = kernel
        if kernel is not None:
            self.gpu = self.gpu.with_attention_kernel(kernel)
            self.clock.use(self.gpu)

    def iteration_begins(self) -> None:
        self._iteration_start = self.by_kind_ns()

    def iteration_ends(self) -> None:
        start, now = self._iteration_start or {}, self.by_kind_ns()
        self.iterations_by_kind_ns.append({kind: ns - start.get(kind, 0) for kind, ns in now.items()})
        self._iteration_start = None

    def now_ns(self) -> int:
        """The modelled device's clock (ns, from CLOCK_ORIGIN_NS)."""
        return CLOCK_ORIGIN_NS + int(self.clock.now_ns)

    def log_time(self) -> None:
        """From this host time on, the device timeline reads the clock's present value."""
        now = self.now_ns()
        if now != self._model_ns[-1]:
            self._host_ns.append(time.monotonic_ns())
            self._model_ns.append(now)

    def log_at(self, clock_ns: int) -> None:
        """From this host time on, the timeline reads `clock_ns` (a time the clock has passed, not
        before the last one logged): a point inside the op just charged, where an overlapped
        collective is posted or waited (`tp_overlap`)."""
        model_ns = CLOCK_ORIGIN_NS + int(clock_ns)
        assert self._model_ns[-1] <= model_ns <= self.now_ns(), (self._model_ns[-1], model_ns)
        if model_ns != self._model_ns[-1]:
            self._host_ns.append(time.monotonic_ns())
            self._model_ns.append(model_ns)

    def tick(self) -> None:
        """One nanosecond of modelled time: before every mark and every collective, so that two
        marks with no op between them (consecutive pipeline calls, a collective's issue after the
        previous one's completion) are ordered in time as on a device, where nothing takes no time.
        The graph assigns each pipeline transfer to the call whose span holds its issue time."""
        if self.tp_overlap is not None:
            self.tp_overlap.settle()
        self.clock.advance(1, "launch")
        self.log_time()

    def modelled_at(self, host_ns: int) -> int:
        """The modelled device's time at a host time (the clock after the last op before it)."""
        return self._model_ns[max(0, bisect.bisect_right(self._host_ns, host_ns) - 1)]

    @contextlib.contextmanager
    def active(self) -> Iterator[ModelledDevice]:
        """Fake tensors, the GPU model's timing, this layer on top, and the timeline reading
        modelled time."""
        self._host_ns, self._model_ns = [0], [self.now_ns()]
        timeline.set_time_map(self.modelled_at, on_mark=self.tick)
        attention_blocks.block_kernel = self.attention_block
        attention_blocks.memory_kernel = self.memory_kernel
        modelled_patches.inside_fused_kernel = self.inside_fused_kernel
        try:
            with self.fake_mode, _Timed(self) as timed, memory.carried_by(timed):
                yield self
        finally:
            attention_blocks.block_kernel = attention_blocks.memory_kernel = None
            modelled_patches.inside_fused_kernel = None
            timeline.set_time_map(None)

    def attention_block(
        self, q_shape: torch.Size, k_shape: torch.Size, dtype: torch.dtype, mask, *, backward: bool
    ) -> contextlib.AbstractContextManager[None]:
        """One context-parallel attention block ([s, b, heads, d] queries, [s, b, groups, d] keys) as
        the flash-attention kernel a GPU runs for it (`layers/attention_blocks.py`)."""
        sq, batch, heads, head_dim = q_shape
        time_ns = gpu_model.attention_time(
            self.gpu, batch=batch, num_heads=heads, num_kv_heads=k_shape[2], seq_q=sq, seq_kv=k_shape[0],
            head_dim=head_dim, causal=mask.causal, dtype=dtype, backward=backward,
        )  # fmt: skip
        return self.fused_kernel(time_ns, "attention")

    def memory_kernel(self, num_bytes: int) -> contextlib.AbstractContextManager[None]:
        """One memory-bound kernel reading and writing `num_bytes` in all (`gpu_model.fused`)."""
        return self.fused_kernel(fused.memory_kernel_time(self.gpu, num_bytes))

    def inside_fused_kernel(self) -> bool:
        """Whether an op now runs inside a `fused_kernel` scope (not charged)."""
        return self.num_fused_scopes > 0

    @contextlib.contextmanager
    def fused_kernel(self, time_ns: int, kind: str = "memory") -> Iterator[None]:
        """The ops inside are one fused GPU kernel of `time_ns` (the GPU model's `fused` prices):
        they run (their outputs are needed) but only the kernel is charged. A scope inside another
        is a kernel of its own (a norm between the attention's output and its bias-dropout-add):
        each is charged once, none of the ops inside either."""
        self.num_fused_scopes += 1
        try:
            yield
        finally:
            self.num_fused_scopes -= 1
        self.clock.advance(time_ns, kind)
        self.log_time()

    def summary(self) -> dict[str, Any]:
        """What the rank's results keep: the GPU, its modelled time by kind, and the counts."""
        return {
            "gpu": self.gpu_name,
            "attention_kernel": self.attention_kernel,
            "modelled_ns_by_kind": self.by_kind_ns(),
            "modelled_ns": int(self.clock.now_ns),
            "iterations_by_kind_ns": self.iterations_by_kind_ns,
            "top_ops_ns": dict(sorted(self.by_op_ns.items(), key=lambda item: -item[1])[:TOP_OPS]),
            "top_op_calls": self.top_op_calls(),
            "gemms": [
                {
                    "op": op,
                    "shapes": [list(shape) for shape in shapes],
                    "count": count,
                    "ns": ns,
                    "flops": flops,
                }
                for (op, shapes), (count, ns, flops) in sorted(
                    self.gemms.items(), key=lambda item: -item[1][1]
                )
            ],
            "num_collectives": self.num_collectives,
            "num_scalar_reads": self.num_scalar_reads,
            "fused_modules": self.fused_modules,
            **({"tp_comm_overlap": self.tp_overlap.summary()} if self.tp_overlap is not None else {}),
        }

    def top_op_calls(self) -> list[dict[str, Any]]:
        """The memory-bound op calls that took the most time, by op and tensor arguments (calls that
        differ only in a scalar argument together)."""
        merged: dict[tuple, list[int]] = {}
        for count, ns, call in self.op_calls.values():
            entry = merged.setdefault(call, [0, 0])
            entry[0] += count
            entry[1] += ns
        return [
            {"op": op, "inputs": [_tensor_record(*tensor) for tensor in inputs], "count": count, "ns": ns}
            for (op, inputs), (count, ns) in sorted(merged.items(), key=lambda item: -item[1][1])[:TOP_OPS]
        ]

    def by_kind_ns(self) -> dict[str, int]:
        """Modelled device time charged so far, by kind (gemm, attention, memory, launch)."""
        return {kind: int(ns) for kind, ns in self.clock.by_kind_ns.items()}


class _Timed(TorchDispatchMode):
    """Collectives to the backend on meta tensors, stand-ins for scalar reads, the clock kept in C++;
    and the memory tracker's account of every op's output when it carries one (`memory.carried_by`:
    one Python layer per op instead of two)."""

    def __init__(self, device: ModelledDevice) -> None:
        super().__init__()
        self.device = device
        self.tracker: memory.LiveStorageTracker | None = None

    def carry(self, tracker: memory.LiveStorageTracker | None) -> None:
        self.tracker = tracker

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is _DEVICE_OF and type(args[0]) is FakeTensor:
            return _fake_device(args[0])
        out = self._dispatch(func, args, kwargs or {})
        if self.tracker is not None:
            self.tracker.observe(func, out)
        return out

    def _dispatch(self, func, args, kwargs):
        namespace = func.namespace
        if namespace == "c10d":
            return self._collective(func, args, kwargs)
        if namespace == "_c10d_functional":
            raise NotImplementedError(
                f"--prism-device model:<gpu>: functional collective {func} is not served on a modelled "
                "device (the program's collectives must use torch.distributed's in-place calls)"
            )
        if func is torch.ops.aten._local_scalar_dense.default:
            return self._scalar(args[0])
        out = func(*args, **kwargs)
        device = self.device
        if not device.num_fused_scopes:
            fusion = device.op_fusions.get(func)
            if fusion is not None and fusion(func, args, kwargs, out):
                device.log_time()
                return out
            timed = device.clock.charge(func, args, kwargs, out)
            if timed.time_ns:
                name = func.__name__
                device.by_op_ns[name] = device.by_op_ns.get(name, 0) + timed.time_ns
                if timed.kind == "gemm":
                    _count_gemm(device.gemms, name, args, timed)
                else:
                    _count_call(device.op_calls, device.clock.last_key, name, args, timed)
            overlap = device.tp_overlap
            if overlap is None or not overlap.charged(timed.time_ns, timed.kind):
                device.log_time()
        return out

    def _collective(self, func, args, kwargs):
        self.device.num_collectives += 1
        overlap = self.device.tp_overlap
        if overlap is not None:
            served = overlap.collective(func, lambda async_op: self._issue(func, args, kwargs, async_op))
            if served is not None:
                return served
        self.device.tick()
        return self._issue(func, args, kwargs)

    def _issue(self, func, args, kwargs, async_op: bool | None = None):
        """The c10d op to the backend on meta tensors (`async_op` set: with that flag instead of the
        program's)."""
        if async_op is not None:
            names = [a.name for a in func._schema.arguments]
            args = tuple(async_op if n == "async_op" else v for n, v in zip(names, args, strict=False))
            kwargs = {**kwargs, "async_op": async_op} if "async_op" in kwargs else kwargs
        originals: dict[int, Any] = {}
        with _disable_current_modes():
            meta_args = tree_map(lambda v: _as_meta(v, originals), args)
            meta_kwargs = tree_map(lambda v: _as_meta(v, originals), kwargs)
            out = func.redispatch(_CPU_KEYS, *meta_args, **meta_kwargs)
        return tree_map(lambda v: originals.get(id(v), v) if isinstance(v, torch.Tensor) else v, out)

    def _scalar(self, tensor: torch.Tensor):
        constant = getattr(tensor, "constant", None)
        if constant is not None:  # a value fake tensors keep (Adam's step counter): read as it is
            with _disable_current_modes():
                return constant.item()
        self.device.num_scalar_reads += 1
        if tensor.dtype.is_floating_point:
            return 0.0
        if tensor.dtype == torch.bool:
            return False
        return 0


def _count_gemm(gemms: dict[tuple, list[int]], name: str, args, timed) -> None:
    key = (name, tuple(tuple(a.shape) for a in args if isinstance(a, torch.Tensor)))
    entry = gemms.get(key)
    if entry is None:
        entry = gemms[key] = [0, 0, 0]
    entry[0] += 1
    entry[1] += timed.time_ns
    entry[2] += timed.flops


def _count_call(calls: dict[object, list], key: object, name: str, args, timed) -> None:
    """One charged memory-bound op, counted under the clock's key of the call; its tensor arguments'
    shapes, dtypes and strides are read once per key (a layout the GPU would run otherwise, a
    broadcast or a transposed operand, shows in the strides)."""
    entry = calls.get(key)
    if entry is None:
        try:
            tensors = tuple(
                (tuple(map(int, a.shape)), str(a.dtype).removeprefix("torch."), tuple(map(int, a.stride())))
                for a in args
                if isinstance(a, torch.Tensor)
            )
        except Exception:  # an unbacked symbolic size has no integer value yet
            tensors = ()
        entry = calls[key] = [0, 0, (name, tensors)]
    entry[0] += 1
    entry[1] += timed.time_ns


def _tensor_record(shape: tuple, dtype: str, stride: tuple) -> dict[str, Any]:
    return {"shape": list(shape), "dtype": dtype, "stride": list(stride)}


NORM_TYPES: tuple[type, ...] = (torch.nn.RMSNorm, torch.nn.LayerNorm)
"""Norm modules a GPU runs as one fused Transformer Engine kernel (forward and backward)."""


def fuse_norms(device: ModelledDevice, model_chunks) -> int:
    """Charge every norm of the model (torch's RMSNorm and LayerNorm, the classes megatron-core's
    local spec and prism's sequence-parallel norm build) as Transformer Engine's fused norm kernel,
    forward and backward (`gpu_model.fused.norm_time`), in place of the unfused ops torch runs, and
    keep what that kernel keeps for its backward (`_FusedNorm`), not the FP32 intermediates of
    torch's decomposed RMSNorm (two FP32 copies of the input per norm; torch's LayerNorm is one op
    that already keeps the input and its statistics).

    The forward is scoped by forward hooks; the backward by full backward hooks, which fire when the
    gradient of the norm's output arrives and when its input's is made: the ops between are the
    norm's backward (the autograd engine runs one node at a time on this thread). Returns the number
    of norms so charged."""
    count = 0
    for chunk in model_chunks:
        for module in chunk.modules():
            if isinstance(module, NORM_TYPES):
                _hook_norm(device, module)
                count += 1
    return count


def _norm_time(device: ModelledDevice, module: torch.nn.Module, x: torch.Tensor, *, backward: bool) -> int:
    hidden = x.shape[-1]
    return fused.norm_time(
        device.gpu,
        tokens=x.numel() // hidden,
        hidden=hidden,
        dtype=x.dtype,
        backward=backward,
        layer_norm=isinstance(module, torch.nn.LayerNorm),
    )


class _FusedNorm(torch.autograd.Function):
    """A norm as Transformer Engine's fused kernel holds it, on fake tensors: the output and the
    gradients have the shapes and dtypes of torch's norm; saved for the backward are the input and
    one FP32 statistic per token (rsigma, and LayerNorm's mean), as TE's `rmsnorm_fwd` /
    `layernorm_fwd` return them for their backward. Fake tensors have no values to compute."""

    @staticmethod
    def forward(ctx, x: torch.Tensor, weight: torch.Tensor | None, bias: torch.Tensor | None, stats: int):
        per_token = [x.new_empty(x.shape[:-1], dtype=torch.float32) for _ in range(stats)]
        ctx.save_for_backward(x, *per_token)
        ctx.weight_like = weight
        ctx.bias_like = bias
        return torch.empty_like(x)

    @staticmethod
    def backward(ctx, grad: torch.Tensor):
        x = ctx.saved_tensors[0]
        weight, bias = ctx.weight_like, ctx.bias_like
        return (
            torch.empty_like(x),
            None if weight is None else torch.empty_like(weight),
            None if bias is None else torch.empty_like(bias),
            None,
        )


def _hook_norm(device: ModelledDevice, module: torch.nn.Module) -> None:
    open_scopes: list[contextlib.AbstractContextManager] = []
    torch_forward = module.forward
    layer_norm = isinstance(module, torch.nn.LayerNorm)

    def fused_forward(x: torch.Tensor) -> torch.Tensor:
        if not isinstance(x, FakeTensor):  # a real tensor's values are wanted: torch computes them
            return torch_forward(x)
        bias = getattr(module, "bias", None) if layer_norm else None
        return _FusedNorm.apply(x, module.weight, bias, 2 if layer_norm else 1)

    module.forward = fused_forward

    def forward_pre(mod, args):
        scope = device.fused_kernel(_norm_time(device, mod, args[0], backward=False))
        scope.__enter__()
        open_scopes.append(scope)

    def forward_post(mod, args, output):
        open_scopes.pop().__exit__(None, None, None)

    def backward_pre(mod, grad_output):
        scope = device.fused_kernel(_norm_time(device, mod, grad_output[0], backward=True))
        scope.__enter__()
        open_scopes.append(scope)

    def backward_post(mod, grad_input, grad_output):
        if open_scopes:
            open_scopes.pop().__exit__(None, None, None)

    module.register_forward_pre_hook(forward_pre)
    module.register_forward_hook(forward_post)
    module.register_full_backward_pre_hook(backward_pre)
    module.register_full_backward_hook(backward_post)
