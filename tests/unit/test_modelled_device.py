"""The modelled GPU as a device: its flag, its cluster, its report section, its time on the timeline."""

from __future__ import annotations

import contextlib

import pytest

from prism_megatron import gpu_model
from prism_megatron.config import (
    DEVICES,
    MODELLED_GPUS,
    PRESET_OF_GPU,
    CaptureConfig,
    ClusterConfig,
    EmulationConfig,
    PrismConfig,
)
from prism_megatron.network import PRESETS, load_cluster
from prism_megatron.replay import timeline
from prism_megatron.report.modelled import KINDS, ModelledReport


def test_the_flag_offers_exactly_the_gpus_the_model_knows():
    assert tuple(sorted(MODELLED_GPUS)) == tuple(sorted(gpu_model.GPU_NAMES))
    assert {d for d in DEVICES if d.startswith("model:")} == {f"model:{g}" for g in gpu_model.GPU_NAMES}


def test_an_unknown_device_is_one_line_naming_the_valid_ones():
    with pytest.raises(ValueError, match=r"--prism-device model:v100: valid devices are .*model:h100"):
        EmulationConfig(device="model:v100")


@pytest.mark.parametrize("gpu", MODELLED_GPUS)
def test_a_modelled_gpu_runs_in_its_own_system_unless_told_otherwise(gpu):
    config = PrismConfig(emulation=EmulationConfig(device=f"model:{gpu}"))
    assert config.emulation.modelled_gpu == gpu
    assert config.emulation.resolved_device(cuda_available=True) == "cpu"  # fake tensors live on the CPU
    assert config.cluster.cluster == PRESET_OF_GPU[gpu] == f"dgx-{gpu}"
    assert load_cluster(config.cluster.cluster).name == f"dgx-{gpu}"
    chosen = PrismConfig(
        emulation=EmulationConfig(device=f"model:{gpu}"), cluster=ClusterConfig(cluster="dgx-a100")
    )
    assert chosen.cluster.cluster == "dgx-a100"
    assert PrismConfig(emulation=EmulationConfig(device="cpu")).cluster.cluster == "default"


def test_dgx_b200_is_eight_blackwell_gpus_with_nvlink_5_and_400g_nics():
    spec = PRESETS["dgx-b200"]
    assert spec.gpus_per_node == 8
    assert spec.intra_node.nvlink_bandwidth_gb_per_s == 900.0  # 1.8 TB/s per GPU, both directions
    assert spec.network.nics_per_node == 8 and spec.network.nic_bandwidth_gb_per_s == 50.0


def test_host_marks_read_as_modelled_time_while_a_map_is_installed():
    first = timeline.mark()
    host_ns = timeline.resolve_one(first)
    timeline.set_time_map(lambda t: 7 if t <= host_ns else 9)
    try:
        second = timeline.mark()
        assert timeline.resolve([first, second]) == [7, 9]
        assert timeline.map_time(host_ns) == 7
    finally:
        timeline.set_time_map(None)
    assert timeline.resolve_one(first) == host_ns


def _report(**changes) -> ModelledReport:
    fields = dict(
        gpu="h100", gpu_name="H100 SXM", peak_tflops=989.4, iteration_time_s=2.0, tflops_per_gpu=400.0,
        mfu=400.0 / 989.4, tokens_per_s_per_gpu=1000.0, critical_role="pp1",
        time_by_kind_s={"gemm": 1.0, "attention": 0.3, "memory": 0.3, "launch": 0.0,
                        "exposed_communication": 0.1, "pipeline_bubble": 0.3},
    )  # fmt: skip
    return ModelledReport(**{**fields, **changes})


