"""One or two real processes emulate ranks of an 8192-GPU job on the prism backend (CPU device).

Megatron builds the full topology in the virtual world; pipeline neighbours that are virtual send
plausible tensors; control flow stays real on every role. The tiny model (hidden 64, one layer per
stage) keeps each run to a few seconds; what is checked is what the emulated rank would see in the
real job: its coordinates, that it trains, and that its buffers have full-scale sizes.
"""

from __future__ import annotations

import math

import pytest
from launching import run_entry

from prism_megatron.megatron.entry import pretrain
from prism_megatron.topology import Layout, select_ranks

W = 8192
MODEL = (
    "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "32", "--vocab-size", "1000",
    "--micro-batch-size", "1", "--train-iters", "3", "--prism-device", "cpu",
)  # fmt: skip

# name -> (Megatron flags, layout, selection of a TP-rank-5 (or EP-rank-5) first-stage rank)
CONFIGS = {
    "tp8-pp8-dp128": (
        ("--num-layers", "8", "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "8",
         "--global-batch-size", "1024", "--use-distributed-optimizer"),
        Layout(world_size=W, tp=8, pp=8),
        "pp=0;tp=5;dp=0",
    ),
    "tp8-pp16-dp64": (
        ("--num-layers", "16", "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "16",
         "--global-batch-size", "512"),
        Layout(world_size=W, tp=8, pp=16),
        "pp=0;tp=5;dp=0",
    ),
    "tp1-pp4-ep8-moe": (
        ("--num-layers", "4", "--pipeline-model-parallel-size", "4", "--num-experts", "8",
         "--expert-model-parallel-size", "8", "--moe-token-dispatcher-type", "alltoall", "--global-batch-size", "2048"),
        Layout(world_size=W, pp=4, ep=8),
        "pp=0;ep=5;edp=0",
    ),
    "tp8-pp8-vpp2": (
        ("--num-layers", "16", "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "8",
         "--num-layers-per-virtual-pipeline-stage", "1", "--global-batch-size", "1024"),
        Layout(world_size=W, tp=8, pp=8, vpp=2),
        "pp=0;tp=5;dp=0",
    ),
}  # fmt: skip

# Variable sequence lengths make neighbours exchange shapes first (the allgather dispatcher refuses them).
VARIABLE_SEQ = ("--variable-seq-lengths", "--moe-token-dispatcher-type", "alltoall")


ROLES = ("first-stage-tp0", "first-stage-rank5", "middle-stage", "last-stage")


def rank_for(layout: Layout, role: str, rank5_spec: str) -> int:
    specs = {
        "first-stage-tp0": "pp=0;tp=0;dp=0",
        "first-stage-rank5": rank5_spec,
        "middle-stage": f"pp={layout.pp // 2};tp={min(3, layout.tp - 1)};dp=7",
        "last-stage": f"pp={layout.pp - 1};tp=0;dp=1",
    }
    return select_ranks(layout, specs[role])[0]


def emulate(tmp_path, flags, virtual_rank: int, world_size: int = W) -> dict:
    emulation = ("--prism-emulate", "--prism-world-size", str(world_size), "--prism-ranks", str(virtual_rank))
    return pretrain.run([*MODEL, *flags, *emulation, "--prism-out", str(tmp_path)])


@pytest.mark.slow
@pytest.mark.parametrize("role", ROLES)
@pytest.mark.parametrize("config", CONFIGS)
def test_one_real_process_trains_three_iterations_as_any_role(tmp_path, config, role):
    flags, layout, rank5_spec = CONFIGS[config]
    virtual_rank = rank_for(layout, role, rank5_spec)
    out = emulate(tmp_path, flags, virtual_rank)
    coords = layout.coords(virtual_rank)
    assert out["backend"] == "prism" and out["world_size"] == W and out["virtual_rank"] == virtual_rank
    assert (out["role"]["tp_rank"], out["role"]["pp_rank"], out["role"]["dp_rank"]) == (
        coords.tp,
        coords.pp,
        coords.dp,
    )
    assert len(out["iterations"]) == 3
    assert all(math.isfinite(it["grad_norm"]) and it["grad_norm"] > 0 for it in out["iterations"])
    last_stage = coords.pp == layout.pp - 1
    for it in out["iterations"]:
        assert (it["loss"] is not None and math.isfinite(it["loss"])) if last_stage else it["loss"] is None
    p2p = out["p2p"]
    interleaved = layout.vpp is not None  # the ring wraps: the last stage feeds the first one's next chunk
    if not last_stage or interleaved:
        assert p2p["send_next"] > 0 and p2p["recv_next"] > 0
    if coords.pp > 0 or interleaved:
        assert p2p["recv_prev"] > 0 and p2p["send_prev"] > 0
    assert not any(key.endswith(".real") for key in p2p), "every neighbour is virtual with one real process"
    if last_stage:
        assert out["patches_used"]["megatron.tied_embedding_from_virtual_first_stage"] >= 1


