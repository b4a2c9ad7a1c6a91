"""Megatron-LM's own argument checks and formulas, held against the plan (needs MEGATRON_LM_DIR).

Megatron-LM is not a dependency; with a checkout of tag core_v0.16.1 in MEGATRON_LM_DIR, these tests
load its `megatron/training/arguments.py` and `theoretical_memory_usage.py` (beside the installed
megatron-core, without the training package's heavy `__init__`) and check, for every shipped
configuration at full size, that:
* Megatron-LM's parser accepts every flag and its `validate_args` accepts the job;
* its derived arguments equal the plan's (`job_from_flags`);
* its `core_transformer_config_from_args` builds the same TransformerConfig as the plan;
* its theoretical memory estimate equals the plan's restatement of it (`megatron.plan.theory`).
"""

from __future__ import annotations

import argparse
import copy
import dataclasses
import os
import sys
import types
from pathlib import Path

import pytest

from prism_megatron.megatron.job.configs import read_config
from prism_megatron.megatron.job.job import job_from_flags, transformer_config
from prism_megatron.megatron.plan import theory

pytestmark = pytest.mark.megatron_lm

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "launch" / "configs").glob("*.args"))
MEGATRON_LM_DIR = os.environ.get("MEGATRON_LM_DIR")


@pytest.fixture(scope="module")
def megatron_lm():
    """Megatron-LM's arguments and theoretical-memory modules, imported from the checkout.

    `megatron.training`'s `__init__` imports the whole training loop (triton, tokenizers ...); a bare
    package object with the checkout's path stands in for it, and `megatron.training.utils` (which
    imports that `__init__`) is replaced by the five helpers arguments.py takes from it.
    """
    training = Path(MEGATRON_LM_DIR or "", "megatron", "training")
    if not (training / "arguments.py").is_file():
        pytest.skip("set MEGATRON_LM_DIR to a Megatron-LM checkout (tag core_v0.16.1)")
    import megatron

    saved = {name: module for name, module in sys.modules.items() if name.startswith("megatron.training")}
    package = types.ModuleType("megatron.training")
    package.__path__ = [str(training)]
    utils = types.ModuleType("megatron.training.utils")
    utils.get_device_arch_version = lambda: 9  # an H100, as the configurations assume
    utils.update_use_dist_ckpt = lambda args: setattr(args, "use_dist_ckpt", args.ckpt_format != "torch")
    utils.print_rank_0 = utils.warn_rank_0 = lambda *args, **kwargs: None
    utils.is_rank0 = lambda: False
    sys.modules.update({"megatron.training": package, "megatron.training.utils": utils})
    megatron.training = package
    try:
        import megatron.training.arguments as arguments
        import megatron.training.theoretical_memory_usage as theory

        yield types.SimpleNamespace(arguments=arguments, theory=theory)
    finally:
        for name in [n for n in sys.modules if n.startswith("megatron.training")]:
            del sys.modules[name]
        sys.modules.update(saved)
        del megatron.training


def megatron_lm_args(megatron_lm, argv: list[str], monkeypatch) -> argparse.Namespace:
    """Megatron-LM's `args` for a configuration: its parser, then `validate_args` at the job's size."""
    monkeypatch.setenv("CUDA_DEVICE_MAX_CONNECTIONS", "1")
    monkeypatch.setattr("torch.cuda.get_device_capability", lambda *args: (9, 0))  # grouped-GEMM check
    world_size = int(argv[argv.index("--prism-world-size") + 1])
    flags = [
        w for i, w in enumerate(argv) if w != "--prism-world-size" and argv[i - 1] != "--prism-world-size"
    ]
    parser = argparse.ArgumentParser(allow_abbrev=False)
    parser = megatron_lm.arguments.add_megatron_arguments(parser)
    args = parser.parse_args(flags)
    args.rank, args.world_size = 0, world_size
    megatron_lm.arguments.validate_args(args)
    return args


DERIVED = (
    "data_parallel_size", "ffn_hidden_size", "kv_channels", "virtual_pipeline_model_parallel_size",
    "global_batch_size", "accumulate_allreduce_grads_in_fp32", "sequence_parallel", "params_dtype",
    "expert_tensor_parallel_size", "recompute_granularity", "moe_ffn_hidden_size", "max_position_embeddings",
)  # fmt: skip


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_megatron_lm_accepts_each_configuration_and_derives_what_the_plan_derives(
    path, megatron_lm, monkeypatch
):
    argv = read_config(path)
    args = megatron_lm_args(megatron_lm, argv, monkeypatch)
    job = job_from_flags(argv)
    for name in DERIVED:
        assert getattr(job.args, name) == getattr(args, name), name


# Callables compare by identity; kernel fusions (Megatron-LM switches them on by default, the plan
# leaves megatron-core's defaults) and the inference sampling seed change no tensor a rank holds.
NOT_COMPARED = {
    "init_method", "output_layer_init_method", "embedding_init_method", "activation_func", "config_logger_dir",
    "gradient_accumulation_fusion", "bias_activation_fusion", "bias_dropout_fusion", "masked_softmax_fusion",
    "apply_rope_fusion", "attention_softmax_in_fp32", "persist_layer_norm", "inference_sampling_seed",
}  # fmt: skip


def _comparable(config) -> dict:
    return {f.name: getattr(config, f.name) for f in dataclasses.fields(config) if f.name not in NOT_COMPARED}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_the_plan_builds_megatron_lm_s_transformer_config(path, megatron_lm, monkeypatch):
    argv = read_config(path)
    args = megatron_lm_args(megatron_lm, argv, monkeypatch)
    args.apply_rope_fusion = False  # megatron-core refuses it without Transformer Engine
    theirs = _comparable(megatron_lm.arguments.core_transformer_config_from_args(args))
    ours = _comparable(transformer_config(job_from_flags(argv)))
    different = {k: (ours.get(k), v) for k, v in theirs.items() if ours.get(k) != v}
    assert different == {}


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_plan_restates_megatron_lm_s_theoretical_memory(path, megatron_lm, monkeypatch):
    argv = read_config(path)
    job = job_from_flags(argv)
    args = megatron_lm_args(megatron_lm, argv, monkeypatch)
    args.padded_vocab_size = job.args.padded_vocab_size
    ours = theory.estimate(job, 0)
    weights = megatron_lm.theory.compute_weight_and_optimizer_memory(copy.deepcopy(args))
    if args.sequence_parallel and args.recompute_granularity == "selective":
        activations = megatron_lm.theory.compute_activation_memory(
            copy.deepcopy(args), job.args.num_microbatches
        )
    else:
        activations = megatron_lm.theory.compute_activation_memory_without_sp(
            copy.deepcopy(args), job.args.num_microbatches
        )
    assert ours.weight_and_optimizer_bytes == int(weights)
    assert ours.activation_bytes == int(activations)