def test_the_report_says_modelled_where_a_measured_run_says_measured():
    report = _report()
    assert report.method == "modelled on H100 by prism's GPU model"
    assert ModelledReport.from_json(report.to_json()) == report
    text = "\n".join(report.markdown())
    assert "modelled on H100 by prism's GPU model" in text and "nothing was measured" in text
    for kind in KINDS:
        assert kind.replace("_", " ") in text
    assert "MFU 40.4%" in report.summary_line()
    assert "MoE routing" not in text  # a dense model
    moe = _report(moe_routing="balanced")
    assert ModelledReport.from_json(moe.to_json()) == moe
    assert "MoE routing is **balanced** (a stand-in" in "\n".join(moe.markdown())
    assert "Attention is timed" not in text  # a report written before the kernel was recorded
    cudnn = _report(attention_kernel="cuDNN fused attention")
    assert ModelledReport.from_json(cudnn.to_json()) == cudnn
    assert "Attention is timed as **cuDNN fused attention** runs it" in "\n".join(cudnn.markdown())
    assert report.memory_warning() is None and "out of memory" not in text
    full_gpu = _report(
        memory_capacity_bytes=81559 * 2**20, over_capacity={"pp1": 101_000_000_000, "pp2": 93_000_000_000}
    )
    assert ModelledReport.from_json(full_gpu.to_json()) == full_gpu
    warning = full_gpu.memory_warning()
    assert warning.startswith(
        "out of memory on a real H100 SXM: the modelled peaks of pp1 94.1 GiB, pp2 86.6 GiB"
    )
    assert "exceed the 79.6 GiB it reports (NVML" in warning
    assert f"**{warning}**" in "\n".join(full_gpu.markdown())
    # What report.json's schema holds of the section: every field the report writes, with or without.
    import jsonschema

    from prism_megatron.report.schema import json_schema

    full = json_schema()
    section = {**full["properties"]["modelled"], "$defs": full["$defs"]}
    for each in (report, moe, cudnn, full_gpu):
        jsonschema.validate(each.to_json(), section)


@pytest.mark.parametrize(
    ("backend", "gpu", "kernel"),
    [
        ("auto", "h100", "cudnn"),  # Megatron's default: Transformer Engine prefers cuDNN on Hopper+
        ("auto", "h200", "cudnn"),
        ("auto", "b200", "cudnn"),
        ("auto", "a100", "flash"),  # ... and FlashAttention before Hopper
        ("flash", "h100", "flash"),
        ("fused", "a100", "cudnn"),
        ("fused", "h100", "cudnn"),
        ("unfused", "h100", None),  # no fused kernel: the attention's GEMMs and softmax are timed
        ("local", "h100", None),
    ],
)
def test_the_attention_kernel_is_the_one_a_gpu_run_of_the_flags_takes(backend, gpu, kernel):
    import argparse

    from megatron.core.transformer.enums import AttnBackend

    from prism_megatron.megatron.run.modelled_fusions import attention_kernel

    assert attention_kernel(argparse.Namespace(attention_backend=backend), gpu) == kernel  # built-in entry
    assert attention_kernel(argparse.Namespace(attention_backend=AttnBackend[backend]), gpu) == kernel
    assert attention_kernel(argparse.Namespace(), gpu) == attention_kernel(
        argparse.Namespace(attention_backend="auto"), gpu
    )


def test_a_modelled_device_times_attention_as_the_chosen_kernel_and_says_which():
    import torch

    from prism_megatron.megatron.run.modelled_device import ModelledDevice

    def attention_ns(kernel: str | None) -> tuple[int, str | None]:
        device = ModelledDevice("h100")
        if kernel != "default":
            device.use_attention_kernel(kernel)
        with device.active():
            q = torch.ones(1, 16, 4096, 128, dtype=torch.bfloat16)
            torch.nn.functional.scaled_dot_product_attention(q, q, q, is_causal=True)
        summary = device.summary()
        return summary["modelled_ns_by_kind"]["attention"], summary["attention_kernel"]

    flash_ns, flash = attention_ns("default")
    cudnn_ns, cudnn = attention_ns("cudnn")
    _, none = attention_ns(None)
    assert none is None  # --attention-backend unfused or local: no fused kernel to name
    expected = gpu_model.attention_time(
        gpu_model.gpu_spec("h100").with_attention_kernel("cudnn"), batch=1, num_heads=16, num_kv_heads=16,
        seq_q=4096, seq_kv=4096, head_dim=128, causal=True,
    )  # fmt: skip
    assert (flash, cudnn) == ("flash", "cudnn")
    assert cudnn_ns == expected > flash_ns