def test_variable_sequence_lengths_with_virtual_neighbours(tmp_path):
    flags, layout, _ = CONFIGS["tp8-pp8-dp128"]
    out = emulate(tmp_path, (*flags, *VARIABLE_SEQ), rank_for(layout, "middle-stage", ""))
    assert len(out["iterations"]) == 3 and all(math.isfinite(it["grad_norm"]) for it in out["iterations"])
    assert out["p2p"]["recv_prev.virtual"] == out["p2p"]["recv_next.virtual"] > 0


def test_a_tp_rank_5_of_the_first_stage_trains_in_tp8_pp8(tmp_path):
    """The case the fake process group got wrong: a rank that is not a TP source must still train."""
    flags, layout, rank5_spec = CONFIGS["tp8-pp8-dp128"]
    out = emulate(tmp_path, flags, rank_for(layout, "first-stage-rank5", rank5_spec))
    assert out["role"]["tp_rank"] == 5 and out["role"]["pp_rank"] == 0
    assert len(out["iterations"]) == 3 and all(math.isfinite(it["grad_norm"]) for it in out["iterations"])


@pytest.mark.parametrize("config", ["pp2", "dp2-distopt-overlap", "dp2-fp16"])
def test_emulated_rank_0_with_virtual_rank_1_matches_rank_0_of_a_real_two_process_run(tmp_path, config):
    flags = {
        "pp2": ("--pipeline-model-parallel-size", "2"),
        "dp2-distopt-overlap": ("--use-distributed-optimizer", "--overlap-grad-reduce"),
        "dp2-fp16": ("--fp16",),  # the loss scaler's found-inf reduction decides whether a step is skipped
    }[config]
    tiny = ("--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
            "--vocab-size", "1000", "--micro-batch-size", "1", "--global-batch-size", "4", "--train-iters", "2",
            "--prism-device", "cpu")  # fmt: skip
    real = run_entry(tmp_path / "real", 2, *tiny, *flags)[0]
    emulation = ("--prism-emulate", "--prism-world-size", "2", "--prism-ranks", "0")
    emulated = pretrain.run([*tiny, *flags, *emulation, "--prism-out", str(tmp_path / "emulated")])

    def sequence(result):
        groups = result["collectives"]["groups"]
        return [(op, tuple(groups[g]), size) for op, g, size in result["collectives"]["ops"]]

    assert emulated["backend"] == "prism" and real["backend"] == "gloo"
    assert sequence(emulated) == sequence(real)
    assert emulated["grad_buffers"] == real["grad_buffers"]
    assert emulated["optimizer_shard_numel"] == real["optimizer_shard_numel"]
    for category in ("parameters", "gradients", "optimizer_state"):
        assert emulated["memory"]["at_peak_bytes"][category] == real["memory"]["at_peak_bytes"][category]
    assert [it["update_successful"] for it in emulated["iterations"]] == [
        it["update_successful"] for it in real["iterations"]
    ]
    p2p_sent = real["collectives"]["p2p_counts"].get("send", 0)
    assert sum(v for k, v in emulated["p2p"].items() if k in ("send_next", "send_prev")) == p2p_sent


@pytest.mark.slow
@pytest.mark.parametrize("shapes", [(), VARIABLE_SEQ], ids=["fixed-shapes", "variable-seq-lengths"])
def test_two_real_processes_on_adjacent_stages_exchange_real_data_among_8190_virtual_ranks(tmp_path, shapes):
    flags, layout, _ = CONFIGS["tp8-pp8-dp128"]
    flags = (*flags, *shapes)
    stage0, stage1 = select_ranks(layout, "pp=3,4;tp=5;dp=0")
    emulation = ("--prism-emulate", "--prism-world-size", str(W), "--prism-ranks", f"{stage0},{stage1}")
    first, second = run_entry(tmp_path, 2, *MODEL, *flags, *emulation)
    assert (first["virtual_rank"], second["virtual_rank"]) == (stage0, stage1)
    assert first["p2p"]["send_next.real"] == second["p2p"]["recv_prev.real"] > 0
    assert first["p2p"]["recv_next.real"] == second["p2p"]["send_prev.real"] > 0
    assert second["p2p"]["send_next.virtual"] > 0 and second["p2p"]["recv_next.virtual"] > 0
    assert first["p2p"]["recv_prev.virtual"] > 0 and first["p2p"]["send_prev.virtual"] > 0
    # The same data crossed: the sums of everything sent one way and received the other agree.
    assert first["p2p_real_checksums"]["send_next"] == pytest.approx(
        second["p2p_real_checksums"]["recv_prev"]
    )
    assert first["p2p_real_checksums"]["recv_next"] == pytest.approx(
        second["p2p_real_checksums"]["send_prev"]
    )
    for rank in (first, second):
        assert all(math.isfinite(it["grad_norm"]) for it in rank["iterations"])
