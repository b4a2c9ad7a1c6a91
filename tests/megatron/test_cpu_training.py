"""megatron-core trains on CPU under the CPU device shim, in real gloo processes (no emulation).

Each configuration runs the built-in entry (2 layers, hidden 64, sequence 32, dropout off) for two
iterations. What must hold is what holds on GPUs: every rank finishes with a finite grad norm, the
grad norm agrees across ranks, the last stage has a finite loss, and the data-parallel variants (plain
DDP, overlapped grad reduce, distributed optimizer) compute the same step as one process does.
"""

from __future__ import annotations

import math

import pytest
from launching import TINY_GPT, run_entry

CPU = ("--prism-device", "cpu", "--global-batch-size", "4")


def check_trained(results: list[dict], num_ranks: int) -> None:
    assert len(results) == num_ranks
    for rank in results:
        assert len(rank["iterations"]) == 2
        assert all(math.isfinite(it["grad_norm"]) and it["grad_norm"] > 0 for it in rank["iterations"])
        if rank["role"]["pp_rank"] == rank["role"]["pp_size"] - 1:
            assert all(math.isfinite(it["loss"]) for it in rank["iterations"])
        else:
            assert all(it["loss"] is None for it in rank["iterations"])
    norms = {tuple(round(it["grad_norm"], 6) for it in rank["iterations"]) for rank in results}
    assert len(norms) == 1, f"grad norms differ across ranks: {norms}"


def losses(results: list[dict]) -> list[float]:
    last = [r for r in results if r["role"]["pp_rank"] == r["role"]["pp_size"] - 1]
    return [it["loss"] for it in last[0]["iterations"]]


@pytest.fixture(scope="module")
def one_process(tmp_path_factory):
    return run_entry(tmp_path_factory.mktemp("one"), 1, *TINY_GPT, *CPU)


def test_one_process_trains_without_pipelining_and_reports_the_shims_it_used(one_process):
    check_trained(one_process, 1)
    used = one_process[0]["patches_used"]
    assert used["cpu.current_device"] > 0 and used["cpu.device_literals"] > 0
    assert used["cpu.tensor_type_names"] > 0
    assert used["cpu.moe_splits_to_numpy"] == 0  # listed, not used without MoE


def test_memory_is_reported_by_category(one_process):
    memory = one_process[0]["memory"]
    at_peak = memory["at_peak_bytes"]
    grad_bytes = sum(b["grad_bytes"] for b in one_process[0]["grad_buffers"])
    assert at_peak["gradients"] == grad_bytes
    assert at_peak["parameters"] == 4 * one_process[0]["num_parameters"]
    # Adam: two fp32 moments per element and a float32 step counter per parameter tensor.
    expected_optimizer_bytes = (
        2 * 4 * one_process[0]["num_parameters"] + 4 * one_process[0]["num_parameter_tensors"]
    )
    assert at_peak["optimizer_state"] == expected_optimizer_bytes
    assert at_peak["activations"] > 0
    assert memory["peak_bytes"] == sum(at_peak.values())


@pytest.mark.parametrize(
    "variant",
    [
        (),
        ("--overlap-grad-reduce",),
        ("--use-distributed-optimizer", "--overlap-grad-reduce", "--overlap-param-gather"),
    ],
    ids=["ddp", "ddp-overlap", "distopt-overlap"],
)
def test_data_parallel_variants_compute_the_one_process_step(tmp_path, one_process, variant):
    results = run_entry(tmp_path, 2, *TINY_GPT, *CPU, *variant)
    check_trained(results, 2)
    assert losses(results) == pytest.approx(losses(one_process), rel=1e-5)
    one_norms = [it["grad_norm"] for it in one_process[0]["iterations"]]
    assert [it["grad_norm"] for it in results[0]["iterations"]] == pytest.approx(one_norms, rel=1e-5)


def test_distributed_optimizer_shards_the_optimizer_over_data_parallel_ranks(tmp_path, one_process):
    results = run_entry(tmp_path, 2, *TINY_GPT, *CPU, "--use-distributed-optimizer")
    shards = [r["optimizer_shard_numel"] for r in results]
    buffer_numel = sum(b["numel"] for b in results[0]["grad_buffers"])
    assert sum(shards) == buffer_numel and shards[0] == shards[1]
    assert one_process[0]["optimizer_shard_numel"] == one_process[0]["num_parameters"]


def test_pipeline_1f1b_over_two_stages(tmp_path):
    check_trained(run_entry(tmp_path, 2, *TINY_GPT, *CPU, "--pipeline-model-parallel-size", "2"), 2)


def test_pipeline_interleaved_over_two_stages_with_overlapped_p2p(tmp_path):
    flags = ("--pipeline-model-parallel-size", "2", "--num-layers-per-virtual-pipeline-stage", "1")
    results = run_entry(tmp_path, 2, *TINY_GPT, *CPU, "--num-layers", "4", *flags)
    check_trained(results, 2)
    assert results[0]["patches_used"]["cpu.pin_p2p_send_buffers"] > 0


def test_moe_with_expert_parallelism_and_alltoall_dispatch(tmp_path):
    moe = (
        "--num-experts",
        "4",
        "--expert-model-parallel-size",
        "2",
        "--moe-token-dispatcher-type",
        "alltoall",
    )
    results = run_entry(tmp_path, 2, *TINY_GPT, *CPU, *moe)
    check_trained(results, 2)
    assert results[0]["patches_used"]["cpu.moe_splits_to_numpy"] > 0
    # Routed by the data: the balanced routing of a modelled GPU (patches/modelled_moe.py) is not applied.
    assert not [name for name in results[0]["patches_used"] if name.startswith("modelled.")]
    assert any(b["kind"] == "expert" for b in results[0]["grad_buffers"])


def test_tensor_and_pipeline_parallel_in_four_processes(tmp_path):
    flags = ("--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2")
    check_trained(run_entry(tmp_path, 4, *TINY_GPT, *CPU, *flags), 4)