def test_a_modelled_run_takes_a_megatron_lm_script_and_moe_and_refuses_a_graph_to_replay():
    import argparse

    from prism_megatron.emulation.plan import _check_modelled

    config = PrismConfig(emulation=EmulationConfig(device="model:h100"))
    _check_modelled(config, argparse.Namespace(num_experts=None))  # the built-in entry and a script alike
    for dispatcher in ("alltoall", "allgather"):  # routing balanced (patches/modelled_moe.py)
        _check_modelled(config, argparse.Namespace(num_experts=8, moe_token_dispatcher_type=dispatcher))
    flex = argparse.Namespace(num_experts=8, moe_token_dispatcher_type="flex")
    with pytest.raises(
        ValueError, match=r"--moe-token-dispatcher-type flex on --prism-device model:h100: .* alltoall"
    ):
        _check_modelled(config, flex)
    with_graph = PrismConfig(emulation=EmulationConfig(device="model:h100"), capture=CaptureConfig(graph="g"))
    with pytest.raises(
        ValueError, match="--prism-device model:h100 captures its own graph; drop --prism-graph"
    ):
        _check_modelled(with_graph, argparse.Namespace(num_experts=None))


def test_the_plan_of_a_modelled_pretrain_gpt_run_captures_each_class_alone(tmp_path):
    from prism_megatron.emulation.plan import plan_run

    script = tmp_path / "pretrain_gpt.py"  # a checkout's shape: the script beside megatron/training/
    script.write_text("")
    (tmp_path / "megatron" / "training").mkdir(parents=True)
    (tmp_path / "megatron" / "training" / "__init__.py").write_text("")
    flags = ("--num-layers", "4", "--hidden-size", "256", "--num-attention-heads", "8", "--seq-length", "128",
             "--max-position-embeddings", "128", "--micro-batch-size", "1", "--global-batch-size", "16",
             "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2", "--vocab-size", "1000",
             "--prism-emulate", "--prism-world-size", "8", "--prism-device", "model:h100",
             "--prism-out", str(tmp_path / "run"))  # fmt: skip
    plan = plan_run(flags, script=str(script))
    assert plan.modelled and plan.nproc == 1 and plan.script == str(script)
    assert len(plan.capture_batches) == len(plan.slice_ranks) >= 2  # one rank per pass (PP2: two programs)


def test_a_modelled_gpu_chooses_a_stand_in_for_each_flag_that_needs_transformer_engine_or_apex():
    import argparse

    from prism_megatron.patches.arguments import MODELLED_STAND_INS, _modelled_stand_ins, as_written

    written = {"transformer_impl": "transformer_engine", "apply_rope_fusion": True,
               "gradient_accumulation_fusion": True, "no_persist_layer_norm": False, "bias_swiglu_fusion": True,
               "moe_grouped_gemm": True, "moe_permute_fusion": True, "cross_entropy_loss_fusion": True,
               "cross_entropy_fusion_impl": "te"}  # fmt: skip
    run = argparse.Namespace(config=PrismConfig(emulation=EmulationConfig(device="model:h100")))
    args = argparse.Namespace(**written)
    lines = _modelled_stand_ins(run, args)
    assert len(lines) == len(MODELLED_STAND_INS) == 7
    assert args.transformer_impl == "local" and not args.apply_rope_fusion and args.no_persist_layer_norm
    assert not args.gradient_accumulation_fusion
    assert not args.moe_grouped_gemm  # SequentialMLP: the same expert weights, one GEMM per expert
    assert not args.moe_permute_fusion
    assert args.bias_swiglu_fusion, "a fusion that runs on the CPU (torch ops) stays as written"
    assert not args.cross_entropy_loss_fusion  # the unfused loss runs; TE's kernel is charged (below)
    assert lines[0].startswith("--transformer-impl local (was transformer_impl=transformer_engine): ")
    written_again = as_written(args)  # the job as written, for what a GPU run fuses
    assert (
        written_again.transformer_impl == "transformer_engine" and written_again.gradient_accumulation_fusion
    )
    assert written_again.moe_grouped_gemm
    from prism_megatron.megatron.run.modelled_fusions import Fusions

    fusions = Fusions.from_args(argparse.Namespace(**{**vars(written_again), "position_embedding_type": "rope",
                                                       "bias_dropout_fusion": True, "swiglu": True}))  # fmt: skip
    assert fusions.cross_entropy  # Megatron-LM's namespace, impl te: charged as TE's kernel
    assert args.transformer_impl == "local"
    # Flags already so, or a device that is not modelled: nothing changes, nothing is said.
    assert _modelled_stand_ins(run, args) == []
    cpu = argparse.Namespace(config=PrismConfig(emulation=EmulationConfig(device="cpu")))
    untouched = argparse.Namespace(**written)
    assert _modelled_stand_ins(cpu, untouched) == [] and untouched.transformer_impl == "transformer_engine"


