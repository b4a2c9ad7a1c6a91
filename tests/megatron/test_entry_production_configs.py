"""The built-in entry takes the shipped production configurations and builds what their flags describe.

Every `launch/configs/*.args` parses with the built-in entry's parser (Megatron-LM's flag names and
values). Tiny shrinks of three of them, each keeping the production file's own flags and overriding
only sizes, are built by the entry and by megatron-core from a configuration written out here by hand;
the two models must hold the same parameters, name by name and shape by shape. The shrinks are:
* Llama 3 405B: RoPE base 500000, GQA, SwiGLU, RMSNorm, untied embeddings, and uneven pipeline stages
  (one layer on the first and last of 4 stages, two on each middle one), TP 1;
* DeepSeek-V3 (the plan shrink's 8-rank shrink): multi-latent attention with query compression and
  q/k norms, a dense first layer then MoE layers with a shared expert, group-limited sigmoid routing
  with expert bias, grouped GEMM, multi-token prediction, stages of 1 and 2 layers, EP 2;
* Mixtral 8x22B: MoE with grouped GEMM and the all-to-all dispatcher, EP 2 (TP 1: the local layers
  have no sequence parallelism).
Then the entry trains one iteration of the Llama and DeepSeek shrinks as the first and the last
pipeline stage, in one process with its pipeline and expert peers virtual, and reports the same
parameter count megatron-core's model has.

Attention kernels hold no parameters; where megatron-core's local kernel cannot take MLA's head sizes
the reference holds megatron-core's `IdentityOp` in its place. The reference's experts are
megatron-core's SequentialMLP, which has the parameters of Transformer Engine's grouped experts.
"""

from __future__ import annotations

import contextlib
import dataclasses
import math
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from megatron.core import parallel_state, tensor_parallel
from megatron.core.models.gpt import GPTModel
from megatron.core.models.gpt.gpt_layer_specs import (
    get_gpt_decoder_block_spec,
    get_gpt_decoder_layer_specs,
    get_gpt_layer_local_spec,
    get_gpt_mtp_block_spec,
)
from megatron.core.transformer import MLATransformerConfig, TransformerConfig
from megatron.core.transformer import multi_latent_attention as megatron_mla
from megatron.core.transformer.dot_product_attention import DotProductAttention
from megatron.core.transformer.identity_op import IdentityOp

from prism_megatron.megatron.entry import arguments as pretrain_args
from prism_megatron.megatron.entry import model, pretrain
from prism_megatron.megatron.job import target
from prism_megatron.megatron.job.configs import read_config
from prism_megatron.megatron.plan.shrink import shrink
from prism_megatron.patches import cpu_shim, registry

CONFIGS = sorted(Path(__file__).resolve().parents[2].joinpath("launch", "configs").glob("*.args"))


def config_flags(name: str) -> list[str]:
    return read_config(next(path for path in CONFIGS if path.stem == name))


# --- every configuration parses ------------------------------------------------------------------


def _numeric_values(argv: list[str]) -> dict[str, float]:
    """`--flag value` pairs of a configuration whose value is a number."""
    pairs = {}
    for flag, value in zip(argv, [*argv[1:], ""], strict=True):
        with contextlib.suppress(ValueError):
            if flag.startswith("--"):
                pairs[flag] = float(value)
    return pairs


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_shipped_configuration_parses_with_the_builtin_entry_and_keeps_its_values(path):
    argv = read_config(path)
    args = pretrain_args.parse(argv)
    ignored = set(pretrain_args.IGNORED_VALUED)
    numeric = _numeric_values(argv)
    assert len(numeric) > 10
    for flag, value in numeric.items():
        if flag not in ignored and not flag.startswith("--prism-"):
            parsed = getattr(args, flag[2:].replace("-", "_"))
            # A flag Megatron-LM declares with nargs="+" (--moe-aux-loss-coeff) parses to a list.
            assert (parsed if not isinstance(parsed, list) else parsed[0]) == pytest.approx(value), flag
            assert not isinstance(parsed, list) or len(parsed) == 1, flag


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_no_shipped_configuration_is_refused_by_the_local_layers(path):
    """Sequence parallelism, context parallelism and MoE with TP > 1 run on the entry's local layers."""
    pretrain_args.check_local_spec(pretrain_args.parse(read_config(path)))


