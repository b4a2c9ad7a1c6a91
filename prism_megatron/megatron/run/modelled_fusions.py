"""Megatron's kernel fusions on a modelled GPU: the unfused ops the program runs, charged as the
fused kernels a GPU run has.

The built-in entry runs megatron-core's local layers with every fusion off (no Transformer Engine or
apex on a CPU), so a modelled run dispatches the unfused aten ops. A Megatron GPU run has these
fusions on by default (Megatron-LM core_v0.16.1 `megatron/training/arguments.py`); each is charged
here as the GPU model prices the fused kernel (`gpu_model.fused`), and its Megatron flag turns it
back to charging the ops one by one. Nothing the program computes changes: the hooks only open and
close `ModelledDevice.fused_kernel` scopes, or re-price one op (`ModelledDevice.op_fusions`).

| fusion (flag that turns it off) | unfused ops the scope covers | fused kernel charged |
|---|---|---|
| gradient accumulation (`--no-gradient-accumulation-fusion`) | DDP's `main_grad.add_(grad)` of each linear layer's weight | none: the weight-gradient GEMM accumulates into the FP32 main grad (`fused.wgrad_accumulate_time`, its memory roof reads and writes C in FP32) |
| bias + GeLU (`--no-bias-gelu-fusion`; off without bias, as Megatron derives) / bias + SwiGLU (`--no-bias-swiglu-fusion`) | between fc1's output and fc2's input, and back | `fused.activation_time`, forward and backward (at the bandwidth Megatron's jit-fused SwiGLU reaches on an H100) |
| bias + dropout + add (`--no-bias-dropout-fusion`) | after self-attention up to the pre-MLP norm, after the MLP up to the layer's output, and back | `fused.bias_dropout_add_time` |
| RoPE (`--no-rope-fusion`; off without RoPE) | between linear_qkv's output and core attention's input (q/k/v split and the rotary ops), and back | `fused.rope_time` (+ the q/k/v gradient concatenation backward) |
| cross-entropy (`--cross-entropy-loss-fusion --cross-entropy-fusion-impl te` turns it on; off by default, and Megatron's own `native` fused path is charged op by op: `Fusions.cross_entropy`) | after the output layer's logits to the model's output (the loss), and back | `fused.cross_entropy_time` |
| Adam (TE's FusedAdam; no flag) | the optimizer's `step()` | `fused.adam_step_time` without the BF16 copy (Megatron copies main to model weights after the step) |

Norms are `modelled_device.fuse_norms`; attention is one op already, timed as the kernel a GPU run
of the flags takes (`attention_kernel`). Not fused (charged as the ops
run, as on a GPU run of these defaults): the grad-norm and the main-to-model weight copies.
"""

from __future__ import annotations

import argparse
import contextlib
import dataclasses
import weakref
from typing import Any

import torch
from megatron.core.models.gpt import GPTModel
from megatron.core.tensor_parallel.layers import ColumnParallelLinear, RowParallelLinear
from megatron.core.transformer.attention import Attention
from megatron.core.transformer.mlp import MLP
from megatron.core.transformer.transformer_layer import TransformerLayer
from torch._subclasses.fake_tensor import FakeTensor

from prism_megatron.gpu_model import fused
from prism_megatron.gpu_model.gemm import gemm_time
from prism_megatron.megatron.run import tp_overlap
from prism_megatron.megatron.run.modelled_device import ModelledDevice, fuse_norms

aten = torch.ops.aten


