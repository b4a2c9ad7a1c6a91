"""Patches a modelled GPU needs: object collectives on real tensors, a gradient norm without reads.

On a modelled GPU (`--prism-device model:<gpu>`) the program runs under torch's fake tensor mode
(`megatron/run/modelled_device.py`). torch.distributed's object collectives (`all_gather_object`,
`broadcast_object_list`, ...) pickle Python objects into byte tensors and read them back with
`.numpy()`, which a fake tensor cannot do: megatron-core's optimizer exchanges its parameter-group
metadata that way. These records run those calls with the dispatch modes switched off, so their
byte tensors are real and small, exactly as without prism; tensors the program computes never go
through them. No extension point reaches them: the calls are torch.distributed's module functions.

RoPE (`modelled.rope`): with the rotary fusion on, a GPU applies RoPE as Transformer Engine's one
fused kernel, and the modelled device charges that kernel over the whole region between the QKV
projection and core attention (`megatron/run/modelled_fusions.py`); megatron-core's unfused RoPE,
which the program runs without Transformer Engine, is a dozen ops each way per tensor, none of them
charged there, and keeps its cos and sin tables for the backward, which the fused kernel does not.
Inside a fused kernel's scope on fake tensors (`inside_fused_kernel`, set by the modelled device),
`apply_rotary_pos_emb` gives a tensor of the unfused result's shape, dtype and layout (its gradient
likewise) and keeps nothing; elsewhere, and under `--no-rope-fusion`, it is megatron-core's.

Without Transformer Engine or apex, megatron-core's gradient norm falls back to
`local_multi_tensor_l2_norm`, which builds a tensor from the per-tensor norms' Python values (a read
of each) and then reads the total once more: impossible on fake tensors, and on a GPU it is one fused
multi-tensor kernel (apex's or Transformer Engine's `multi_tensor_l2norm`) without a read. The
record gives `clip_grads.l2_norm_impl` the same maths on tensors: one multi-tensor norm
(`torch._foreach_norm`) and the norm of the norms, a [1] float tensor as the original returns.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import _disable_current_modes

from prism_megatron.patches import modelled_moe
from prism_megatron.patches.registry import Patch, variants
from prism_megatron.patches.versions import EVERY_VERIFIED, MEGATRON_CORE_0_16, MEGATRON_CORE_0_19

OBJECT_COLLECTIVES = (
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
)


def _outside_modes(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        with _disable_current_modes():
            return original(*args, **kwargs)

    return call


RECORDS: tuple[Patch, ...] = tuple(
    Patch(
        name=f"modelled.{name}",
        target=f"torch.distributed:{name}",
        make=_outside_modes,
        verified_on=EVERY_VERIFIED,
        reason=f"--prism-device model:<gpu>: torch.distributed.{name} pickles objects into byte tensors "
        "and reads them back with .numpy(), which fake tensors cannot; it runs outside the fake mode",
    )
    for name in OBJECT_COLLECTIVES
)


inside_fused_kernel: Callable[[], bool] | None = None
"""Set by the modelled device while it runs the program: whether an op now runs inside a fused
kernel's scope (charged as that kernel, its own ops not)."""


class _RopeShapes(torch.autograd.Function):
    """RoPE as the fused kernel holds it, on fake tensors: the output and the gradient are contiguous
    tensors of the input's shape and dtype (what the unfused form's final concatenation gives), and
    nothing is saved."""

    @staticmethod
    def forward(ctx, t: torch.Tensor) -> torch.Tensor:
        ctx.shape = t.shape
        return t.new_empty(t.shape)

    @staticmethod
    def backward(ctx, grad: torch.Tensor) -> torch.Tensor:
        return grad.new_empty(ctx.shape)


