"""The GPU script's two megatron-core stages, run end to end on the CPU (`--device cpu`).

On a lent GPU, run.sh runs them on cuda; here the same flow (real processes, `prism-megatron
emulate`, the run folder's files, the stage's JSON and Markdown) runs on the CPU, each stage as
run.sh starts it (`python -m benchmarks.gpu.<stage>` in the repository), so that a mistake in it is
found before the GPU time is spent.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]


def run_stage(module: str, *args: str, timeout_s: float = 600) -> subprocess.CompletedProcess:
    command = [sys.executable, *(["-m", module] if module else []), *args]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    return subprocess.run(command, cwd=REPO, env=env, capture_output=True, text=True, timeout=timeout_s)


def passed(done: subprocess.CompletedProcess) -> bool:
    if done.returncode != 0:
        print(done.stdout[-3000:], done.stderr[-6000:], sep="\n")
    return done.returncode == 0


def read_json(path: Path) -> dict:
    with open(path) as f:
        return json.load(f)


@pytest.mark.slow  # 5 megatron-core processes and 2 capture passes: about a minute
def test_memory_ground_truth_on_cpu_matches_the_real_rank_to_the_byte(tmp_path):
    assert passed(run_stage("benchmarks.gpu.memory_ground_truth", "--device", "cpu", "--out", str(tmp_path)))

    result = read_json(tmp_path / "memory_ground_truth.json")
    assert result["memory_method"] == {"real": "live-storage", "emulated": "live-storage"}
    assert result["real_peak_bytes"] > 0
    assert result["memory_diff_bytes"] == 0
    assert result["emulated_peak_bytes"] == result["real_peak_bytes"] == result["report_peak_bytes"]
    assert (
        result["emulated_requested_peak_bytes"]
        == result["real_requested_peak_bytes"]
        == result["real_peak_bytes"]
    )
    assert result["peak_difference"] is None  # no allocator history on the CPU
    assert result["real_iteration_s"] > 0 and result["emulated_iteration_s"] > 0
    assert result["simulated_iteration_time_s"] > 0
    assert "Difference 0 B (**exact**)" in (tmp_path / "memory_ground_truth.md").read_text()


@pytest.mark.slow  # 4 capture passes and the emulation at W = 8192: about a minute
def test_tiny_llama_rank_on_cpu_reports_time_and_peak_memory(tmp_path):
    args = ("--device", "cpu", "--tiny", "--out", str(tmp_path))
    assert passed(run_stage("benchmarks.gpu.emulated_llama_rank", *args))

    result = read_json(tmp_path / "emulated_llama_rank.json")
    assert result["world_size"] == 8192
    assert result["layout"] == {"tp": 1, "pp": 4, "dp": 2048}
    assert result["real_rank"] == 0 and result["role"].startswith("pp0")
    assert result["iteration_s"] > 0
    assert result["simulated_iteration_time_s"] > 0
    assert result["peak_bytes"] > 0
    assert result["memory_method"] == "live-storage"
    assert "--group-query-attention" in result["job_flags"]
    assert (tmp_path / "emulated_llama_rank.md").read_text().startswith("## One emulated rank")


def test_the_full_size_job_has_the_llama_3_8b_shape():
    code = (
        "import json; from benchmarks.gpu import emulated_llama_rank as m; "
        "print(json.dumps(m.job_flags(m.LLAMA3_8B, train_iters=4)))"
    )
    done = run_stage("", "-c", code, timeout_s=120)
    assert passed(done)
    flags = json.loads(done.stdout.strip().splitlines()[-1])
    value = {flag: flags[i + 1] for i, flag in enumerate(flags[:-1]) if flag.startswith("--")}
    assert value["--num-layers"] == "32" and value["--hidden-size"] == "4096"
    assert value["--ffn-hidden-size"] == "14336" and value["--num-query-groups"] == "8"
    assert value["--num-attention-heads"] == "32"
    assert value["--seq-length"] == "8192" and value["--vocab-size"] == "128256"
    assert value["--rotary-base"] == "500000" and value["--normalization"] == "RMSNorm"
    assert value["--pipeline-model-parallel-size"] == "4"
    assert value["--global-batch-size"] == str(2 * 8192 // 4)  # 2 micro-batches of 1 per replica
    assert {"--swiglu", "--bf16", "--untie-embeddings-and-output-weights"} <= set(flags)


def test_too_few_iterations_for_a_median_after_warm_up_is_refused_in_one_line(tmp_path):
    args = ("--device", "cpu", "--tiny", "--train-iters", "1", "--out", str(tmp_path))
    done = run_stage("benchmarks.gpu.emulated_llama_rank", *args, timeout_s=120)
    assert done.returncode == 2
    assert done.stderr.strip().splitlines()[-1] == (
        "emulated_llama_rank: error: --train-iters must exceed the 1 warm-up iteration(s), got 1"
    )
    assert not (tmp_path / "emulated_llama_rank.json").exists()


@pytest.mark.slow  # one megatron-core process under torch.profiler: about half a minute
def test_kernel_profile_on_cpu_records_each_op_call_with_its_shapes_dtypes_and_strides(tmp_path):
    """On the CPU the ops' CPU time stands in for their kernels'; the records are what against_gpu reads."""
    from benchmarks.gpu import kernel_profile

    result = kernel_profile.measure(str(tmp_path), device="cpu", tiny=True)
    calls = result["aten_op_calls"]
    assert calls and all(call["name"].startswith("aten::") and call["count"] > 0 for call in calls)
    assert [call["device_us"] for call in calls] == sorted(
        (call["device_us"] for call in calls), reverse=True
    )
    softmax = next(call for call in calls if call["name"] == "aten::_softmax")
    (scores,) = softmax["inputs"]
    assert len(scores["shape"]) == 4 and scores["dtype"] == "float"
    assert scores["stride"][-1] == 1 and len(scores["stride"]) == 4