def test_a_module_of_fake_tensors_converts_in_place_as_megatron_lms_get_model_converts_it():
    import torch
    from torch._subclasses.fake_tensor import FakeTensor, FakeTensorMode

    from prism_megatron.patches import registry
    from prism_megatron.patches.modelled_device import MODULE_APPLY

    with FakeTensorMode(), registry.patched([MODULE_APPLY]):
        module = torch.nn.Sequential(torch.nn.Linear(8, 4), torch.nn.LayerNorm(4))
        weight = module[0].weight
        module.bfloat16()  # unpatched: "Cannot swap t1 because it has weakref associated with it"
        assert module[0].weight is weight and isinstance(weight, FakeTensor)
        assert {p.dtype for p in module.parameters()} == {torch.bfloat16}
    real = torch.nn.Linear(2, 2)
    with registry.patched([MODULE_APPLY]):
        assert real.double().weight.dtype == torch.float64  # real tensors: torch's own conversion


def test_on_a_modelled_gpu_marks_read_modelled_time_in_order_even_with_no_op_between():
    import torch

    from prism_megatron.megatron.run.modelled_device import CLOCK_ORIGIN_NS, ModelledDevice

    device = ModelledDevice("h100")
    with device.active():
        first, second = timeline.mark(), timeline.mark()  # two pipeline calls in a row: no op between
        x = torch.ones(4096, 4096, dtype=torch.bfloat16)
        y = x @ x  # a GEMM: modelled time passes
        third = timeline.mark()
        times = timeline.resolve([first, second, third])
    assert CLOCK_ORIGIN_NS < times[0] < times[1] < times[2]
    assert times[1] - times[0] == 1  # one nanosecond per mark
    gemm_ns = device.by_kind_ns()["gemm"]
    assert gemm_ns > 10_000 and times[2] - times[1] >= gemm_ns  # 2 x 4096^3 FLOP on an H100: tens of us
    assert y.shape == (4096, 4096) and timeline._time_map is None  # the map is gone after the device


