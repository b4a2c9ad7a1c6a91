"""A modelled GPU runs the real program at full size: a Llama 3 405B rank of a 16,384-GPU job on fake
tensors through the built-in entry (and Megatron-LM's pretrain_gpt.py where MEGATRON_LM_DIR is set, once
--script is supported on a modelled device), its memory the plan's, and `compare` of modelled runs.

The 405B rank is a middle pipeline stage (8 layers of 126, TP8 shards, a 1/128 optimizer shard, 16
microbatches): on an idle 2-core machine it takes about a minute of CPU, several minutes of wall time
on a loaded one.
"""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest
from launching import quiet_env, run_entry

from prism_megatron.megatron.job.configs import read_config
from prism_megatron.megatron.job.job import job_from_flags
from prism_megatron.megatron.plan.rank_plan import plan_ranks

REPO = Path(__file__).resolve().parents[2]
LLAMA_405B = read_config(REPO / "launch" / "configs" / "llama3-405b-16384gpus.args")
MIDDLE_RANK = 8 * 128 * 8 + 8 * 77 + 3  # pp 8, dp 77, tp 3 (Megatron's order: tp fastest, then dp, then pp)


@pytest.fixture(scope="module")
def llama_rank(tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp("llama-405b")
    flags = (*LLAMA_405B, "--train-iters", "2", "--prism-emulate", "--prism-device", "model:h100",
             "--prism-ranks", str(MIDDLE_RANK), "--prism-phase", "capture")  # fmt: skip
    (result,) = run_entry(out, 1, *flags, timeout_s=1200.0)
    with open(out / f"capture-{MIDDLE_RANK:05d}.json", encoding="utf-8") as f:
        capture = json.load(f)
    return {"result": result, "capture": capture}


def test_a_full_size_405b_rank_of_16384_runs_on_fake_tensors_and_is_timed_by_the_model(llama_rank):
    result = llama_rank["result"]
    assert result["virtual_rank"] == MIDDLE_RANK and result["world_size"] == 16384
    modelled = result["modelled_device"]
    assert modelled["gpu"] == "h100"
    first, second = modelled["iterations_by_kind_ns"]
    # The same program twice: the same GEMMs and attention, to the nanosecond.
    assert first["gemm"] == second["gemm"] > 0 and first["attention"] == second["attention"] > 0
    # 8 layers x 16 microbatches of a 405B layer on an H100: seconds of GEMM, as on the GPU.
    assert 1.0e9 < second["gemm"] < 10.0e9
    times = result["prism_phase"]["iteration_times_s"]
    assert len(times) == 2 and all(t > 1.0 for t in times)


def test_every_collective_and_transfer_keeps_its_full_size_bytes(llama_rank):
    events = [e for it in llama_rank["capture"]["iterations"][1:] for e in it["events"]]
    sizes = {e[4] for e in events}
    # Sequence-parallel all-gather / reduce-scatter of a microbatch: 8192 tokens x 16384 x bf16.
    assert 8192 * 16384 * 2 in sizes
    # Pipeline activations to the next stage: 8192 / TP8 tokens x 16384 x bf16.
    assert 8192 // 8 * 16384 * 2 in sizes


def test_the_modelled_rank_holds_the_plan_s_parameters_gradients_and_optimizer_state(llama_rank):
    (plan,) = plan_ranks(job_from_flags(LLAMA_405B), [MIDDLE_RANK])
    memory = llama_rank["result"]["memory"]["category_peak_bytes"]
    assert memory["parameters"] == plan.parameters.bytes
    assert memory["gradients"] == plan.gradients.bytes
    optimizer = plan.optimizer_main_params.bytes + plan.optimizer_moments.bytes
    # Adam's two step counters (one per parameter group) are the only state the plan leaves out.
    assert 0 <= memory["optimizer_state"] - optimizer <= 64


# --- whole runs: report, determinism, compare ----------------------------------------------------

SMALL = (
    "--num-layers", "4", "--hidden-size", "2048", "--num-attention-heads", "16", "--seq-length", "2048",
    "--max-position-embeddings", "2048", "--vocab-size", "32000", "--micro-batch-size", "1",
    "--global-batch-size", "256", "--bf16", "--use-distributed-optimizer", "--train-iters", "10",
    "--hidden-dropout", "0", "--attention-dropout", "0", "--position-embedding-type", "rope",
    "--prism-emulate", "--prism-world-size", "64", "--prism-device", "model:h100",
)  # fmt: skip


def emulate(out: Path, *extra: str) -> dict:
    command = [
        sys.executable,
        "-m",
        "prism_megatron.cli",
        "emulate",
        "--",
        *SMALL,
        *extra,
        "--prism-out",
        str(out),
    ]
    done = subprocess.run(command, env=quiet_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    assert "modelled on H100 by prism's GPU model" in done.stdout
    with open(out / "report.json", encoding="utf-8") as f:
        return json.load(f)


def compare(a: Path, b: Path) -> tuple[int, dict]:
    # A 1 % gate: without overlap the DP reduce-scatter of this 4-layer model adds about 3 % (its
    # exposed part grows from 3.4 to 4.9 ms of 43 ms), under the default 5 % threshold.
    command = [
        sys.executable,
        "-m",
        "prism_megatron.cli",
        "compare",
        str(a),
        str(b),
        "--json",
        "--max-regression",
        "1",
    ]
    done = subprocess.run(command, env=quiet_env(), capture_output=True, text=True, timeout=300)
    return done.returncode, json.loads(done.stdout)


@pytest.fixture(scope="module")
def runs(tmp_path_factory) -> dict[str, Path]:
    root = tmp_path_factory.mktemp("modelled-runs")
    paths = {"a": root / "a", "again": root / "again", "no_overlap": root / "no-overlap"}
    reports = {
        "a": emulate(paths["a"], "--overlap-grad-reduce"),
        "again": emulate(paths["again"], "--overlap-grad-reduce"),
        "no_overlap": emulate(paths["no_overlap"]),
    }
    return {"paths": paths, "reports": reports}


def test_a_modelled_run_reports_what_it_is(runs):
    report = runs["reports"]["a"]
    modelled = report["modelled"]
    assert report["status"] == "ok" and report["iteration_time_s"] is None  # nothing was measured
    assert modelled["method"] == "modelled on H100 by prism's GPU model"
    assert modelled["iteration_time_s"] == report["simulated_iteration_time_s"] > 0
    assert 0 < modelled["mfu"] < 1 and modelled["tflops_per_gpu"] > 0 and modelled["tokens_per_s_per_gpu"] > 0
    parts = modelled["time_by_kind_s"]
    assert set(parts) == {"gemm", "attention", "memory", "launch", "exposed_communication", "pipeline_bubble"}
    assert sum(parts.values()) == pytest.approx(modelled["iteration_time_s"], rel=1e-6)
    assert report["prism"]["cluster"]["cluster"] == "dgx-h100"


def test_two_modelled_runs_give_identical_numbers(runs):
    a, again = runs["reports"]["a"], runs["reports"]["again"]
    assert a["modelled"] == again["modelled"]
    assert a["roles"] == again["roles"]


def test_compare_judges_identical_runs_the_same_and_names_the_flag_that_regressed(runs):
    paths = runs["paths"]
    status, same = compare(paths["a"], paths["again"])
    assert status == 0, same
    status, judged = compare(paths["a"], paths["no_overlap"])
    assert status == 1, judged
    regressed = [m for m in judged["metrics"] if m["verdict"] == "regression"]
    assert any(m["key"] == "simulated" for m in regressed), regressed


# --- capture passes at the same time (a modelled GPU's) --------------------------------------------


def _run_with_passes_at_once(out: Path, at_once: int, monkeypatch) -> tuple[dict, dict[str, bytes]]:
    from prism_megatron.emulation import driver, plan_run
    from prism_megatron.emulation.progress import Progress

    monkeypatch.setattr(driver, "capture_at_once", lambda plan: at_once)
    for name, value in quiet_env().items():
        monkeypatch.setenv(name, value)
    plan = plan_run([*SMALL, "--pipeline-model-parallel-size", "2", "--prism-out", str(out)])
    outcome = driver.run(plan, Progress(quiet=True))
    assert outcome.ok, outcome.report.failure
    captures = {p.name: p.read_bytes() for p in sorted((out / "capture").glob("capture-*.json"))}
    with open(out / "report.json", encoding="utf-8") as f:
        return json.load(f), captures


def test_capture_passes_at_the_same_time_give_the_numbers_of_passes_one_after_the_other(
    tmp_path, monkeypatch
):
    one, one_captures = _run_with_passes_at_once(tmp_path / "one", 1, monkeypatch)
    both, both_captures = _run_with_passes_at_once(tmp_path / "both", 2, monkeypatch)
    assert one["capture"]["num_passes"] == both["capture"]["num_passes"] == 2  # PP2: two classes
    assert both["modelled"] == one["modelled"]
    assert both["simulated_iteration_time_s"] == one["simulated_iteration_time_s"]
    assert both["roles"] == one["roles"]
    assert both_captures == one_captures  # every captured op and time, byte for byte