@dataclasses.dataclass(frozen=True, kw_only=True)
class Fusions:
    """Which of Megatron's fusions a modelled run charges as fused kernels."""

    gradient_accumulation: bool = True
    """Weight-gradient GEMMs accumulate into the FP32 main grads (`--no-gradient-accumulation-fusion`)."""
    bias_activation: bool = True
    """Bias + GeLU or SwiGLU as one kernel (`--no-bias-gelu-fusion`, `--no-bias-swiglu-fusion`)."""
    bias_dropout: bool = True
    """Bias + dropout + residual add as one kernel (`--no-bias-dropout-fusion`)."""
    rope: bool = True
    """Rotary embedding of q and k as one kernel (`--no-rope-fusion`)."""
    adam: bool = True
    """The optimizer step as one multi-tensor kernel (TE/apex FusedAdam; Megatron has no flag)."""
    cross_entropy: bool = False
    """The vocab-parallel cross-entropy as one kernel each way: Transformer Engine's
    (`--cross-entropy-loss-fusion --cross-entropy-fusion-impl te`). Megatron's own fused path (`native`,
    the default impl) is a chain of `@jit_fuser` functions with FP32 intermediates, measured on an H100
    at 18.2 ms forward and backward for 8192 tokens over a 131072 vocabulary where one pass each way
    would take about 2.2 ms (benchmarks/published/kernel_figures.py, Liger-Kernel's figures): it is
    charged op by op, as the unfused ops run."""

    @classmethod
    def from_args(cls, args: argparse.Namespace) -> Fusions:
        """Megatron-LM's flags and its derivations: bias+GeLU off without bias (`validate_args`),
        RoPE fusion off without RoPE."""
        if getattr(args, "swiglu", False):
            activation = args.bias_swiglu_fusion
        else:
            # The built-in entry's flag namespace says `disable_bias_linear`, Megatron-LM's `add_bias_linear`.
            without_bias = getattr(args, "disable_bias_linear", not getattr(args, "add_bias_linear", True))
            activation = args.bias_gelu_fusion and not without_bias
        return cls(
            gradient_accumulation=args.gradient_accumulation_fusion,
            bias_activation=activation,
            bias_dropout=args.bias_dropout_fusion,
            rope=args.apply_rope_fusion and args.position_embedding_type == "rope",
            cross_entropy=args.cross_entropy_loss_fusion
            and getattr(args, "cross_entropy_fusion_impl", "native") == "te",
        )


def charge_as_a_gpu_runs(device: ModelledDevice, model_chunks, optimizer, args: argparse.Namespace) -> None:
    """What a GPU run of `args` (the flags as written) fuses or overlaps, charged so on `device`: the
    norms, Megatron's fusions and, with --tp-comm-overlap, TE's userbuffers overlap. Both entries
    call it once the model and optimizer exist (the built-in one, and a script's first step)."""
    device.use_attention_kernel(attention_kernel(args, device.gpu.name))
    fuse_norms(device, model_chunks)
    install(device, model_chunks, optimizer, Fusions.from_args(args))
    overlap_tp_comm(device, model_chunks, args)


CUDNN_PREFERRED_ON = frozenset({"h100", "h200", "b200"})
"""GPUs on which Transformer Engine's attention backend selection, given the choice between
FlashAttention and cuDNN's fused attention (FusedAttention, its F16_arbitrary_seqlen backend, which
BF16 and FP16 training takes), disables FlashAttention "to give FusedAttention preference on Hopper+
for performance reasons": compute capability 9.0 and later (TE 1.6 to 1.8 on 9.0 exactly, later
releases on 9.0 and above). On A100 it keeps FlashAttention."""


def attention_kernel(args: argparse.Namespace, gpu: str) -> str | None:
    """The fused attention kernel a GPU run of `args` takes on `gpu` (a key of
    `gpu_model.specs.ATTENTION_KERNELS`), by `--attention-backend`: flash -> FlashAttention, fused ->
    cuDNN, auto (Megatron's default) -> Transformer Engine's own choice (CUDNN_PREFERRED_ON). None for
    unfused and local: no fused kernel runs (the GEMMs and softmax are timed as the ops they are)."""
    backend = getattr(args, "attention_backend", "auto")
    backend = getattr(backend, "name", backend)  # Megatron-LM parses it into megatron-core's AttnBackend
    if backend in ("unfused", "local"):
        return None
    if backend == "fused" or (backend == "auto" and gpu in CUDNN_PREFERRED_ON):
        return "cudnn"
    return "flash"


def overlap_tp_comm(device: ModelledDevice, model_chunks, args: argparse.Namespace) -> None:
    """With --tp-comm-overlap, TE's userbuffers overlap on `device` (`tp_overlap`); nothing without."""
    if getattr(args, "tp_comm_overlap", False):
        device.tp_overlap = tp_overlap.TpCommOverlap(device, args.tensor_model_parallel_size)
        device.tp_overlap.install(model_chunks)