def test_deepseek_flags_become_megatron_lms_values():
    args = pretrain_args.parse(config_flags("deepseek-v3-2048gpus"))
    assert args.moe_layer_freq == [0] * 3 + [1] * 58
    assert (args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers) == (4, 1)
    assert (args.q_lora_rank, args.kv_lora_rank, args.qk_head_dim, args.qk_pos_emb_head_dim) == (
        1536,
        512,
        128,
        64,
    )
    assert args.moe_router_score_function == "sigmoid" and args.moe_router_enable_expert_bias
    assert target.padded_vocab_size(args) == 129280  # 129279 + the NullTokenizer's EOD, a multiple of 128
    config = model.transformer_config(args)
    assert isinstance(config, MLATransformerConfig) and config.rotary_scaling_factor == 40
    assert config.moe_shared_expert_intermediate_size == 2048 and config.mtp_num_layers == 1


# --- the shrinks ---------------------------------------------------------------------------------

TINY = (
    "--hidden-size", "64", "--ffn-hidden-size", "128", "--num-attention-heads", "4", "--num-query-groups", "2",
    "--seq-length", "32", "--max-position-embeddings", "32", "--vocab-size", "255", "--train-iters", "1",
)  # fmt: skip


def llama_flags() -> list[str]:
    uneven = (
        "--num-layers", "6", "--tensor-model-parallel-size", "1", "--pipeline-model-parallel-size", "4",
        "--decoder-first-pipeline-num-layers", "1", "--decoder-last-pipeline-num-layers", "1",
        "--global-batch-size", "8", "--prism-world-size", "8",
    )  # fmt: skip
    # The shipped configuration's layers without its interleaving (one layer per virtual stage, the
    # embedding and loss counted as layers): megatron-core's reference model here is one chunk a rank.
    flags = config_flags("llama3-405b-8192gpus")
    at = flags.index("--num-layers-per-virtual-pipeline-stage")
    del flags[at : at + 2]
    split = ("--account-for-embedding-in-pipeline-split", "--account-for-loss-in-pipeline-split")
    return [*(flag for flag in flags if flag not in split), *TINY, *uneven]


def deepseek_flags() -> list[str]:
    return [*shrink(config_flags("deepseek-v3-2048gpus"), 8), "--train-iters", "1"]


def mixtral_flags() -> list[str]:
    no_tp = (
        "--tensor-model-parallel-size",
        "1",
        "--expert-tensor-parallel-size",
        "1",
        "--global-batch-size",
        "8",
    )
    return [*shrink(config_flags("mixtral-8x22b-2048gpus"), 8), *no_tp]


def _dense_config(**sizes) -> dict:
    """What the three shrinks share: hidden 64, SwiGLU, RMSNorm, no biases, bf16."""
    return dict(
        hidden_size=64, num_attention_heads=4, ffn_hidden_size=128, normalization="RMSNorm",
        gated_linear_unit=True, activation_func=F.silu, add_bias_linear=False, bf16=True,
        params_dtype=torch.bfloat16, pipeline_dtype=torch.bfloat16, hidden_dropout=0.0, attention_dropout=0.0,
        **sizes,
    )  # fmt: skip


def llama_reference(pre_process: bool, post_process: bool) -> GPTModel:
    config = TransformerConfig(
        **_dense_config(num_layers=6, num_query_groups=2, pipeline_model_parallel_size=4),
        num_layers_in_first_pipeline_stage=1,
        num_layers_in_last_pipeline_stage=1,
    )
    return GPTModel(
        config, get_gpt_layer_local_spec(normalization="RMSNorm"), vocab_size=256, max_sequence_length=32,
        pre_process=pre_process, post_process=post_process, share_embeddings_and_output_weights=False,
        position_embedding_type="rope", rotary_base=500000,
    )  # fmt: skip


