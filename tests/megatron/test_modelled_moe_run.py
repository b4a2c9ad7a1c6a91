"""An MoE GPT runs on a modelled GPU: routing balanced (`patches/modelled_moe.py`), the expert GEMMs
charged with the balanced token count, the expert-parallel all-to-all with the bytes balanced routing
sends, the report's modelled section as for a dense model; through both dispatchers megatron-core
runs without Transformer Engine.

The job: 2 MoE layers of 8 experts (top-2, SwiGLU), TP2 with sequence parallelism, EP2 (expert TP =
TP), 16 GPUs, sequence 512. A rank routes 512 / TP2 = 256 tokens; its tp_ep group of 4 routes 4 x 256
x 2 = 2048 token-expert pairs, 256 to each expert, so each of a rank's 4 local experts multiplies 256
tokens. About 25 s of CPU per run on an idle machine.
"""

from __future__ import annotations

import json
import subprocess
import sys

import pytest
from launching import quiet_env

HIDDEN, FFN, SEQ, LAYERS = 256, 640, 512, 2  # no two GEMM operands of one shape
TP, EP, EXPERTS, TOPK = 2, 2, 8, 2
DP = 16 // TP
MICROBATCHES = 16 // DP  # global batch 16, micro batch 1
CAPTURED_ITERATIONS = 2  # emulation.driver.MODELLED_CAPTURE_ITERS

MOE_GPT = (
    "--num-layers", str(LAYERS), "--hidden-size", str(HIDDEN), "--ffn-hidden-size", str(FFN),
    "--num-attention-heads", "4", "--seq-length", str(SEQ), "--max-position-embeddings", str(SEQ),
    "--vocab-size", "1024", "--micro-batch-size", "1", "--global-batch-size", "16", "--bf16",
    "--swiglu", "--disable-bias-linear", "--hidden-dropout", "0", "--attention-dropout", "0",
    "--position-embedding-type", "rope", "--use-distributed-optimizer", "--train-iters", "3",
    "--num-experts", str(EXPERTS), "--moe-router-topk", str(TOPK), "--moe-grouped-gemm",
    "--expert-model-parallel-size", str(EP), "--tensor-model-parallel-size", str(TP), "--sequence-parallel",
    "--prism-emulate", "--prism-world-size", "16", "--prism-device", "model:h100",
)  # fmt: skip

TOKENS_PER_RANK = SEQ // TP
TOKENS_PER_LOCAL_EXPERT = TOKENS_PER_RANK * TP * EP * TOPK // EXPERTS
ALL_TO_ALL = 4  # replay.schedule.OpKind.ALL_TO_ALL


@pytest.fixture(scope="module", params=["alltoall", "allgather"])
def moe_run(request, tmp_path_factory) -> dict:
    out = tmp_path_factory.mktemp(f"moe-{request.param}")
    command = [sys.executable, "-m", "prism_megatron.cli", "emulate", "--", *MOE_GPT,
               "--moe-token-dispatcher-type", request.param, "--prism-out", str(out / "run")]  # fmt: skip
    done = subprocess.run(command, env=quiet_env(), capture_output=True, text=True, timeout=900)
    assert done.returncode == 0, done.stdout[-3000:] + done.stderr[-3000:]
    run = out / "run"
    loaded = {
        "dispatcher": request.param,
        "stdout": done.stdout,
        "report_md": (run / "report.md").read_text(),
    }
    for key, path in (("report", run / "report.json"), ("rank", run / "capture" / "rank-00000.json"),
                      ("capture", run / "capture" / "capture-00000.json")):  # fmt: skip
        with open(path, encoding="utf-8") as f:
            loaded[key] = json.load(f)
    return loaded


def test_an_moe_model_runs_on_a_modelled_gpu_and_reports_what_it_is(moe_run):
    report = moe_run["report"]
    assert report["status"] == "ok" and "modelled on H100 by prism's GPU model" in moe_run["stdout"]
    modelled = report["modelled"]
    assert modelled["iteration_time_s"] == report["simulated_iteration_time_s"] > 0
    assert modelled["moe_routing"] == "balanced" and "MoE routing is **balanced**" in moe_run["report_md"]
    assert modelled["tflops_per_gpu"] > 0 and 0 < modelled["mfu"] < 1
    assert sum(modelled["time_by_kind_s"].values()) == pytest.approx(modelled["iteration_time_s"], rel=1e-6)
    used = moe_run["rank"]["patches_used"]
    assert used[f"modelled.moe_{moe_run['dispatcher']}_counts"] == LAYERS * MICROBATCHES * CAPTURED_ITERATIONS


def test_each_local_expert_s_gemms_are_charged_with_the_balanced_token_count(moe_run):
    gemms = moe_run["rank"]["modelled_device"]["gemms"]
    fc1_weight = [HIDDEN, 2 * FFN // TP]  # SwiGLU's two halves, sharded by expert TP
    fc2_weight = [FFN // TP, HIDDEN]
    local_experts = EXPERTS // EP
    calls = local_experts * LAYERS * MICROBATCHES * CAPTURED_ITERATIONS
    for weight in (fc1_weight, fc2_weight):
        forward = [g for g in gemms if g["shapes"][1] == weight and g["shapes"][0][1] == weight[0]]
        # One GEMM per local expert and microbatch, of 256 tokens: no other token count for this weight.
        assert [g["shapes"][0][0] for g in forward] == [TOKENS_PER_LOCAL_EXPERT], forward
        (charged,) = forward
        assert charged["count"] == calls
        assert charged["flops"] == calls * 2 * TOKENS_PER_LOCAL_EXPERT * weight[0] * weight[1]


def test_the_all_to_all_carries_what_balanced_routing_sends(moe_run):
    events = [e for it in moe_run["capture"]["iterations"][1:] for e in it["events"]]
    all_to_all = [e for e in events if e[0] == ALL_TO_ALL]
    if moe_run["dispatcher"] == "allgather":
        assert not all_to_all  # the all-gather dispatcher gathers every token over tp x ep instead
        return
    # Each rank sends each of its 256 tokens to 2 experts: 512 rows of the hidden state in bf16, out
    # with the tokens and back with the experts' outputs, forward and backward (and the router's
    # probabilities beside them: 512 bf16 values).
    tokens_bytes, probs_bytes = TOKENS_PER_RANK * TOPK * HIDDEN * 2, TOKENS_PER_RANK * TOPK * 2
    sizes = sorted({e[4] for e in all_to_all})
    assert sizes == [probs_bytes, tokens_bytes]
    assert sum(e[4] == tokens_bytes for e in all_to_all) == 4 * LAYERS * MICROBATCHES
    ep_group = [0, TP]  # rank 0's expert-parallel peers: tp fastest, then ep
    assert all(e[1] == ep_group for e in all_to_all)
