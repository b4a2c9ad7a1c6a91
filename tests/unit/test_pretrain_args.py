"""The built-in entry's flags derive what Megatron-LM's `validate_args` derives, and refuse what
megatron-core would refuse with a sentence that names the flag."""

from __future__ import annotations

import re

import pytest

from prism_megatron.megatron.entry import arguments as pretrain_args

BASE = (
    "--num-layers", "8", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
    "--micro-batch-size", "1", "--train-iters", "1",
)  # fmt: skip


def parse(*flags: str):
    return pretrain_args.parse([*BASE, *flags])


def test_megatron_lm_defaults_are_derived_from_the_flags():
    args = parse("--swiglu", "--num-experts", "4")
    assert args.kv_channels == 16 and args.max_position_embeddings == 32
    assert args.ffn_hidden_size == 128  # int(64 * 4 * 2/3 / 64) * 64
    assert args.moe_ffn_hidden_size == 128
    assert (args.rotary_base, args.kv_lora_rank, args.qk_head_dim, args.v_head_dim) == (10000, 32, 128, 128)
    assert args.moe_layer_freq == 1 and args.mtp_num_layers is None


def test_sequence_parallelism_is_dropped_without_tensor_parallelism_as_megatron_lm_does():
    assert not parse("--sequence-parallel").sequence_parallel
    assert parse("--sequence-parallel", "--tensor-model-parallel-size", "2").sequence_parallel


def test_pipeline_stages_align_their_param_gathers_by_default_as_megatron_lm_does():
    # Megatron-LM core_v0.16.1 arguments.py: `--no-align-param-gather` (store_false, so on by default),
    # turned off without the interleaved schedule; Megatron-LM has no `--align-param-gather`.
    interleaved = ("--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "2")
    assert parse(*interleaved).align_param_gather
    assert not parse(*interleaved, "--no-align-param-gather").align_param_gather
    assert not parse("--pipeline-model-parallel-size", "2").align_param_gather
    assert parse(*interleaved).align_grad_reduce
    assert not parse(*interleaved, "--no-align-grad-reduce").align_grad_reduce
    with pytest.raises(ValueError, match="--align-param-gather"):
        parse(*interleaved, "--align-param-gather")


def test_uneven_first_and_last_stages_lift_the_divisibility_of_the_layer_count():
    args = parse("--num-layers", "126", "--pipeline-model-parallel-size", "16",
                 "--decoder-first-pipeline-num-layers", "7", "--decoder-last-pipeline-num-layers", "7")  # fmt: skip
    assert args.virtual_pipeline_model_parallel_size is None
    parse("--num-layers", "61", "--pipeline-model-parallel-size", "16",
          "--decoder-first-pipeline-num-layers", "4", "--decoder-last-pipeline-num-layers", "1")  # fmt: skip
    with pytest.raises(
        ValueError, match="--num-layers 126 must be divisible by --pipeline-model-parallel-size 16"
    ):
        parse("--num-layers", "126", "--pipeline-model-parallel-size", "16")


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--num-layers", "10", "--pipeline-model-parallel-size", "4", "--decoder-first-pipeline-num-layers", "1",
          "--decoder-last-pipeline-num-layers", "2"), "leaves 7 layers for 2 middle stages"),
        (("--num-layers", "3", "--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "1",
          "--decoder-last-pipeline-num-layers", "1"), "leaves 1 layers for 0 middle stages"),
        (("--num-layers", "2", "--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "1",
          "--decoder-last-pipeline-num-layers", "1", "--virtual-pipeline-model-parallel-size", "2"),
         "--decoder-first-pipeline-num-layers 1 must be a positive multiple of the 2 model chunks"),
        (("--pipeline-model-parallel-size", "2", "--decoder-first-pipeline-num-layers", "4",
          "--num-layers-per-virtual-pipeline-stage", "2"), "cannot be combined with --decoder-first/last"),
    ],
    ids=["middle-stages-uneven", "layers-but-no-middle-stage", "not-whole-chunks", "layers-per-virtual-stage"],
)  # fmt: skip
def test_uneven_stages_megatron_core_would_refuse_are_refused_naming_the_flags(flags, message):
    with pytest.raises(ValueError, match=message):
        parse(*flags)


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--multi-latent-attention", "--group-query-attention"), "--multi-latent-attention and --group-query"),
        (("--mtp-num-layers", "1"), "--mtp-num-layers needs --position-embedding-type rope"),
        (("--expert-model-parallel-size", "2"), "--expert-model-parallel-size 2 needs --num-experts"),
        (("--num-experts", "6", "--expert-model-parallel-size", "4"), "--num-experts 6 must be divisible"),
        (("--num-experts", "4", "--tensor-model-parallel-size", "2"), "needs --sequence-parallel"),
    ],
    ids=["mla-with-gqa", "mtp-without-rope", "ep-without-experts", "experts-over-ep", "moe-tp-without-sp"],
)  # fmt: skip
def test_combinations_megatron_refuses_are_refused_naming_the_flag(flags, message):
    with pytest.raises(ValueError, match=message):
        parse(*flags)


def test_a_value_outside_megatron_lms_choices_is_refused_with_the_choices():
    # One line, raised (the launcher prints it with exit status 2), not the parser's whole usage.
    with pytest.raises(
        ValueError, match=re.escape("argument --moe-router-score-function: invalid choice: 'top1'")
    ):
        parse("--moe-router-score-function", "top1")


def test_sequence_and_context_parallelism_are_not_refused_by_the_local_layers():
    args = parse("--context-parallel-size", "2", "--sequence-parallel", "--tensor-model-parallel-size", "2")
    pretrain_args.check_local_spec(args)
    assert args.cp_comm_type == ["p2p"] and args.hierarchical_context_parallel_sizes is None


@pytest.mark.parametrize(
    ("flags", "message"),
    [
        (("--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p"),
         r"--cp-comm-type a2a\+p2p needs --hierarchical-context-parallel-sizes"),
        (("--context-parallel-size", "4", "--hierarchical-context-parallel-sizes", "2", "3"),
         "--hierarchical-context-parallel-sizes 2 3 must multiply to --context-parallel-size 4"),
        (("--cp-comm-type", "p2p", "a2a"), r"--cp-comm-type takes one type or one per layer \(8\), got 2"),
    ],
    ids=["a2a+p2p-without-levels", "levels-not-cp", "types-not-per-layer"],
)  # fmt: skip
def test_context_parallel_communication_megatron_lm_refuses_is_refused_naming_the_flag(flags, message):
    with pytest.raises(ValueError, match=message):
        parse(*flags)


def test_hierarchical_context_parallelism_without_einops_is_refused_in_one_line(monkeypatch):
    args = parse("--context-parallel-size", "4", "--cp-comm-type", "a2a+p2p",
                 "--hierarchical-context-parallel-sizes", "2", "2")  # fmt: skip
    monkeypatch.setattr(pretrain_args.importlib.util, "find_spec", lambda name: None)
    with pytest.raises(ValueError, match="needs the einops package"):
        pretrain_args.check_local_spec(args)


def test_an_unknown_flag_is_named_and_points_at_megatron_lms_script():
    with pytest.raises(
        ValueError, match=re.escape("does not support --no-such-flag; run Megatron-LM's pretrain_gpt.py")
    ):
        parse("--no-such-flag")
