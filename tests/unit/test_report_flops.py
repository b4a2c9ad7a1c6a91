"""Model FLOPs per iteration: Megatron-LM's formula, checked against its closed forms."""

import argparse

import pytest

from prism_megatron.megatron.job import target
from prism_megatron.report import ModelShape, model_flops_per_iteration, tflops_per_gpu
from prism_megatron.target import padded_vocab_size

GPT3 = {
    "num_layers": 96,
    "hidden_size": 12288,
    "num_attention_heads": 96,
    "seq_length": 2048,
    "padded_vocab_size": 51200,
}
B = 1536


def test_a_dense_multi_head_model_is_narayanan_eq3_without_recomputation_and_causal_attention_halved():
    layers, h, s, vocab = (
        GPT3["num_layers"],
        GPT3["hidden_size"],
        GPT3["seq_length"],
        GPT3["padded_vocab_size"],
    )
    expected = 72 * B * s * layers * h**2 * (1 + s / (12 * h) + vocab / (12 * layers * h))
    assert model_flops_per_iteration(ModelShape(**GPT3), B) == pytest.approx(expected, rel=1e-12)


def test_the_whole_score_count_is_megatron_lm_s_formula_of_2024():
    """Megatron-LM's num_floating_point_operations at f2e5db402c (2024-07-15), the commit of the
    README's H100 table, written out: 12 B s L h^2 ((1 + g/a + s/h) q/h + f/h * topk * gated + V/(2 L h))."""
    shape = dict(GPT3, num_query_groups=8, ffn_hidden_size=3 * 12288, swiglu=True)
    layers, h, s, vocab = (
        GPT3["num_layers"],
        GPT3["hidden_size"],
        GPT3["seq_length"],
        GPT3["padded_vocab_size"],
    )
    heads, groups, ffn = GPT3["num_attention_heads"], 8, 3 * 12288
    megatron_2024 = (
        12 * B * s * layers * h * h
        * ((1 + groups / heads + s / h) + ffn / h * 3 / 2 + vocab / (2 * layers * h))
    )  # fmt: skip
    whole = model_flops_per_iteration(ModelShape(**shape), B, causal=False)
    assert whole == pytest.approx(megatron_2024, rel=1e-12)
    halved = model_flops_per_iteration(ModelShape(**shape), B)
    assert whole - halved == pytest.approx(6 * B * s * layers * h * s, rel=1e-12)


def test_grouped_query_attention_projects_fewer_keys_and_values():
    mha = model_flops_per_iteration(ModelShape(**GPT3), B)
    gqa = model_flops_per_iteration(ModelShape(**GPT3, num_query_groups=8), B)
    kv_channels = GPT3["hidden_size"] // GPT3["num_attention_heads"]
    saved_per_layer = 6 * B * GPT3["seq_length"] * GPT3["hidden_size"] * 2 * (96 - 8) * kv_channels
    assert mha - gqa == pytest.approx(GPT3["num_layers"] * saved_per_layer, rel=1e-12)


def test_swiglu_makes_the_mlp_half_as_large_again():
    plain = model_flops_per_iteration(ModelShape(**GPT3, ffn_hidden_size=4 * 12288), B)
    swiglu = model_flops_per_iteration(ModelShape(**GPT3, ffn_hidden_size=4 * 12288, swiglu=True), B)
    mlp_plain = 6 * B * 2048 * 12288 * 2 * 4 * 12288 * 96
    assert swiglu - plain == pytest.approx(mlp_plain / 2, rel=1e-12)


def test_moe_layers_count_the_experts_each_token_is_routed_to():
    dense = ModelShape(**GPT3)
    moe = ModelShape(**GPT3, num_experts=64, moe_router_topk=2, moe_ffn_hidden_size=2048, moe_layer_freq=2)
    assert moe.num_moe_layers() == 48

    def mlp_layer(ffn):
        return 6 * B * 2048 * 12288 * 2 * ffn

    expected = model_flops_per_iteration(dense, B) - 48 * mlp_layer(4 * 12288) + 48 * mlp_layer(2 * 2048)
    assert model_flops_per_iteration(moe, B) == pytest.approx(expected, rel=1e-12)
    pattern = ModelShape(**GPT3, num_experts=64, moe_layer_freq=[1, 0] * 48)
    assert pattern.num_moe_layers() == 48


def test_throughput_per_gpu_divides_by_time_and_world_size():
    assert tflops_per_gpu(8e15, 2.0, 1000) == pytest.approx(4.0)
    with pytest.raises(ValueError, match="positive iteration time"):
        tflops_per_gpu(1e15, 0.0, 8)


def test_the_shape_is_the_target_jobs_as_megatron_flags_give_it():
    parser = argparse.ArgumentParser()
    target.add_job_arguments(parser)
    flags = ["--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
             "--vocab-size", "1000", "--group-query-attention", "--num-query-groups", "2", "--swiglu"]  # fmt: skip
    shape = target.derive(parser.parse_args(flags)).model
    assert (shape.num_query_groups, shape.swiglu, shape.padded_vocab_size) == (2, True, 1024)
    assert padded_vocab_size(50257, tp=8) == 51200
    assert padded_vocab_size(50257, tp=8, null_tokenizer=True, padded=50304) == 50304


def test_a_shape_without_a_size_the_formula_needs_is_refused_naming_the_flag():
    with pytest.raises(ValueError, match="the model FLOPs need --padded-vocab-size"):
        model_flops_per_iteration(ModelShape(**{**GPT3, "padded_vocab_size": None}), B)


def test_impossible_shapes_are_refused():
    with pytest.raises(ValueError, match="model sizes must be positive: --hidden-size 0"):
        ModelShape(**{**GPT3, "hidden_size": 0})
    with pytest.raises(ValueError, match="--moe-layer-freq pattern has 3 entries"):
        ModelShape(**GPT3, num_experts=8, moe_layer_freq=[1, 0, 1])
