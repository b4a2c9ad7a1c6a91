"""Per aten op: which kind of kernel it is on a GPU, its FLOPs and bytes, and its modelled time.

Only shapes, strides and dtypes are read, so FakeTensors and meta tensors serve as well as real ones.
The kinds:

- "gemm": mm, addmm, bmm, baddbmm, _scaled_mm, _grouped_mm (gemm.py).
- "attention": torch's SDPA ops and the flash/efficient attention ops they call, forward and
  backward, on any backend (CUDA flash, memory-efficient, cuDNN, and the CPU flash op the program runs
  on a CPU), all charged as flash attention (attention.py); causal is read from the op's `is_causal`
  argument, GQA from the key's head count.
- "memory": every other op that writes a tensor (as its result or in place through an argument):
  bytes read and written over the achievable HBM bandwidth plus the launch cost (norms, activations, softmax, rotary, dropout, casts, copies, the
  optimizer's foreach ops ...). Accessed bytes count a broadcast (stride-0) dimension once. An
  elementwise op ATen cannot vectorise (`vectorised`: a per-element cast, a broadcast or differently
  laid-out operand) reaches only the table's `unvectorised_fraction` of that bandwidth. Gathers and
  in-place scatters (index, embedding, index_put_ ...) move the elements their index names, not
  the whole source or destination.
- "launch": a memory op so small that the launch cost is more than its traffic: its time is the
  launch cost and it is reported apart, as launch overhead.
- "none": views, metadata, allocation without initialisation, collectives (the caller models
  communication) and anything that writes no tensor: 0 ns.

FLOPs are torch's own count (`torch.utils.flop_counter`'s registry) wherever torch counts the op; the
CPU flash-attention ops, which the registry lacks, get torch's SDPA formula; _grouped_mm (not counted
by torch) gets 2 * m * n * k summed over groups. Flash attention's causal mask halves the work on a
GPU but not torch's count (which ignores the mask): the time follows the work, `flops` follows torch.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from torch.utils import flop_counter

from prism_megatron.gpu_model.attention import attention_time
from prism_megatron.gpu_model.gemm import gemm_time
from prism_megatron.gpu_model.specs import GpuSpec

aten = torch.ops.aten
KINDS = ("gemm", "attention", "memory", "launch", "none")


@dataclasses.dataclass(frozen=True, kw_only=True)
class OpTime:
    kind: str
    """One of KINDS."""
    time_ns: int
    """Modelled device time of the op's kernel(s)."""
    flops: int
    """FLOPs by torch's counter (0 for ops it does not count)."""
    bytes: int
    """HBM bytes the model charged (read + written; for GEMMs the three operands once)."""


NONE = OpTime(kind="none", time_ns=0, flops=0, bytes=0)

_GEMM_OPS = {aten.mm, aten.addmm, aten.bmm, aten.baddbmm, aten._scaled_mm}
if hasattr(aten, "_grouped_mm"):
    _GEMM_OPS.add(aten._grouped_mm)

# attention op packet -> (index of query in args, is backward)
_ATTENTION_OPS: dict[object, tuple[int, bool]] = {}
for _name, _query_at, _backward in (
    ("_scaled_dot_product_flash_attention", 0, False),
    ("_scaled_dot_product_efficient_attention", 0, False),
    ("_scaled_dot_product_cudnn_attention", 0, False),
    ("_scaled_dot_product_flash_attention_for_cpu", 0, False),
    ("_flash_attention_forward", 0, False),
    ("_efficient_attention_forward", 0, False),
    ("_scaled_dot_product_flash_attention_backward", 1, True),
    ("_scaled_dot_product_efficient_attention_backward", 1, True),
    ("_scaled_dot_product_cudnn_attention_backward", 1, True),
    ("_scaled_dot_product_flash_attention_for_cpu_backward", 1, True),
    ("_flash_attention_backward", 1, True),
    ("_efficient_attention_backward", 1, True),
):
    if hasattr(aten, _name):
        _ATTENTION_OPS[getattr(aten, _name)] = (_query_at, _backward)

# Layout (batch, heads, seq, dim) for SDPA-level ops; (batch, seq, heads, dim) for the kernels below.
_SEQ_MAJOR = {
    getattr(aten, n)
    for n in (
        "_flash_attention_forward",
        "_efficient_attention_forward",
        "_flash_attention_backward",
        "_efficient_attention_backward",
    )
    if hasattr(aten, n)
}

