"""Megatron's kernel fusions on a modelled GPU: each fusion that is on is charged as the fused kernel
the GPU model prices, its `--no-...` flag charges the unfused ops, and nothing else changes.

One decoder layer of the built-in entry (local spec, bias, RoPE, GeLU or SwiGLU, hidden dropout) runs
forward and backward on a modelled H100 in torch's fake process group, then DDP's accumulation into
FP32 main grads and an Adam step, once with a single fusion on and once with all off.
"""

from __future__ import annotations

import contextlib
import dataclasses

import pytest
import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel
from megatron.core.models.common.embeddings.rotary_pos_embedding import RotaryEmbedding
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.transformer_block import TransformerBlock

from prism_megatron.gpu_model import fused
from prism_megatron.gpu_model.gemm import gemm_time
from prism_megatron.megatron.entry import arguments as pretrain_args
from prism_megatron.megatron.entry import model
from prism_megatron.megatron.layers import parallel_spec
from prism_megatron.megatron.run import modelled_device, modelled_fusions
from prism_megatron.patches import cpu_shim, registry

SEQUENCE, HIDDEN, FFN, HEADS = 256, 256, 1024, 4
MODEL = (
    "--num-layers", "1", "--hidden-size", str(HIDDEN), "--ffn-hidden-size", str(FFN),
    "--num-attention-heads", str(HEADS), "--seq-length", str(SEQUENCE), "--micro-batch-size", "1",
    "--train-iters", "1", "--bf16", "--hidden-dropout", "0.1", "--attention-dropout", "0.0",
    "--position-embedding-type", "rope", "--vocab-size", "255",
)  # fmt: skip
OFF = modelled_fusions.Fusions(
    gradient_accumulation=False, bias_activation=False, bias_dropout=False, rope=False, adam=False
)


class RecordingDevice(modelled_device.ModelledDevice):
    """A modelled device that keeps the price of every fused kernel it charges."""

    def __init__(self, gpu_name: str) -> None:
        super().__init__(gpu_name)
        self.fused_prices: list[int] = []

    def fused_kernel(self, time_ns: int, kind: str = "memory"):
        self.fused_prices.append(time_ns)
        return super().fused_kernel(time_ns, kind)


@contextlib.contextmanager
def one_rank():
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=1)
    try:
        with registry.patched(cpu_shim.MEGATRON_CORE_SHIMS):
            parallel_state.initialize_model_parallel(create_gloo_process_groups=False)
            tensor_parallel.model_parallel_cuda_manual_seed(1234)
            yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


@dataclasses.dataclass
class Step:
    by_kind_ns: dict[str, int]
    flops: int
    fused_prices: list[int]
    counts: dict[str, int]
    weights: list[tuple[int, int]]

    @property
    def unfused_kinds_ns(self) -> int:
        return self.by_kind_ns["memory"] + self.by_kind_ns["launch"]


def _step_since(
    device, start: dict[str, int], start_flops: int, end: dict[str, int], counts, weights
) -> Step:
    """What the device charged between `start` and `end` (by kind, FLOPs, fused kernels)."""
    return Step(
        by_kind_ns={kind: end[kind] - start.get(kind, 0) for kind in end},
        flops=device.clock.flops - start_flops,
        fused_prices=list(device.fused_prices),
        counts=counts,
        weights=weights,
    )


