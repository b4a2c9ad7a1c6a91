"""The full-size plan of the shipped configurations: megatron-core accepts each job, every stage plans
on the meta device in seconds, and the numbers agree with independent counts."""

from __future__ import annotations

import json
import time
from pathlib import Path

import pytest

from prism_megatron import cli
from prism_megatron.megatron.job.configs import read_config
from prism_megatron.megatron.job.job import job_from_flags, transformer_config
from prism_megatron.megatron.plan import activations
from prism_megatron.megatron.plan.rank_plan import plan_ranks

REPO = Path(__file__).resolve().parents[2]
CONFIGS = sorted((REPO / "launch" / "configs").glob("*.args"))


def job(name: str, *extra: str):
    return job_from_flags(read_config(REPO / "launch" / "configs" / f"{name}.args") + list(extra))


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_every_configuration_is_accepted_by_megatron_core_with_no_unknown_flag(path):
    j = job_from_flags(read_config(path))
    config = transformer_config(j)  # megatron-core's own __post_init__ checks
    assert config.num_layers == j.args.num_layers
    layout = j.target.layout()
    assert layout.dp == j.args.data_parallel_size


@pytest.mark.parametrize("path", CONFIGS, ids=lambda p: p.stem)
def test_first_and_last_stage_of_every_configuration_plan_on_meta(path):
    j = job_from_flags(read_config(path))
    first, last = plan_ranks(j, [0, j.world_size - 1])
    assert first.chunks[0].has_embedding and last.chunks[-1].has_output_layer
    for plan in (first, last):
        assert plan.parameters.bytes > 0 and plan.gradients.bytes >= plan.parameters.bytes
        assert plan.optimizer_moments.bytes > 0 and plan.activations.bytes > 0


def test_llama3_405b_at_16384_gpus_plans_a_stage_in_seconds():
    j = job("llama3-405b-16384gpus")
    started = time.perf_counter()
    (plan,) = plan_ranks(j, [16383])
    assert time.perf_counter() - started < 120
    # Last stage: 7 layers and the output layer, TP8 shards, 128 data-parallel optimizer shards.
    h, f, v, heads_dim, kv_dim = 16384, 53248, 129024, 128 * 128, 8 * 128
    layer = h * (heads_dim + 2 * kv_dim) // 8 + heads_dim * h // 8 + 3 * h * f // 8 + 2 * h
    expected = 7 * layer + h + v * h // 8
    assert plan.num_params == expected
    assert plan.parameters.bytes == 2 * expected and plan.gradients.bytes == 4 * expected  # no padding here
    assert plan.optimizer_moments.bytes == 2 * 4 * expected // 128


def test_stage_parameter_counts_add_up_to_megatron_s_model_size():
    """Summed over one rank per stage (x TP, less replicated norms), the built model is Llama 3 405B:
    405.85B parameters by Megatron-LM's own count (attention, SwiGLU MLP, RMSNorms, untied embeddings)."""
    j = job("llama3-405b-8192gpus")
    stages = plan_ranks(j, [stage * 512 for stage in range(16)])
    tp, h, layers = 8, 16384, 126
    replicated = 2 * h * layers + h  # two RMSNorm weights per layer and the final norm, on every TP rank
    total = sum(p.num_params for p in stages) * tp - (tp - 1) * replicated
    attention = 2 * h * h * (1 + 8 / 128)
    megatron_count = layers * (attention + 3 * h * 53248 + 2 * h) + h + 2 * 129024 * h
    assert total == megatron_count
    assert [sum(c.num_dense_layers for c in p.chunks) for p in stages] == [7] + [8] * 14 + [7]


def test_one_build_per_stage_gives_each_rank_the_numbers_of_its_own_build():
    j = job("mixtral-8x22b-2048gpus")
    ranks = [0, 1, 17, 127, 2047 - 256]  # stage 0 at several DP/EP/TP positions, and stage 6
    together = plan_ranks(j, ranks)
    for plan in together:
        (alone,) = plan_ranks(j, [plan.virtual_rank])
        assert alone.built_as == plan.virtual_rank
        assert (alone.parameters, alone.gradients, alone.optimizer_main_params, alone.optimizer_moments) == (
            plan.parameters, plan.gradients, plan.optimizer_main_params, plan.optimizer_moments,
        )  # fmt: skip