@pytest.mark.parametrize("causal", [True, False])
def test_a_context_parallel_block_is_charged_as_one_flash_kernel_each_way(causal):
    """CP attention computes block by block (score GEMMs, softmax, exp); a GPU runs each block as one
    flash-attention kernel, and a modelled device charges exactly that kernel, forward and backward."""
    import torch

    from prism_megatron.megatron.layers import attention_blocks
    from prism_megatron.megatron.run.modelled_device import ModelledDevice
    from prism_megatron.passes.memory import LiveStorageTracker

    s, b, heads, groups, d = 1024, 1, 16, 4, 128
    device = ModelledDevice("h100")
    shape = {"batch": b, "num_heads": heads, "num_kv_heads": groups, "seq_q": s, "seq_kv": s, "head_dim": d,
             "causal": causal, "dtype": torch.bfloat16}  # fmt: skip
    forward = gpu_model.attention_time(device.gpu, **shape, backward=False)
    backward = gpu_model.attention_time(device.gpu, **shape, backward=True)
    mask = attention_blocks.BlockMask(causal=causal)
    with device.active():
        q = torch.empty(s, b, heads, d, dtype=torch.bfloat16)
        k, v = (torch.empty(s, b, groups, d, dtype=torch.bfloat16) for _ in range(2))
        before = device.by_kind_ns()
        with LiveStorageTracker(fake_storage=True) as tracked:
            out, lse = attention_blocks.block_forward(q, k, v, 0.1, mask)
            after_forward = device.by_kind_ns()
            grads = attention_blocks.block_backward(q, k, v, out, lse, lse, 0.1, mask)
        after_backward = device.by_kind_ns()
    # Like the flash kernel, a block allocates its outputs only, never the [b, n, s, s] scores.
    outputs = sum(t.numel() * t.element_size() for t in (out, lse, *grads))
    assert tracked.report().peak_bytes == outputs < b * heads * s * s * 4
    assert attention_blocks.block_kernel is None  # only while the device is active
    # Not worked out on fake tensors, but the outputs are those the maths gives (small real ones here).
    small = [torch.randn(8, b, n, d, dtype=torch.bfloat16) for n in (heads, groups, groups)]
    real_out, real_lse = attention_blocks.block_forward(*small, 0.1, mask)
    real_grads = attention_blocks.block_backward(*small, real_out, real_lse, real_lse, 0.1, mask)
    for fake, real in zip((out, lse, *grads), (real_out, real_lse, *real_grads), strict=True):
        assert fake.dtype == real.dtype and fake.dim() == real.dim()
        scaled = [s if size == 8 else size for size in real.shape]  # sequence 8 -> s
        assert list(fake.shape) == scaled
        assert sorted(range(fake.dim()), key=fake.stride) == sorted(range(real.dim()), key=real.stride)
    assert after_forward["attention"] - before.get("attention", 0) == forward > 0
    assert after_backward["attention"] - after_forward["attention"] == backward > forward
    for kind in ("gemm", "memory"):
        assert after_backward.get(kind, 0) == before.get(kind, 0)


def _memory_workload():
    """Ops a training step makes: allocations, views, in-place updates, a temporary freed, autograd."""
    import torch

    w = torch.ones(256, 256, dtype=torch.bfloat16, requires_grad=True)
    x = torch.ones(8, 256, dtype=torch.bfloat16)
    h = (x @ w).view(2, 4, 256).reshape(8, 256)
    tmp = h * 2
    del tmp
    h.sum().backward()
    w.grad.add_(1.0)
    return w, x


def test_on_a_modelled_gpu_the_memory_tracker_rides_the_device_layer_and_counts_what_its_own_layer_would():
    """The tracker entered on a modelled device is carried by the device's dispatch layer (one Python
    layer per op, not two), and its account is the one it keeps as a dispatch mode of its own."""
    from torch._subclasses.fake_tensor import FakeTensorMode
    from torch.utils._python_dispatch import _get_current_dispatch_mode

    from prism_megatron.megatron.run.modelled_device import ModelledDevice
    from prism_megatron.passes.memory import LiveStorageTracker

    with FakeTensorMode(allow_non_fake_inputs=True), LiveStorageTracker(fake_storage=True) as own:
        assert _get_current_dispatch_mode() is own
        kept = _memory_workload()
    device = ModelledDevice("h100")
    with device.active():
        layer = _get_current_dispatch_mode()
        with LiveStorageTracker(fake_storage=True) as carried:
            assert _get_current_dispatch_mode() is layer  # no layer of its own
            kept_too = _memory_workload()
        assert _get_current_dispatch_mode() is layer
        _memory_workload()  # after the tracker exits, nothing more is counted
    assert carried.report() == own.report()
    assert carried.report().peak_bytes >= 2 * 256 * 256 * 2  # the weight and its gradient at least
    assert kept[0].shape == kept_too[0].shape