def _without_core_attention(spec):
    """`spec` with megatron-core's local attention kernel (parameter-free) replaced by IdentityOp."""
    if spec is DotProductAttention:
        return IdentityOp
    if isinstance(spec, list):
        return [_without_core_attention(item) for item in spec]
    if dataclasses.is_dataclass(spec) and not isinstance(spec, type):
        return dataclasses.replace(
            spec, **{f.name: _without_core_attention(getattr(spec, f.name)) for f in dataclasses.fields(spec)}
        )
    return spec


def deepseek_reference(pre_process: bool, post_process: bool) -> GPTModel:
    config = MLATransformerConfig(
        **_dense_config(num_layers=3, pipeline_model_parallel_size=2, expert_model_parallel_size=2),
        num_layers_in_first_pipeline_stage=1, num_layers_in_last_pipeline_stage=2,
        multi_latent_attention=True, q_lora_rank=32, kv_lora_rank=16, qk_head_dim=16, qk_pos_emb_head_dim=8,
        v_head_dim=16, qk_layernorm=True, num_moe_experts=4, moe_layer_freq=[0, 1, 1], moe_ffn_hidden_size=32,
        moe_shared_expert_intermediate_size=32, moe_router_topk=2, moe_router_score_function="sigmoid",
        moe_router_enable_expert_bias=True, mtp_num_layers=1,
    )  # fmt: skip
    layer_specs = get_gpt_decoder_layer_specs(config, use_transformer_engine=False, normalization="RMSNorm")
    return GPTModel(
        config,
        _without_core_attention(get_gpt_decoder_block_spec(config, False, normalization="RMSNorm")),
        vocab_size=256, max_sequence_length=32, pre_process=pre_process, post_process=post_process,
        share_embeddings_and_output_weights=False, position_embedding_type="rope",
        mtp_block_spec=_without_core_attention(get_gpt_mtp_block_spec(config, layer_specs[-1], False)),
    )  # fmt: skip


def mixtral_reference(pre_process: bool, post_process: bool) -> GPTModel:
    config = TransformerConfig(
        **_dense_config(num_layers=4, num_query_groups=2, pipeline_model_parallel_size=2, expert_model_parallel_size=2),
        num_moe_experts=4, moe_ffn_hidden_size=32, moe_router_topk=2,
    )  # fmt: skip
    return GPTModel(
        config, get_gpt_decoder_block_spec(config, False, normalization="RMSNorm"), vocab_size=256,
        max_sequence_length=32, pre_process=pre_process, post_process=post_process,
        share_embeddings_and_output_weights=False, position_embedding_type="rope", rotary_base=1000000,
    )  # fmt: skip


# name -> (flags, reference builder, megatron-core sizes, virtual ranks of the first and last stage)
SHRINKS = {
    "llama3-405b": (llama_flags, llama_reference, dict(pipeline_model_parallel_size=4), (0, 7)),
    "deepseek-v3": (
        deepseek_flags, deepseek_reference, dict(pipeline_model_parallel_size=2, expert_model_parallel_size=2), (0, 7)
    ),
    "mixtral-8x22b": (
        mixtral_flags, mixtral_reference, dict(pipeline_model_parallel_size=2, expert_model_parallel_size=2), (0, 7)
    ),
}  # fmt: skip