def install(device: ModelledDevice, model_chunks, optimizer, fusions: Fusions) -> dict[str, int]:
    """Hook every fusion `fusions` turns on into the model and optimizer; returns how many modules
    (weights, optimizers) each one covers (also kept in `device.fused_modules`)."""
    modules = [m for chunk in model_chunks for m in chunk.modules()]
    counts = dict.fromkeys(
        ("gradient_accumulation", "bias_activation", "bias_dropout", "rope", "cross_entropy", "adam"), 0
    )
    if fusions.gradient_accumulation:
        counts["gradient_accumulation"] = _WgradAccumulation(device, modules).num_weights
    if fusions.bias_activation:
        for module in modules:
            if isinstance(module, MLP):
                _hook_activation(device, module)
                counts["bias_activation"] += 1
    if fusions.bias_dropout:
        for module in modules:
            if isinstance(module, TransformerLayer):
                _hook_bias_dropout_add(device, module)
                counts["bias_dropout"] += 1
    if fusions.rope:
        for module in modules:
            if isinstance(module, Attention) and hasattr(module, "linear_qkv"):
                _hook_rope(device, module)
                counts["rope"] += 1
    if fusions.cross_entropy:
        for module in modules:
            if (
                isinstance(module, GPTModel)
                and module.post_process
                and not getattr(module, "mtp_process", False)
            ):
                _hook_cross_entropy(device, module)
                counts["cross_entropy"] += 1
    if fusions.adam:
        for inner in _torch_optimizers(optimizer):
            _hook_adam(device, inner)
            counts["adam"] += 1
    device.fused_modules.update(counts)
    return counts


class _Span:
    """One fused kernel opened in one hook and closed in another (forward or backward)."""

    def __init__(self, device: ModelledDevice) -> None:
        self.device = device
        self.open_scopes: list[contextlib.AbstractContextManager] = []

    def open(self, time_ns: int) -> None:
        scope = self.device.fused_kernel(time_ns)
        scope.__enter__()
        self.open_scopes.append(scope)

    def close(self) -> None:
        if self.open_scopes:  # a hook of a recomputed forward may close what it did not open
            self.open_scopes.pop().__exit__(None, None, None)


def _first(value: Any) -> torch.Tensor | None:
    if isinstance(value, torch.Tensor):
        return value
    if isinstance(value, (list, tuple)) and value and isinstance(value[0], torch.Tensor):
        return value[0]
    return None


def _on_grad(tensor: torch.Tensor | None, action) -> None:
    """Run `action()` when the gradient of `tensor` is ready (before its producer's backward).

    A tensor made inside a recomputed (checkpointed) forward's first run does not require grad: no
    hook there; the recomputation in the backward registers its own. A checkpoint's input (core
    attention's q, k, v under selective recompute) does: its hook fires when the checkpoint's
    backward has made its gradient, where the fused kernel's backward starts.

    `action` must not hold `tensor` or anything of its autograd graph (price it up front, keep the
    number): the hook lives in the graph's C++ nodes, which Python's garbage collector cannot see
    through, so a hook that reaches its own tensor is a cycle never freed, and every microbatch's
    activations would stay for the rest of the run (the peak then grows with the microbatch count)."""
    if tensor is not None and tensor.requires_grad:
        tensor.register_hook(lambda grad: action())


class _WgradAccumulation:
    """Megatron's gradient accumulation fusion: the weight-gradient GEMM of every linear layer
    writes into the FP32 main grad (C = A B + C), so DDP's `main_grad.add_(grad)` is no kernel;
    the GEMM's FP32 C traffic is charged instead (the difference of its memory roof)."""

    def __init__(self, device: ModelledDevice, modules) -> None:
        self.device = device
        weights = [
            m.weight
            for m in modules
            if isinstance(m, (ColumnParallelLinear, RowParallelLinear))
            and getattr(m, "weight", None) is not None
        ]
        self.main_grads = {id(w.main_grad): w.main_grad for w in weights if hasattr(w, "main_grad")}
        self.num_weights = len(self.main_grads)
        self.last_gemm: dict[tuple[int, ...], tuple[int, int, int, torch.dtype]] = {}
        device.op_fusions[aten.mm.default] = self._on_mm
        device.op_fusions[aten.add_.Tensor] = self._on_accumulate

    def _on_mm(self, func, args, kwargs, out) -> bool:
        a, b = args[0], args[1]
        self.last_gemm[tuple(out.shape)] = (int(a.shape[0]), int(b.shape[1]), int(a.shape[1]), a.dtype)
        return False  # the GEMM is charged as it runs

    def _on_accumulate(self, func, args, kwargs, out) -> bool:
        if id(args[0]) not in self.main_grads:
            return False
        gemm = self.last_gemm.get(tuple(args[1].shape))
        if gemm is None:  # not the output of a GEMM seen here: charge the add as it runs
            return False
        m, n, k, dtype = gemm
        gpu = self.device.gpu
        extra = fused.wgrad_accumulate_time(gpu, m=m, n=n, k=k, dtype=dtype) - gemm_time(gpu, m, n, k, dtype)
        self.device.clock.advance(max(0, extra), "gemm")
        return True