def _fused_rope(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def apply_rotary_pos_emb(t: torch.Tensor, *args: Any, **kwargs: Any) -> torch.Tensor:
        if isinstance(t, FakeTensor) and inside_fused_kernel is not None and inside_fused_kernel():
            return _RopeShapes.apply(t)
        return original(t, *args, **kwargs)

    return apply_rotary_pos_emb


_ROPE_SIGNATURE = (
    "(t: 'Tensor', freqs: 'Tensor', config: 'TransformerConfig', cu_seqlens: 'Optional[Tensor]' = None, "
    "mscale: 'float' = 1.0, cp_group: 'torch.distributed.ProcessGroup' = None"
)

ROPE: tuple[Patch, ...] = variants(
    name="modelled.rope",
    target="megatron.core.models.common.embeddings.rope_utils:apply_rotary_pos_emb",
    make=_fused_rope,
    importers=("megatron.core.transformer.attention",),
    reason="--prism-device model:<gpu>: inside the fused RoPE kernel's scope the unfused form's ops are "
    "not charged; on fake tensors it gives the result's shape alone and keeps no cos/sin tables, as the "
    "fused kernel keeps none (a dozen fake-tensor ops each way per tensor and layer otherwise)",
    count_calls=False,
    by_release={
        MEGATRON_CORE_0_16: {"signature": _ROPE_SIGNATURE + ")"},
        MEGATRON_CORE_0_19: {"signature": _ROPE_SIGNATURE + ", mla_rotary_interleaved: 'bool' = False)"},
    },
)


def _l2_norm(original: Callable[..., Any]) -> Callable[..., Any]:
    def l2_norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
        norms = [torch.stack(torch._foreach_norm(tensors)) for tensors in tensor_lists if tensors]
        if not norms:
            return torch.zeros(1, dtype=torch.float), None
        total = torch.linalg.vector_norm(torch.cat(norms).float())
        return total.reshape(1), None

    return l2_norm


L2_NORM = Patch(
    name="modelled.l2_norm",
    target="megatron.core.optimizer.clip_grads:l2_norm_impl",
    make=_l2_norm,
    verified_on=EVERY_VERIFIED,
    reason="--prism-device model:<gpu>: megatron-core's fallback l2 norm reads every per-tensor norm as a "
    "Python float, which fake tensors cannot; on a GPU it is one multi-tensor kernel without a read",
    count_calls=False,
)


def _fake_module_apply(original: Callable[..., Any]) -> Callable[..., Any]:
    def _apply(self: torch.nn.Module, fn: Callable[[torch.Tensor], torch.Tensor], recurse: bool = True):
        own = [t for t in (*self._parameters.values(), *self._buffers.values()) if t is not None]
        if not any(isinstance(t, FakeTensor) for t in own):
            return original(self, fn, recurse)
        if recurse:
            for child in self.children():
                child._apply(fn)
        with torch.no_grad():
            for param in self._parameters.values():
                if param is not None:
                    param.data = fn(param.data)
                    if param.grad is not None:
                        param.grad.data = fn(param.grad.data)
            for key, buffer in self._buffers.items():
                if buffer is not None:
                    self._buffers[key] = fn(buffer)
        return self

    return _apply


MODULE_APPLY = Patch(
    name="modelled.module_apply",
    target="torch.nn:Module._apply",
    make=_fake_module_apply,
    verified_on=EVERY_VERIFIED,
    reason="--prism-device model:<gpu>: Module.cuda/.to/.bfloat16 (Megatron-LM's get_model and Float16Module) "
    "swap each fake parameter with its converted copy, which fake tensors refuse (the fake mode holds a "
    "weak reference); a module holding fake tensors converts them in place (`param.data = ...`), as "
    "torch did before swapping",
    signature="(self, fn, recurse=True)",
    count_calls=False,
)

_WORKER_LOOP_TAIL = (
    "index_queue, data_queue, done_event, auto_collation, collate_fn, drop_last, base_seed, init_fn, "
    "worker_id, num_workers, persistent_workers, shared_seed) -> None"
)

DATA_WORKER: tuple[Patch, ...] = variants(
    name="modelled.data_loader_worker",
    target="torch.utils.data._utils.worker:_worker_loop",
    make=_outside_modes,
    reason="--prism-device model:<gpu>: a DataLoader worker is forked with the fake mode active and would "
    "collate the batch into fake tensors over shared memory, which they refuse; the worker makes the "
    "host batch as without prism (the program's .cuda() then makes it fake)",
    count_calls=False,
    # torch, not megatron-core, renamed the second parameter (2.15, the 0.19 pair's torch: `dataset` ->
    # `dataset_holder`); the replacement passes every argument through, so both read the same.
    by_release={
        MEGATRON_CORE_0_16: {"signature": "(dataset_kind, dataset, " + _WORKER_LOOP_TAIL},
        MEGATRON_CORE_0_19: {"signature": "(dataset_kind, dataset_holder, " + _WORKER_LOOP_TAIL},
    },
)

DATA_FROM_WORKER = Patch(
    name="modelled.data_from_worker",
    target="torch.utils.data.dataloader:_MultiProcessingDataLoaderIter._try_get_data",
    make=_outside_modes,
    verified_on=EVERY_VERIFIED,
    reason="--prism-device model:<gpu>: the batch a DataLoader worker sends is rebuilt on its shared-memory "
    "storage, which a fake tensor refuses; it is received as without prism (a host batch)",
    signature="(self, timeout=5.0)",
    count_calls=False,
)

ALL_RECORDS: tuple[Patch, ...] = (
    *RECORDS,
    *ROPE,
    L2_NORM,
    MODULE_APPLY,
    *DATA_WORKER,
    DATA_FROM_WORKER,
    *modelled_moe.RECORDS,
)


def _device_begins(original: Callable[..., Any], *, modelled_device_begins: Callable[[], None]):
    @functools.wraps(original)
    def setup_model_and_optimizer(*args: Any, **kwargs: Any) -> Any:
        modelled_device_begins()
        return original(*args, **kwargs)

    return setup_model_and_optimizer


SCRIPT_DEVICE_BEGINS: tuple[Patch, ...] = variants(
    name="modelled.script_device_begins",
    target="megatron.training.training:setup_model_and_optimizer",
    make=_device_begins,
    needs=("modelled_device_begins",),
    reason="--prism-device model:<gpu> with a Megatron-LM script: the modelled device (fake tensors, the "
    "GPU model's clock) takes over where the script starts to compute, as the built-in entry enters it "
    "after Megatron's initialisation: model, optimizer, data and training run on it to the script's end",
    by_release={
        MEGATRON_CORE_0_16: {"signature": "(model_provider_func, model_type, checkpointing_context=None)"},
        # 0.19 put the model type first and added keyword-only config containers; the hook passes
        # every argument on.
        MEGATRON_CORE_0_19: {"signature": None},
    },
)
"""Bound to the script run's `modelled_device_begins` (enter the device, once)."""