@contextlib.contextmanager
def virtual_rank_of_8(virtual_rank: int, **sizes):
    """This process as `virtual_rank` of an 8-rank job in torch's fake process group (no communication),
    megatron-core's groups on top, and its CPU stand-ins for CUDA (device, RNG) while building."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=virtual_rank, world_size=8)
    try:
        with registry.patched(cpu_shim.MEGATRON_CORE_SHIMS):
            parallel_state.initialize_model_parallel(**sizes, create_gloo_process_groups=False)
            tensor_parallel.model_parallel_cuda_manual_seed(1234)
            yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def parameter_shapes(module: torch.nn.Module) -> dict[str, tuple[int, ...]]:
    return {name: tuple(p.shape) for name, p in module.named_parameters()}


@contextlib.contextmanager
def mla_without_transformer_engine():
    """megatron-core 0.16.1 believes TE is present when only its placeholder module is; say the truth."""
    original = megatron_mla.HAVE_TE
    megatron_mla.HAVE_TE = False
    try:
        yield
    finally:
        megatron_mla.HAVE_TE = original


def build_both(name: str, virtual_rank: int) -> tuple[list[torch.nn.Module], GPTModel]:
    """The entry's chunks and megatron-core's reference model for one rank of a shrink."""
    flags, reference, sizes, _ = SHRINKS[name]
    args = pretrain_args.parse(flags())
    with virtual_rank_of_8(virtual_rank, **sizes):
        chunks = model.build_chunks(args, model.transformer_config(args))
        pp_rank, pp_size = (
            parallel_state.get_pipeline_model_parallel_rank(),
            sizes["pipeline_model_parallel_size"],
        )
        with mla_without_transformer_engine():
            expected = reference(pre_process=pp_rank == 0, post_process=pp_rank == pp_size - 1)
    return chunks, expected


@pytest.mark.parametrize("virtual_rank", [0, 2, 7], ids=lambda rank: f"virtual-rank-{rank}")
@pytest.mark.parametrize("name", SHRINKS)
def test_the_entry_builds_the_parameters_megatron_core_builds_for_the_same_configuration(name, virtual_rank):
    chunks, expected = build_both(name, virtual_rank)
    assert len(chunks) == 1
    assert parameter_shapes(chunks[0]) == parameter_shapes(expected)
    assert all(p.dtype == torch.bfloat16 for p in chunks[0].parameters())


def test_llama_stages_hold_one_two_and_one_layers_with_rope_base_500000():
    layers = [len(build_both("llama3-405b", rank)[0][0].decoder.layers) for rank in (0, 2, 4, 7)]
    assert layers == [1, 2, 2, 1]
    chunk = build_both("llama3-405b", 0)[0][0]
    head_dim = 16
    expected = 1.0 / 500000 ** (torch.arange(0, head_dim, 2, dtype=torch.float32) / head_dim)
    torch.testing.assert_close(chunk.rotary_pos_emb.inv_freq.float(), expected)


def test_deepseek_layers_are_dense_then_moe_with_a_shared_expert_and_mtp_on_the_last_stage():
    first = build_both("deepseek-v3", 0)[0][0]
    last = build_both("deepseek-v3", 7)[0][0]
    assert type(first.decoder.layers[0].mlp).__name__ == "MLP"
    for layer in (*last.decoder.layers, last.mtp.layers[0].transformer_layer):
        assert type(layer.mlp).__name__ == "MoELayer" and layer.mlp.shared_experts is not None
        assert layer.mlp.router.expert_bias is not None
        assert type(layer.self_attention.core_attention).__name__ == "MLACoreAttention"
    assert not hasattr(first, "mtp")


@pytest.mark.parametrize("name", ["llama3-405b", "deepseek-v3"])
def test_the_entry_trains_a_step_as_the_first_and_the_last_stage(tmp_path, name):
    flags, _, _, stage_ranks = SHRINKS[name]
    for virtual_rank in stage_ranks:
        emulation = ("--prism-device", "cpu", "--prism-emulate", "--prism-ranks", str(virtual_rank))
        out = pretrain.run([*flags(), *emulation, "--prism-out", str(tmp_path / str(virtual_rank))])
        (step,) = out["iterations"]
        assert step["update_successful"] and math.isfinite(step["grad_norm"]) and step["grad_norm"] > 0
        last_stage = out["role"]["pp_rank"] == out["role"]["pp_size"] - 1
        assert (
            (step["loss"] is not None and math.isfinite(step["loss"])) if last_stage else step["loss"] is None
        )
        _, expected = build_both(name, virtual_rank)
        assert out["num_parameters"] == sum(p.numel() for p in expected.parameters())