_NONE_OPS = {
    getattr(aten, n)
    for n in (
        "detach",
        "alias",
        "lift_fresh",
        "empty",
        "empty_like",
        "empty_strided",
        "new_empty",
        "new_empty_strided",
        "_local_scalar_dense",
        "sym_size",
        "sym_stride",
        "sym_numel",
        "sym_storage_offset",
        "set_",
        "is_same_size",
        "_has_compatible_shallow_copy_type",
        "resize_",
        "record_stream",
        "_unsafe_view",
        "_reshape_alias",
    )
    if hasattr(aten, n)
}
_NONE_NAMESPACES = ("prim", "c10d", "_c10d_functional", "_dtensor", "profiler", "_c10d_functional_autograd")
# Ops that overwrite their first argument without reading it.
_WRITE_ONLY_SELF = {
    getattr(aten, n)
    for n in ("copy_", "fill_", "zero_", "normal_", "uniform_", "bernoulli_", "random_", "exponential_")
    if hasattr(aten, n)
}


# Ops that gather elements by index: they read what they write (and the indices), not all of the source.
_GATHER_OPS = {
    getattr(aten, n) for n in ("index", "index_select", "gather", "embedding", "take") if hasattr(aten, n)
}
_SCATTERS = {getattr(aten, n) for n in ("scatter_", "scatter_add_", "scatter_reduce_") if hasattr(aten, n)}
_INDEX_PUT_OPS = {getattr(aten, n) for n in ("index_put_", "_index_put_impl_") if hasattr(aten, n)}
_ACCUMULATING_SCATTERS = {
    getattr(aten, n) for n in ("scatter_add_", "scatter_reduce_", "index_add_") if hasattr(aten, n)
}
# In-place ops that write only the elements an index names (read-modify-write where they accumulate).
_SCATTER_IN_PLACE_OPS = (
    _SCATTERS
    | _INDEX_PUT_OPS
    | {getattr(aten, n) for n in ("index_add_", "index_copy_", "index_fill_") if hasattr(aten, n)}
)
# Elementwise ops torch does not tag pointwise: copies and casts (in-place forms of tagged ops are
# found through their out-of-place form, `is_elementwise`).
_ELEMENTWISE_UNTAGGED = {getattr(aten, n) for n in ("_to_copy", "copy_", "clone") if hasattr(aten, n)}
_REDUCED_PRECISION = (torch.bfloat16, torch.float16)


def classify(func) -> str:
    """The kind of `func` (an OpOverload) before looking at shapes: gemm, attention, memory or none."""
    packet = func.overloadpacket
    if packet in _GEMM_OPS:
        return "gemm"
    if packet in _ATTENTION_OPS:
        return "attention"
    if packet in _NONE_OPS or func.namespace in _NONE_NAMESPACES or func.is_view:
        return "none"
    return "memory"


def accessed_bytes(t: torch.Tensor) -> int:
    """Bytes a kernel touches reading or writing `t` once: broadcast (stride-0) dims count once.

    A data-dependent size (an unbacked symbol of a fake tensor: nonzero, unique ...) is unknown
    before the program runs; such a tensor counts 0 bytes rather than failing the run.
    """
    try:
        if t.layout != torch.strided:  # sparse or nested: no strides to read, count every element
            return int(t.numel()) * t.element_size()
        elements = 1
        for size, stride in zip(t.shape, t.stride(), strict=True):
            if stride != 0:
                elements *= int(size)
    except Exception:  # torch raises its own data-dependent error types for unbacked sizes
        return 0
    return elements * t.element_size()


def _tensors(tree):
    if isinstance(tree, torch.Tensor):
        yield tree
    elif isinstance(tree, (list, tuple)):
        for item in tree:
            yield from _tensors(item)
    elif isinstance(tree, dict):
        for item in tree.values():
            yield from _tensors(item)


def _torch_flops(func, args, kwargs, out) -> int:
    formula = flop_counter.flop_registry.get(func.overloadpacket)
    if formula is None:
        return 0
    return int(formula(*args, **kwargs, out_val=out))


def _mutated(func, args, kwargs) -> list[torch.Tensor]:
    """Tensors an op writes in place through its arguments (schema `Tensor(a!)`), for ops such as
    the in-place foreach ops whose result is empty."""
    written = []
    for i, argument in enumerate(func._schema.arguments):
        if argument.alias_info is not None and argument.alias_info.is_write:
            value = kwargs.get(argument.name) if argument.kwarg_only or i >= len(args) else args[i]
            written += _tensors(value)
    return written