def _gpt(*flags: str):
    base = ["--num-layers", "4", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "2048",
            "--vocab-size", "1000", "--micro-batch-size", "2", "--tensor-model-parallel-size", "8",
            "--prism-world-size", "8"]  # fmt: skip
    return job_from_flags(base + list(flags))


@pytest.mark.parametrize(
    ("flags", "per_layer"),
    [
        # Korthikanti et al. 2022, Table 2, per layer (s, b, h, a, t = 2048, 2, 1024, 16, 8).
        (
            ("--attention-backend", "unfused"),
            lambda s, b, h, a, t: s * b * h * (10 + 24 / t + 5 * a * s / (h * t)),
        ),
        (
            ("--sequence-parallel", "--attention-backend", "unfused"),
            lambda s, b, h, a, t: s * b * h / t * (34 + 5 * a * s / h),
        ),
        (("--recompute-activations",), lambda s, b, h, a, t: s * b * h * (10 + 24 / t)),
        (("--sequence-parallel", "--recompute-activations"), lambda s, b, h, a, t: s * b * h * 34 / t),
        (
            (
                "--recompute-granularity",
                "full",
                "--recompute-method",
                "uniform",
                "--recompute-num-layers",
                "1",
            ),
            lambda s, b, h, a, t: 2 * s * b * h,
        ),
        (
            (
                "--sequence-parallel",
                "--recompute-granularity",
                "full",
                "--recompute-method",
                "uniform",
                "--recompute-num-layers",
                "1",
            ),
            lambda s, b, h, a, t: 2 * s * b * h / t,
        ),
    ],
)
def test_activation_estimate_reproduces_korthikanti_table_2_for_gpt(flags, per_layer):
    j = _gpt(*flags)
    chunk = activations.ChunkShape(
        num_dense_layers=1, num_moe_layers=0, has_embedding=False, has_output_layer=False
    )
    assert activations.chunk_bytes(j, chunk) == int(per_layer(2048, 2, 1024, 16, 8))


def test_in_flight_microbatches_follow_megatron_s_schedules():
    j = job("llama3-70b-8192gpus")  # PP4, VPP4, 8 microbatches
    assert [activations.in_flight_microbatches(j, r) for r in range(4)] == [19, 17, 15, 13]
    j = job("gpt-462b-6144gpus")  # PP16, 1F1B, 64 microbatches
    assert [activations.in_flight_microbatches(j, r) for r in (0, 7, 15)] == [16, 9, 1]
    j = job("llama3-405b-8192gpus")  # PP16, VPP8, 32 microbatches: 2 (16 - r - 1) + 7 x 16 warm-up
    assert [activations.in_flight_microbatches(j, r) for r in (0, 7, 15)] == [143, 129, 113]


def test_plan_command_prints_each_category_and_writes_json(tmp_path, capsys):
    out = tmp_path / "plan.json"
    config = str(REPO / "launch" / "configs" / "gpt-1.7b-48gpus.args")
    assert cli.main(["plan", config, "--ranks", "0,47", "--json", str(out), "--micro-batch-size", "2"]) == 0
    text = capsys.readouterr().out
    for label in (
        "parameters",
        "gradients",
        "optimizer: moments",
        "activations (estimate)",
        "Megatron's estimate",
    ):
        assert label in text
    data = json.loads(out.read_text())
    assert [r["virtual_rank"] for r in data["ranks"]] == [0, 47]
    assert data["job"]["dp"] == 48 and "--micro-batch-size" in data["argv"]
    assert data["ranks"][0]["bytes"]["gradients"]["source"].startswith("DDP gradient buffer")


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (
            [
                "plan",
                "--num-layers",
                "2",
                "--hidden-size",
                "64",
                "--num-attention-heads",
                "4",
                "--seq-length",
                "32",
                "--vocab-size",
                "100",
                "--micro-batch-size",
                "1",
            ],
            "--prism-world-size is required",
        ),
        (["plan", "no-such-file.args"], "is not a file"),
        (
            [
                "plan",
                str(REPO / "launch" / "configs" / "gpt-1.7b-48gpus.args"),
                "--tensor-model-parallel-size",
                "5",
            ],
            "not divisible",
        ),
    ],
)
def test_plan_command_reports_mistakes_in_one_line(argv, message, capsys):
    assert cli.main(argv) == 2
    err = capsys.readouterr().err
    assert message in err and len(err.strip().splitlines()) == 1