def test_on_a_modelled_gpu_a_fake_tensor_s_device_is_what_the_fake_mode_says_and_costs_no_time():
    import torch

    from prism_megatron.megatron.run.modelled_device import ModelledDevice
    from prism_megatron.passes.memory import LiveStorageTracker

    device = ModelledDevice("h100")
    with device.active():
        x = torch.ones(64, 64)
        before, clock_ops = device.now_ns(), device.clock.num_ops
        with LiveStorageTracker(fake_storage=True) as tracker:
            for _ in range(3):
                assert torch.ops.prim.device.default(x) == torch.device("cpu") == x.device
        assert device.now_ns() == before and device.clock.num_ops == clock_ops
        assert tracker.report().peak_bytes == 0
    with device.fake_mode:
        assert torch.ops.prim.device.default(x) == torch.device("cpu")  # the fake mode alone agrees


@pytest.mark.parametrize("norm_type", ["RMSNorm", "LayerNorm"])
def test_a_norm_on_a_modelled_gpu_keeps_what_the_fused_kernel_keeps_and_costs_the_same(norm_type):
    """Saved for the backward: the input and one FP32 statistic per token (rsigma; LayerNorm's mean
    too), as Transformer Engine's fused norm returns them, not torch's decomposed norm's FP32 copies;
    the time charged is the fused kernel's either way, and the shapes and gradients are torch's."""
    import torch

    from prism_megatron.megatron.run.modelled_device import ModelledDevice, fuse_norms

    tokens, hidden = 512, 1024
    device = ModelledDevice("h100")
    with device.active():
        norm = getattr(torch.nn, norm_type)(hidden, dtype=torch.bfloat16)
        assert fuse_norms(device, [norm]) == 1
        x = torch.randn(tokens, 1, hidden, dtype=torch.bfloat16, requires_grad=True)
        saved: list[torch.Tensor] = []
        before = device.now_ns()
        with torch.autograd.graph.saved_tensors_hooks(lambda t: saved.append(t) or t, lambda t: t):
            y = norm(x)
        forward_ns = device.now_ns() - before
        y.backward(torch.ones_like(y))
    assert y.shape == x.shape and y.dtype == x.dtype
    assert x.grad.shape == x.shape and norm.weight.grad.shape == norm.weight.shape
    stats = 2 if norm_type == "LayerNorm" else 1
    assert sum(t.numel() * t.element_size() for t in saved) == tokens * hidden * 2 + stats * tokens * 4
    fused_norm_ns = gpu_model.fused.norm_time(
        device.gpu, tokens=tokens, hidden=hidden, dtype=torch.bfloat16, backward=False,
        layer_norm=norm_type == "LayerNorm",
    )  # fmt: skip
    assert fused_norm_ns <= forward_ns <= fused_norm_ns + 10  # the fused kernel alone (marks add 1 ns)