def one_step(fusions: modelled_fusions.Fusions, *extra_flags: str) -> Step:
    """Forward, backward, the FP32 main-grad accumulation and an Adam step of one layer, charged on
    a modelled H100 (construction excluded)."""
    args = pretrain_args.parse([*MODEL, *extra_flags])
    config = model.transformer_config(args)
    device = RecordingDevice("h100")
    with one_rank(), device.active():
        spec = parallel_spec.decoder_spec(get_gpt_layer_local_spec(), config, vp_stage=None, modelled=True)
        block = TransformerBlock(config, spec, post_layer_norm=False)
        weights = [p for name, p in block.named_parameters() if "linear" in name and name.endswith("weight")]
        for weight in weights:  # DDP's FP32 main grads
            weight.main_grad = torch.zeros(weight.shape, dtype=torch.float32)
        optimizer = torch.optim.AdamW([p for p in block.parameters()], lr=1e-4)
        rotary = RotaryEmbedding(HIDDEN // HEADS, rotary_percent=1.0)(SEQUENCE)
        hidden = torch.randn(SEQUENCE, 1, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
        counts = modelled_fusions.install(device, [block], optimizer, fusions)
        start, start_flops = device.by_kind_ns(), device.clock.flops
        del device.fused_prices[:]
        out = block(hidden, attention_mask=None, rotary_pos_emb=rotary)
        out.sum().backward()
        for weight in weights:  # DDP's backward hook (megatron-core distributed_data_parallel.py)
            weight.main_grad.add_(weight.grad.data)
        optimizer.step()
        end = device.by_kind_ns()
    return _step_since(device, start, start_flops, end, counts, [tuple(w.shape) for w in weights])


@pytest.fixture(scope="module")
def unfused() -> Step:
    return one_step(OFF)


def _only(**on: bool) -> modelled_fusions.Fusions:
    return dataclasses.replace(OFF, **on)


def test_the_fusion_flags_are_megatrons_and_on_by_default():
    args = pretrain_args.parse(list(MODEL))
    assert modelled_fusions.Fusions.from_args(args) == modelled_fusions.Fusions()
    off = pretrain_args.parse([*MODEL, *(flag for flag, _ in pretrain_args.FUSION_SWITCHES)])
    assert modelled_fusions.Fusions.from_args(off) == dataclasses.replace(OFF, adam=True)


def test_megatrons_derivations_turn_bias_gelu_and_rope_fusion_off_where_they_do_not_apply():
    no_bias = pretrain_args.parse([*MODEL, "--disable-bias-linear"])
    assert not modelled_fusions.Fusions.from_args(no_bias).bias_activation  # validate_args: bias_gelu off
    swiglu = pretrain_args.parse([*MODEL, "--disable-bias-linear", "--swiglu"])
    assert modelled_fusions.Fusions.from_args(swiglu).bias_activation  # bias_swiglu_fusion stays on
    learned = [*MODEL[:-4], "--vocab-size", "255", "--position-embedding-type", "learned_absolute"]
    assert not modelled_fusions.Fusions.from_args(pretrain_args.parse(learned)).rope


def _same_compute(fused_step: Step, unfused: Step) -> None:
    assert fused_step.flops == unfused.flops
    assert fused_step.by_kind_ns["attention"] == unfused.by_kind_ns["attention"]


def test_bias_gelu_is_one_kernel_each_way(unfused):
    step = one_step(_only(bias_activation=True))
    tokens = SEQUENCE
    prices = [
        fused.activation_time(step_gpu(), tokens=tokens, ffn_hidden=FFN, dtype=torch.bfloat16, gated=False,
                              backward=backward)
        for backward in (False, True)
    ]  # fmt: skip
    assert step.counts["bias_activation"] == 1 and step.fused_prices == prices
    assert step.unfused_kinds_ns < unfused.unfused_kinds_ns
    assert step.by_kind_ns["gemm"] == unfused.by_kind_ns["gemm"]
    _same_compute(step, unfused)


def test_bias_swiglu_is_one_kernel_each_way():
    swiglu = ("--swiglu",)
    step, off = one_step(_only(bias_activation=True), *swiglu), one_step(OFF, *swiglu)
    prices = [
        fused.activation_time(step_gpu(), tokens=SEQUENCE, ffn_hidden=FFN, dtype=torch.bfloat16, gated=True,
                              backward=backward)
        for backward in (False, True)
    ]  # fmt: skip
    assert step.fused_prices == prices
    assert step.unfused_kinds_ns < off.unfused_kinds_ns
    _same_compute(step, off)


def test_bias_dropout_add_is_one_kernel_per_branch_each_way(unfused):
    step = one_step(_only(bias_dropout=True))
    price = {
        backward: fused.bias_dropout_add_time(step_gpu(), tokens=SEQUENCE, hidden=HIDDEN, dtype=torch.bfloat16,
                                              bias=True, dropout=True, backward=backward)
        for backward in (False, True)
    }  # fmt: skip
    # forward: attention's, then the MLP's; backward: the MLP's, then attention's
    assert step.fused_prices == [price[False], price[False], price[True], price[True]]
    assert step.unfused_kinds_ns < unfused.unfused_kinds_ns
    assert step.by_kind_ns["gemm"] == unfused.by_kind_ns["gemm"]
    _same_compute(step, unfused)


def test_rope_is_one_kernel_each_way(unfused):
    step = one_step(_only(rope=True))
    gpu, head_dim = step_gpu(), HIDDEN // HEADS
    rope = fused.rope_time(gpu, tokens=SEQUENCE, heads=HEADS, kv_heads=HEADS, head_dim=head_dim,
                           dtype=torch.bfloat16)  # fmt: skip
    concat = fused.memory_kernel_time(gpu, 2 * SEQUENCE * 3 * HIDDEN * 2)
    assert step.fused_prices == [rope, rope + concat]
    assert step.unfused_kinds_ns < unfused.unfused_kinds_ns
    _same_compute(step, unfused)


def test_a_microbatch_s_activations_die_with_its_backward_and_a_freed_stage_output_keeps_its_price():
    """The hooks keep prices, never tensors: a hook that reached its own tensor would be a cycle
    through autograd's C++ nodes that Python never frees, and on a pipeline stage every microbatch's
    activations would stay (the modelled peak then grew with the microbatch count). The layer's
    output is freed after the forward, as Megatron's pipeline frees a stage's sent output; its
    bias-dropout-add backward is still priced at the forward's size."""
    import gc
    import weakref

    from megatron.core.pipeline_parallel.schedules import custom_backward, deallocate_output_tensor

    args = pretrain_args.parse(list(MODEL))
    config = model.transformer_config(args)
    device = RecordingDevice("h100")
    produced: list[weakref.ref] = []
    with one_rank(), device.active():
        spec = parallel_spec.decoder_spec(get_gpt_layer_local_spec(), config, vp_stage=None, modelled=True)
        block = TransformerBlock(config, spec, post_layer_norm=False)
        modelled_fusions.install(device, [block], None, modelled_fusions.Fusions.from_args(args))

        def keep_a_weak_reference(module, inputs, output):
            tensor = modelled_fusions._first(output)
            if tensor is not None:
                produced.append(weakref.ref(tensor))

        for module in block.modules():
            module.register_forward_hook(keep_a_weak_reference)
        rotary = RotaryEmbedding(HIDDEN // HEADS, rotary_percent=1.0)(SEQUENCE)
        hidden = torch.randn(SEQUENCE, 1, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
        del device.fused_prices[:]
        out = block(hidden, attention_mask=None, rotary_pos_emb=rotary)
        deallocate_output_tensor(out, deallocate_pipeline_outputs=True)
        custom_backward(out, torch.ones(SEQUENCE, 1, HIDDEN, dtype=torch.bfloat16))
        del out, hidden
        gc.collect()
        alive = [ref() for ref in produced if ref() is not None]
    assert len(produced) > 10 and alive == []
    bda = fused.bias_dropout_add_time(step_gpu(), tokens=SEQUENCE, hidden=HIDDEN, dtype=torch.bfloat16,
                                      bias=True, dropout=True, backward=True)  # fmt: skip
    assert device.fused_prices.count(bda) == 2  # both branches, the layer output's included


@pytest.mark.parametrize("granularity", ["selective", "full"])
def test_recomputed_layers_are_charged_fused_again(granularity):
    recompute = ("--recompute-granularity", granularity)
    if granularity == "full":
        recompute += ("--recompute-method", "uniform", "--recompute-num-layers", "1")
    everything = dataclasses.replace(OFF, bias_activation=True, bias_dropout=True, rope=True)
    step, off = one_step(everything, *recompute), one_step(OFF, *recompute)
    gpu = step_gpu()
    rope = fused.rope_time(gpu, tokens=SEQUENCE, heads=HEADS, kv_heads=HEADS, head_dim=HIDDEN // HEADS,
                           dtype=torch.bfloat16)  # fmt: skip
    concat = fused.memory_kernel_time(gpu, 2 * SEQUENCE * 3 * HIDDEN * 2)
    num_forwards = 2 if granularity == "full" else 1  # full: the layer's forward runs again
    assert step.fused_prices.count(rope) == num_forwards and step.fused_prices.count(rope + concat) == 1
    # per forward: rope, bda, activation, bda; the backward: the same four once
    assert len(step.fused_prices) == num_forwards * 4 + 4
    assert step.unfused_kinds_ns < off.unfused_kinds_ns
    _same_compute(step, off)


def test_gradient_accumulation_fusion_makes_the_main_grad_add_part_of_the_wgrad_gemm(unfused):
    step = one_step(_only(gradient_accumulation=True))
    assert step.counts["gradient_accumulation"] == len(step.weights) == 4
    gpu = step_gpu()
    extra = sum(
        fused.wgrad_accumulate_time(gpu, m=m, n=n, k=SEQUENCE, dtype=torch.bfloat16)
        - gemm_time(gpu, m, n, SEQUENCE, torch.bfloat16)
        for m, n in step.weights
    )
    # these small GEMMs are bound by their fixed cost: the FP32 C traffic adds nothing
    assert step.by_kind_ns["gemm"] == unfused.by_kind_ns["gemm"] + extra
    assert step.unfused_kinds_ns < unfused.unfused_kinds_ns
    assert step.fused_prices == []
    _same_compute(step, unfused)


def test_adam_is_one_multi_tensor_kernel_over_the_parameters(unfused):
    step = one_step(_only(adam=True))
    assert step.counts["adam"] == 1 and len(step.fused_prices) == 1
    num_params = (
        (step.fused_prices[0] - step_gpu().launch_ns) * step_gpu().achievable_hbm_bytes_per_s / 1e9 / 28
    )
    assert num_params == pytest.approx(4 * HIDDEN * HIDDEN + 2 * HIDDEN * FFN + 9 * HIDDEN + FFN, rel=1e-3)
    assert step.unfused_kinds_ns < unfused.unfused_kinds_ns
    _same_compute(step, unfused)


def test_a_compute_bound_wgrad_gemm_accumulates_for_free_a_memory_bound_one_pays_the_fp32_c():
    gpu = step_gpu()
    m, n, k = 8192, 8192, 16384
    assert fused.wgrad_accumulate_time(gpu, m=m, n=n, k=k, dtype=torch.bfloat16) == gemm_time(
        gpu, m, n, k, torch.bfloat16
    )
    k = 64  # C dominates the traffic: FP32 read and write (8 bytes) where BF16 was written once (2)
    plain = gemm_time(gpu, m, n, k, torch.bfloat16)
    accumulated = fused.wgrad_accumulate_time(gpu, m=m, n=n, k=k, dtype=torch.bfloat16)
    assert accumulated - plain == pytest.approx(m * n * 6 / gpu.achievable_hbm_bytes_per_s * 1e9, rel=0.05)


def test_a_bias_free_dropout_free_add_has_no_backward_kernel():
    gpu = step_gpu()
    assert fused.bias_dropout_add_time(gpu, tokens=8, hidden=8, dtype=torch.bfloat16, bias=False, dropout=False,
                                       backward=True) == 0  # fmt: skip
    assert fused.adam_step_time(gpu, num_params=10**6, with_model_copy=False) < fused.adam_step_time(
        gpu, num_params=10**6
    )


def step_gpu():
    from prism_megatron.gpu_model import gpu_spec

    return gpu_spec("h100")


def loss_step(fusions: modelled_fusions.Fusions) -> Step:
    """Forward and backward of a one-layer GPTModel with its loss, on a modelled H100."""
    from megatron.core.models.gpt import GPTModel

    args = pretrain_args.parse(list(MODEL))
    config = model.transformer_config(args)
    device = RecordingDevice("h100")
    with one_rank(), device.active():
        spec = parallel_spec.decoder_spec(get_gpt_layer_local_spec(), config, vp_stage=None, modelled=True)
        gpt = GPTModel(
            config, spec, vocab_size=VOCAB, max_sequence_length=SEQUENCE, position_embedding_type="rope"
        )
        counts = modelled_fusions.install(device, [gpt], None, fusions)
        tokens = torch.zeros(1, SEQUENCE, dtype=torch.long)
        positions = torch.arange(SEQUENCE).unsqueeze(0)
        start, start_flops = device.by_kind_ns(), device.clock.flops
        del device.fused_prices[:]
        gpt(tokens, positions, None, labels=tokens).sum().backward()
        end = device.by_kind_ns()
    return _step_since(device, start, start_flops, end, counts, [])


VOCAB = 1024


def test_cross_entropy_fusion_is_one_kernel_each_way_only_with_transformer_engines_kernel():
    assert not modelled_fusions.Fusions.from_args(pretrain_args.parse(list(MODEL))).cross_entropy
    # Megatron's own fused path (the default impl) is charged op by op: measured, it is no single pass.
    native = pretrain_args.parse([*MODEL, "--cross-entropy-loss-fusion"])
    assert native.cross_entropy_fusion_impl == "native"
    assert not modelled_fusions.Fusions.from_args(native).cross_entropy
    asked = pretrain_args.parse([*MODEL, "--cross-entropy-loss-fusion", "--cross-entropy-fusion-impl", "te"])
    assert modelled_fusions.Fusions.from_args(asked).cross_entropy
    with pytest.raises(ValueError, match=r"--cross-entropy-fusion-impl.*'native', 'te'"):
        pretrain_args.parse([*MODEL, "--cross-entropy-fusion-impl", "apex"])
    assert not model.transformer_config(asked).cross_entropy_loss_fusion  # the program stays unfused
    step, off = loss_step(_only(cross_entropy=True)), loss_step(OFF)
    prices = [
        fused.cross_entropy_time(
            step_gpu(), tokens=SEQUENCE, vocab=VOCAB, dtype=torch.bfloat16, backward=backward
        )
        for backward in (False, True)
    ]
    assert step.counts["cross_entropy"] == 1 and step.fused_prices == prices
    assert step.unfused_kinds_ns < off.unfused_kinds_ns
    assert step.by_kind_ns["gemm"] == off.by_kind_ns["gemm"]
    _same_compute(step, off)


def test_attention_dropout_is_charged_as_the_same_flash_kernel(unfused):
    """Megatron's default attention dropout (0.1) must not turn attention into its unfused math form
    (two batched GEMMs and a softmax over [b, h, s, s]): a GPU's flash kernel draws the mask inside."""
    step = one_step(OFF, "--attention-dropout", "0.1")
    assert step.by_kind_ns["attention"] == unfused.by_kind_ns["attention"] > 0
    assert step.by_kind_ns["gemm"] == unfused.by_kind_ns["gemm"]
    assert step.flops == unfused.flops


def test_an_moe_model_s_chained_dense_and_expert_optimizers_each_get_their_fused_adam():
    from megatron.core.optimizer.optimizer import ChainedOptimizer

    dense, expert = (torch.optim.AdamW([torch.nn.Parameter(torch.zeros(n))]) for n in (3, 5))
    chained = ChainedOptimizer.__new__(ChainedOptimizer)  # its `.optimizer` refuses more than one
    chained.chained_optimizers = [type("Wrapped", (), {"optimizer": inner})() for inner in (dense, expert)]
    assert modelled_fusions._torch_optimizers(chained) == [dense, expert]


def _activations_kept_by_the_forward(fused_activation: bool) -> int:
    """One SwiGLU layer's forward and backward on a modelled H100: the activations alive after the
    forward (the backward still runs: what was not kept is made again, empty)."""
    import gc

    from prism_megatron.passes.memory import ACTIVATIONS, LiveStorageTracker

    args = pretrain_args.parse([*MODEL, "--swiglu"])
    config = model.transformer_config(args)
    device = RecordingDevice("h100")
    with one_rank(), device.active():
        spec = parallel_spec.decoder_spec(get_gpt_layer_local_spec(), config, vp_stage=None, modelled=True)
        block = TransformerBlock(config, spec, post_layer_norm=False)
        modelled_fusions.install(
            device, [block], None, dataclasses.replace(OFF, bias_activation=fused_activation)
        )
        rotary = RotaryEmbedding(HIDDEN // HEADS, rotary_percent=1.0)(SEQUENCE)
        hidden = torch.randn(SEQUENCE, 1, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
        with LiveStorageTracker(fake_storage=True) as tracker:
            out = block(hidden, attention_mask=None, rotary_pos_emb=rotary)
            gc.collect()
            kept = tracker.account.current[ACTIVATIONS]
            out.sum().backward()
    assert hidden.grad.shape == hidden.shape
    return kept


def test_a_fused_swiglu_keeps_only_its_input_for_the_backward():
    """Between fc1 and fc2 the fused bias-SwiGLU kernel keeps its input (fc1's output plus bias);
    megatron-core's unfused SwiGLU (what `--no-bias-swiglu-fusion` runs on a GPU too) also keeps the
    SiLU output and the linear half plus its offset: two [s, ffn] bf16 tensors more."""
    assert (
        _activations_kept_by_the_forward(False) - _activations_kept_by_the_forward(True)
        == 2 * SEQUENCE * FFN * 2
    )