def _memory_op(gpu: GpuSpec, func, args, kwargs, out) -> OpTime:
    outs = list(_tensors(out)) or _mutated(func, args, kwargs)
    if not outs:
        return NONE
    inputs = list(_tensors(args)) + list(_tensors(kwargs))
    packet = func.overloadpacket
    if packet in _GATHER_OPS or packet in _SCATTER_IN_PLACE_OPS:
        total = _indexed_bytes(func, args, kwargs, inputs, outs)
    else:
        if packet in _WRITE_ONLY_SELF and inputs:
            inputs = inputs[1:]
        total = sum(accessed_bytes(t) for t in inputs) + sum(accessed_bytes(t) for t in outs)
    bandwidth = gpu.achievable_hbm_bytes_per_s
    if is_elementwise(func) and not vectorised(func, inputs, outs):
        bandwidth *= gpu.unvectorised_fraction
    traffic_ns = total / bandwidth * 1e9
    kind = "memory" if traffic_ns >= gpu.launch_ns else "launch"
    return OpTime(kind=kind, time_ns=round(gpu.launch_ns + traffic_ns), flops=0, bytes=total)


def _indexed_bytes(func, args, kwargs, inputs: list[torch.Tensor], outs: list[torch.Tensor]) -> int:
    """Bytes of an op that touches only the elements an index names.

    A gather (index, index_select, gather, embedding, take) reads as many source elements as it writes,
    and its indices. An in-place scatter (index_put_, scatter_, index_add_ ...) reads its indices and
    values and writes the elements they name, reading them first where it accumulates; the rest of
    `self` is not touched. Indices are the integer tensors after the source (or self).
    """
    written_ids = {id(t) for t in outs}
    # the indices: integer tensors after the source (or self), never the result
    indices = sum(
        accessed_bytes(t)
        for t in inputs[1:]
        if id(t) not in written_ids and not t.is_floating_point() and t.dtype not in (torch.bool, torch.uint8)
    )
    if func.overloadpacket in _GATHER_OPS:
        written = sum(accessed_bytes(t) for t in outs)
        if not written:  # a boolean mask's result: its size is known only once the program runs
            return sum(accessed_bytes(t) for t in inputs)  # at most, the whole source read once
        return 2 * written + indices
    self_ = outs[0]
    touched = _scattered_elements(func, args, self_)
    packet = func.overloadpacket
    if packet in _INDEX_PUT_OPS:
        accumulates = bool(_argument(func, args, kwargs, "accumulate", False))
    elif packet is getattr(aten, "scatter_", None):
        accumulates = _argument(func, args, kwargs, "reduce", None) is not None
    else:
        accumulates = packet in _ACCUMULATING_SCATTERS
    if packet in _SCATTERS:  # the source is read where the index names it: one element per index
        source = _argument(func, args, kwargs, "src", None)
        values = touched * source.element_size() if isinstance(source, torch.Tensor) else 0
    else:  # index_put_'s values, index_add_'s and index_copy_'s source, a mask: read whole
        values = sum(
            accessed_bytes(t)
            for t in inputs[1:]
            if id(t) not in written_ids and (t.is_floating_point() or t.dtype in (torch.bool, torch.uint8))
        )
    return indices + values + touched * self_.element_size() * (2 if accumulates else 1)


def _scattered_elements(func, args, self_: torch.Tensor) -> int:
    """How many elements of `self_` an in-place scatter writes."""
    packet = func.overloadpacket
    if packet in _INDEX_PUT_OPS:
        # Each integer index covers one dim of self, a boolean mask as many dims as it has; a None
        # keeps its dim whole, as do the dims after the last index. A mask set at n places stands for
        # integer indices of n elements, which broadcast with the others: beside an integer index,
        # that index's broadcast shape says how many; alone, n is known only once the program runs
        # (counted as every element the mask covers).
        integer, masks, sliced, dim = [], [], [], 0
        for index in args[1]:
            if index is None:
                sliced.append(int(self_.shape[dim]))
                dim += 1
            elif index.dtype in (torch.bool, torch.uint8):
                masks.append(int(index.numel()))
                dim += index.dim()
            else:
                integer.append(tuple(index.shape))
                dim += 1
        if integer:
            count = math.prod(int(n) for n in torch.broadcast_shapes(*integer))
        else:
            count = min(masks, default=1)
        return count * math.prod(sliced) * math.prod(int(n) for n in self_.shape[dim:])
    if packet in (getattr(aten, "index_add_", None), getattr(aten, "index_copy_", None)):
        return int(args[3].numel())
    if packet is getattr(aten, "index_fill_", None):
        dim = int(args[1]) % max(self_.dim(), 1)
        return int(args[2].numel()) * (
            int(self_.numel()) // max(int(self_.shape[dim]), 1) if self_.dim() else 1
        )
    return int(args[2].numel())  # scatter_, scatter_add_, scatter_reduce_: one write per index