def test_rope_inside_the_fused_kernel_is_its_result_s_shape_alone_and_keeps_no_tables():
    """With the rotary fusion on, the modelled device charges TE's fused RoPE over the region around
    `apply_rotary_pos_emb` (`modelled_fusions`); there the unfused form's ops go uncharged, so the
    patch gives the result's shape alone and, like the fused kernel, saves nothing for the backward.
    Outside a fused scope (`--no-rope-fusion`) megatron-core's RoPE runs and is charged."""
    import torch
    from megatron.core.models.common.embeddings import rope_utils
    from megatron.core.transformer.transformer_config import TransformerConfig

    from prism_megatron.megatron.run.modelled_device import ModelledDevice
    from prism_megatron.patches import modelled_device as modelled_patches

    s, b, n, d = 64, 2, 4, 32
    config = TransformerConfig(num_layers=1, hidden_size=n * d, num_attention_heads=n)
    apply = modelled_patches._fused_rope(rope_utils.apply_rotary_pos_emb)
    device = ModelledDevice("h100")

    def run(fused: bool):
        saved = []
        before = device.by_kind_ns()
        scope = device.fused_kernel(0) if fused else contextlib.nullcontext()
        with torch.autograd.graph.saved_tensors_hooks(lambda x: saved.append(x) or x, lambda x: x), scope:
            out = apply(t, freqs, config, cp_group=object())
        (grad,) = torch.autograd.grad(out, t, torch.empty_like(out))  # an allocation: no kernel
        charged = sum(device.by_kind_ns().values()) - sum(before.values())
        return out, grad, saved, charged

    with device.active():
        t = torch.empty(s, b, n, d, dtype=torch.bfloat16).transpose(1, 2).transpose(1, 2).requires_grad_()
        freqs = torch.empty(s, 1, 1, d, dtype=torch.float32)
        unfused, unfused_grad, unfused_saved, unfused_ns = run(fused=False)
        fused, fused_grad, fused_saved, fused_ns = run(fused=True)
    assert modelled_patches.inside_fused_kernel is None  # only while the device is active
    for a, b_ in ((fused, unfused), (fused_grad, unfused_grad)):
        assert (a.shape, a.dtype, a.stride()) == (b_.shape, b_.dtype, b_.stride())
    assert fused_saved == [] and unfused_saved  # the unfused form keeps its cos and sin
    assert unfused_ns > 0 and fused_ns == 0  # the ops charged outside a scope; none inside


def test_a_modelled_run_keeps_its_memory_bound_calls_by_shape_dtype_and_strides():
    """What a GPU profile of the same program is held against, call by call (against_gpu's by_call)."""
    import torch

    from prism_megatron.megatron.run.modelled_device import ModelledDevice

    device = ModelledDevice("h100")
    with device.active():
        x = torch.ones(2048, 4096, dtype=torch.bfloat16)
        for _ in range(3):
            x + x.t().contiguous().t()  # a transposed operand
        x @ x.t()  # a GEMM: kept with the GEMMs, not here
    calls = device.summary()["top_op_calls"]
    add = next(call for call in calls if call["op"] == "add.Tensor")
    assert add["count"] == 3 and add["ns"] > 0
    assert add["inputs"] == [
        {"shape": [2048, 4096], "dtype": "bfloat16", "stride": [4096, 1]},
        {"shape": [2048, 4096], "dtype": "bfloat16", "stride": [1, 2048]},
    ]
    assert not any(call["op"] == "mm.default" for call in calls)


def test_the_modelled_report_names_captured_roles_over_the_gpus_memory_and_splits_the_critical_roles_own_compute():
    from types import SimpleNamespace

    from prism_megatron.emulation.modelled_run import _compute_split, _over_capacity
    from prism_megatron.topology import JobModel, Layout, role_classes

    layout = Layout(world_size=64, tp=1, pp=8, vpp=2)  # rank of stage s: 8 s
    plan = SimpleNamespace(
        config=SimpleNamespace(emulation=SimpleNamespace(modelled_gpu="h100")),
        layout=layout,
        role_classes=role_classes(layout, JobModel(num_layers=16, num_microbatches=32)),
    )

    def result(peak: int, gemm: int) -> dict:
        # a rank's results name its coordinates, not its role: the role comes from the layout
        return {"role": {"pp_rank": 0}, "memory": {"peak_bytes": peak},
                "modelled_device": {"iterations_by_kind_ns": [{"gemm": gemm, "attention": 100 - gemm}]}}  # fmt: skip

    results = {
        0: result(70 * 10**9, 10),
        48: result(79 * 10**9, 20),
        8: result(95 * 10**9, 30),
        56: result(1, 40),
    }
    capacity, over = _over_capacity(plan, results)
    assert capacity == 81559 * 2**20 and over == {"pp1": 95 * 10**9}
    assert _compute_split(plan, "pp6", results)["gemm"] == 0.2  # its own capture
    assert _compute_split(plan, "pp3", results)["gemm"] == 0.2  # derived: its class's representative, pp6
    assert _compute_split(plan, "pp7-tp0src", results)["gemm"] == 0.4