def _hook_activation(device: ModelledDevice, mlp: MLP) -> None:
    """Bias + activation between fc1's output and fc2's input (forward) and back (backward)."""
    forward, backward = _Span(device), _Span(device)
    gated = bool(mlp.config.gated_linear_unit)

    def price(tokens: int, width: int, dtype: torch.dtype, *, is_backward: bool) -> int:
        return fused.activation_time(
            device.gpu, tokens=tokens, ffn_hidden=width, dtype=dtype, gated=gated, backward=is_backward
        )

    saving: list[contextlib.AbstractContextManager] = []

    def fc1_post(module, args, output):
        out = _first(output)
        width = out.shape[-1] // (2 if gated else 1)  # the activation's width: fc2's input
        forward.open(price(out.numel() // out.shape[-1], width, out.dtype, is_backward=False))
        _on_grad(out, backward.close)
        _stop_saving(saving)
        if isinstance(out, FakeTensor):
            saving.append(_saving_only(out))
            saving[-1].__enter__()

    def fc2_pre(module, args):
        forward.close()
        _stop_saving(saving)
        x = _first(args)
        if x is not None:
            time_ns = price(x.numel() // x.shape[-1], x.shape[-1], x.dtype, is_backward=True)
            _on_grad(x, lambda: backward.open(time_ns))

    mlp.linear_fc1.register_forward_hook(fc1_post)
    mlp.linear_fc2.register_forward_pre_hook(fc2_pre)


def _saving_only(kept: torch.Tensor) -> contextlib.AbstractContextManager:
    """Saved-tensor hooks for the ops of a fused activation (fc1's output to fc2's input): a saved
    tensor of `kept`'s storage, or of one as large (fc1's output plus its bias: the activation's input
    where the linear has a bias), is kept, as the fused kernel keeps its input; anything else they save
    (unfused SwiGLU's SiLU output and its linear half plus offset) is kept as its shape alone and made
    again, empty, when the backward asks for it. Fake tensors have no values to lose; the GPU's fused
    kernel works the rest out in registers."""
    kept_ref = weakref.ref(kept)  # hold nothing: fc1's output dies at once where a bias is added
    kept_bytes = kept.untyped_storage().nbytes()

    def pack(tensor: torch.Tensor):
        if not isinstance(tensor, FakeTensor):
            return tensor
        storage, alive = tensor.untyped_storage(), kept_ref()
        if storage.nbytes() == kept_bytes or (
            alive is not None and storage._cdata == alive.untyped_storage()._cdata
        ):
            return tensor
        return (tuple(tensor.shape), tuple(tensor.stride()), tensor.dtype, tensor.device)

    def unpack(packed):
        if isinstance(packed, torch.Tensor):
            return packed
        shape, stride, dtype, device = packed
        return torch.empty_strided(shape, stride, dtype=dtype, device=device)

    return torch.autograd.graph.saved_tensors_hooks(pack, unpack)


def _stop_saving(saving: list[contextlib.AbstractContextManager]) -> None:
    while saving:
        saving.pop().__exit__(None, None, None)


def _hook_bias_dropout_add(device: ModelledDevice, layer: TransformerLayer) -> None:
    """Each bias-dropout-add of a layer: after self-attention up to the pre-MLP norm, after the MLP
    up to the layer's output; backward from the sum's gradient to the branch output's."""
    dropout = float(layer.hidden_dropout) > 0

    def hook(branch: torch.nn.Module, end: torch.nn.Module, *, end_is_layer: bool) -> None:
        forward, backward = _Span(device), _Span(device)
        shape: dict[str, Any] = {}

        def price(x: torch.Tensor, *, is_backward: bool) -> int:
            hidden = x.shape[-1]
            return fused.bias_dropout_add_time(
                device.gpu, tokens=x.numel() // hidden, hidden=hidden, dtype=x.dtype,
                bias=shape["bias"], dropout=dropout, backward=is_backward,
            )  # fmt: skip

        def branch_post(module, args, output):
            out = _first(output)
            shape["bias"] = isinstance(output, tuple) and len(output) > 1 and output[1] is not None
            forward.open(price(out, is_backward=False))
            _on_grad(out, backward.close)

        def end_reached(x: torch.Tensor | None) -> None:
            forward.close()
            if x is not None and "bias" in shape:
                time_ns = price(x, is_backward=True)
                _on_grad(x, lambda: backward.open(time_ns))

        branch.register_forward_hook(branch_post)
        if end_is_layer:
            end.register_forward_hook(lambda module, args, output: end_reached(_first(output)))
        else:
            end.register_forward_pre_hook(lambda module, args: end_reached(_first(args)), prepend=True)

    hook(layer.self_attention, layer.pre_mlp_layernorm, end_is_layer=False)
    hook(layer.mlp, layer, end_is_layer=True)


def _hook_rope(device: ModelledDevice, attention: Attention) -> None:
    """RoPE of q and k between linear_qkv's output and core attention's input, and back."""
    forward, backward = _Span(device), _Span(device)
    heads = attention.num_attention_heads_per_partition
    kv_heads = attention.num_query_groups_per_partition
    head_dim = attention.hidden_size_per_attention_head

    def price(qkv: torch.Tensor, *, is_backward: bool) -> int:
        tokens = qkv.numel() // qkv.shape[-1]
        rope = fused.rope_time(
            device.gpu, tokens=tokens, heads=heads, kv_heads=kv_heads, head_dim=head_dim, dtype=qkv.dtype
        )
        if not is_backward:
            return rope
        # the split's backward: the q, k, v gradients concatenated into the qkv gradient
        return rope + fused.memory_kernel_time(device.gpu, 2 * qkv.numel() * qkv.element_size())

    pending: list = []
    """Per forward whose backward is still to come, the action that opens its backward span."""

    def qkv_post(module, args, output):
        qkv = _first(output)
        forward.open(price(qkv, is_backward=False))
        backward_ns = price(qkv, is_backward=True)
        opened = [False]

        def open_backward():
            if not opened[0]:
                opened[0] = True
                backward.open(backward_ns)

        pending.append(open_backward)
        _on_grad(qkv, backward.close)

    def core_pre(module, args):
        forward.close()
        if pending:
            open_backward = pending.pop()
            for x in args[:3]:
                _on_grad(x if isinstance(x, torch.Tensor) else None, open_backward)

    attention.linear_qkv.register_forward_hook(qkv_post)
    attention.core_attention.register_forward_pre_hook(core_pre)


def _hook_cross_entropy(device: ModelledDevice, gpt: GPTModel) -> None:
    """The loss after the output layer's logits (`compute_language_model_loss`), and back."""
    forward, backward = _Span(device), _Span(device)

    def price(logits: torch.Tensor, *, is_backward: bool) -> int:
        vocab = logits.shape[-1]
        return fused.cross_entropy_time(
            device.gpu, tokens=logits.numel() // vocab, vocab=vocab, dtype=logits.dtype, backward=is_backward
        )

    def logits_post(module, args, output):
        logits = _first(output)
        forward.open(price(logits, is_backward=False))
        _on_grad(logits, backward.close)
        pending["backward_ns"] = price(logits, is_backward=True)

    def model_post(module, args, output):
        forward.close()
        backward_ns = pending.pop("backward_ns", None)
        if backward_ns is not None:
            _on_grad(_first(output), lambda: backward.open(backward_ns))

    pending: dict[str, int] = {}
    gpt.output_layer.register_forward_hook(logits_post)
    gpt.register_forward_hook(model_post)


def _torch_optimizers(optimizer) -> list[torch.optim.Optimizer]:
    """The torch optimizers inside Megatron's (chained, mixed-precision, distributed) optimizer."""
    if isinstance(optimizer, torch.optim.Optimizer):
        return [optimizer]
    chained = getattr(optimizer, "chained_optimizers", None)
    if chained:  # an MoE model chains the dense and the expert optimizers; `.optimizer` refuses >1
        return [found for inner in chained for found in _torch_optimizers(inner)]
    found = []
    inner = getattr(optimizer, "optimizer", None)
    if inner is not None and inner is not optimizer:
        found += _torch_optimizers(inner)
    return found


def _hook_adam(device: ModelledDevice, optimizer: torch.optim.Optimizer) -> None:
    """The whole `step()` as one fused multi-tensor Adam over the parameters that have a gradient."""
    span = _Span(device)

    def pre(opt, args, kwargs):
        num_params = sum(p.numel() for g in opt.param_groups for p in g["params"] if p.grad is not None)
        span.open(fused.adam_step_time(device.gpu, num_params=num_params, with_model_copy=False))

    optimizer.register_step_pre_hook(pre)
    optimizer.register_step_post_hook(lambda opt, args, kwargs: span.close())