def _layout_of(t: torch.Tensor) -> tuple:
    """A tensor's strides where its size is not 1: TensorIterator ignores a size-1 dim's stride, so
    [1, s, h] transposed from [s, 1, h] and made contiguous is as contiguous as [1, s, h] itself."""
    return tuple(int(stride) for size, stride in zip(t.shape, t.stride(), strict=True) if size != 1)


def _dense(t: torch.Tensor) -> bool:
    """Whether `t` fills its memory without gaps or overlap, in some order of its dims (a view of a
    slice does not: ATen runs an op on it in the strided kernel)."""
    expected = 1
    for stride, size in sorted(
        (int(st), int(sz)) for sz, st in zip(t.shape, t.stride(), strict=True) if sz != 1
    ):
        if stride != expected:
            return False
        expected *= size
    return True


def is_elementwise(func) -> bool:
    """Whether `func` runs as one of ATen's elementwise CUDA kernels (TensorIterator loops): torch's
    pointwise tag (on the op or on its out-of-place form) or a copy/cast."""
    if func.overloadpacket in _ELEMENTWISE_UNTAGGED or torch.Tag.pointwise in func.tags:
        return True
    name = func.overloadpacket.__name__
    if not name.endswith("_"):
        return False
    functional = getattr(aten, name[:-1], None)
    overload = getattr(functional, func._overloadname, None) if functional is not None else None
    return overload is not None and torch.Tag.pointwise in overload.tags


def vectorised(func, inputs: list[torch.Tensor], outs: list[torch.Tensor]) -> bool:
    """Whether ATen's CUDA loops run this elementwise op with vectorised loads and stores
    (aten/src/ATen/native/cuda/CUDALoops.cuh): every operand laid out like the output (no broadcast,
    no other strides) and no operand that needs a cast per element. Boolean operands (masks,
    conditions) are read as they are; zero-dimensional tensors are scalars. A cast is vectorised only
    from FP32 to BF16 or FP16 (PyTorch 2.6 on, pull request #137053); the other casts, and mixed-dtype
    arithmetic such as an FP32 main gradient += a BF16 gradient, run in the unrolled kernel."""
    result = outs[0]
    operands = [t for t in (*inputs, *outs) if t.dim() > 0]
    try:
        shape = tuple(int(n) for n in result.shape)
        layout = _layout_of(result)
        dense = result.dim() == 0 or (
            _dense(result) and all(tuple(t.shape) == shape and _layout_of(t) == layout for t in operands)
        )
    except Exception:  # unbacked symbolic sizes: assume the common, vectorised case
        return True
    if not dense:
        return False
    if func.overloadpacket in _ELEMENTWISE_UNTAGGED and inputs and inputs[0].dtype != result.dtype:
        # a cast: _to_copy(source), clone(source); copy_(destination, source) arrives with its source alone
        return inputs[0].dtype == torch.float32 and result.dtype in _REDUCED_PRECISION
    return len({t.dtype for t in operands if t.dtype != torch.bool}) <= 1


def _gemm_op(gpu: GpuSpec, func, args, kwargs, out) -> OpTime:
    packet = func.overloadpacket
    a, b = (args[1], args[2]) if packet in (aten.addmm, aten.baddbmm) else (args[0], args[1])
    dtype = a.dtype
    if packet is getattr(aten, "_grouped_mm", None):
        return _grouped_gemm_op(gpu, a, b, args)
    batch = a.shape[0] if a.dim() == 3 else 1
    m, k, n = a.shape[-2], a.shape[-1], b.shape[-1]
    time_ns = gemm_time(gpu, int(m), int(n), int(k), dtype, batch=int(batch))
    size = a.element_size()
    return OpTime(
        kind="gemm",
        time_ns=time_ns,
        flops=_torch_flops(func, args, kwargs, out),
        bytes=(m * k + k * n + m * n) * batch * size,
    )


def _grouped_gemm_op(gpu: GpuSpec, a: torch.Tensor, b: torch.Tensor, args) -> OpTime:
    """torch._grouped_mm, charged as `groups` equal GEMMs of the average size (routing balanced):

    (M_total, K) x (G, K, N) with offsets over M (MoE forward, data gradient); (G, M, K) x (G, K, N)
    (batched); (M, K_total) x (K_total, N) with offsets over K (MoE weight gradient: G outputs).
    """
    offsets = args[2] if len(args) > 2 else None
    if a.dim() == 2 and b.dim() == 3:
        groups, (m_total, k), n = b.shape[0], a.shape, b.shape[-1]
    elif a.dim() == 3:
        groups, m_total, k, n = a.shape[0], a.shape[0] * a.shape[1], a.shape[2], b.shape[-1]
    else:
        groups = offsets.shape[0] if offsets is not None else 1
        m_total, n = a.shape[0] * groups, b.shape[1]
        k = math.ceil(a.shape[1] / groups)
    groups, m_total, k, n = int(groups), int(m_total), int(k), int(n)
    m = math.ceil(m_total / groups)
    size = a.element_size()
    return OpTime(
        kind="gemm",
        time_ns=gemm_time(gpu, m, n, k, a.dtype, batch=groups),
        flops=2 * m * n * k * groups,
        bytes=(m_total * k + groups * k * n + m_total * n) * size,
    )


def _argument(func, args, kwargs, name: str, default):
    if name in kwargs:
        return kwargs[name]
    for i, argument in enumerate(func._schema.arguments):
        if argument.name == name:
            return args[i] if i < len(args) else default
    return default


def _attention_op(gpu: GpuSpec, func, args, kwargs, out) -> OpTime:
    query_at, backward = _ATTENTION_OPS[func.overloadpacket]
    q, k, v = args[query_at], args[query_at + 1], args[query_at + 2]
    if func.overloadpacket in _SEQ_MAJOR:
        # Varlen calls pack (total_tokens, heads, dim); charged as one sequence of that length.
        q, k, v = (t.transpose(-3, -2) if t.dim() == 4 else t.transpose(0, 1).unsqueeze(0) for t in (q, k, v))
        causal = bool(_argument(func, args, kwargs, "is_causal", False)) or (
            int(_argument(func, args, kwargs, "custom_mask_type", 0)) > 0
        )
    else:
        causal = bool(_argument(func, args, kwargs, "is_causal", False))
    batch, heads, seq_q, head_dim = (int(x) for x in q.shape)
    kv_heads, seq_kv = int(k.shape[1]), int(k.shape[2])
    time_ns = attention_time(
        gpu,
        batch=batch,
        num_heads=heads,
        num_kv_heads=kv_heads,
        seq_q=seq_q,
        seq_kv=seq_kv,
        head_dim=head_dim,
        causal=causal,
        dtype=q.dtype,
        backward=backward,
    )
    shapes = (tuple(q.shape), tuple(k.shape), tuple(v.shape))
    if backward:
        flops = flop_counter.sdpa_backward_flop_count(shapes[0], *shapes)
    else:
        flops = flop_counter.sdpa_flop_count(*shapes)
    moved = sum(accessed_bytes(t) for t in (q, k, v)) * (3 if backward else 2)
    return OpTime(kind="attention", time_ns=time_ns, flops=int(flops), bytes=moved)


def op_time(gpu: GpuSpec, func, args, kwargs, out) -> OpTime:
    """Modelled device time of one aten op on `gpu` (see the module docstring for the kinds).

    Args:
        func: an aten OpOverload, as a TorchDispatchMode receives it.
        args, kwargs, out: its arguments and result; tensors may be fake or meta.

    Raises:
        RuntimeError: the op's arguments do not fit its kind's formula; names the op and the shapes.
    """
    kwargs = kwargs or {}
    try:
        return _op_time(gpu, func, args, kwargs, out)
    except (IndexError, ValueError, TypeError, AttributeError) as error:
        shapes = [tuple(t.shape) for t in _tensors(args)]
        raise RuntimeError(
            f"GPU model: cannot time {func} with tensor arguments of shapes {shapes}: {error}"
        ) from error


def _op_time(gpu: GpuSpec, func, args, kwargs, out) -> OpTime:
    kind = classify(func)
    if kind == "none":
        return NONE
    if kind == "gemm":
        return _gemm_op(gpu, func, args, kwargs, out)
    if kind == "attention":
        return _attention_op(gpu, func, args, kwargs, out)
    return _memory_op(gpu, func, args, kwargs, out)
