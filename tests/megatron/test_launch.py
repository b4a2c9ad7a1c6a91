"""The launcher, the `emulate` command, and Megatron-LM's own pretrain_gpt.py through them.

Tests that run Megatron-LM need a checkout of the tag matching the installed megatron-core in
MEGATRON_LM_DIR (core_v0.16.1 for 0.16.1, core_v0.19.0 for 0.19.x) and the extra packages its
training code imports; they skip otherwise. Its code is never part of this repository.
"""

from __future__ import annotations

import math
import os
import subprocess
import sys

import pytest
from launching import load_results, quiet_env
from test_full_scale_memory import stage_params

from prism_megatron import launch
from prism_megatron.commands import emulate

W = 8192
TP8_PP8 = ("--num-layers", "8", "--tensor-model-parallel-size", "8", "--pipeline-model-parallel-size", "8")
TINY = (
    "--hidden-size", "64", "--num-attention-heads", "8", "--seq-length", "32", "--micro-batch-size", "1",
    "--global-batch-size", "1024", "--train-iters", "2", "--vocab-size", "1000",
)  # fmt: skip
EMULATE = ("--prism-emulate", "--prism-world-size", str(W), "--prism-device", "cpu")


def test_default_process_count_is_one_per_selected_rank():
    assert emulate.default_nproc([*TP8_PP8, *EMULATE, "--prism-ranks", "pp=0,1;tp=0;dp=0"]) == 2
    assert emulate.default_nproc([*TP8_PP8, *EMULATE, "--prism-ranks", "5"]) == 1
    assert emulate.default_nproc([*TP8_PP8]) == 1  # not emulating: one plain process


def test_default_process_count_without_ranks_is_the_default_slice():
    from prism_megatron.topology import Layout

    expected = len(Layout(world_size=W, tp=8, pp=8).default_slice())
    assert emulate.default_nproc([*TP8_PP8, *EMULATE]) == expected


def test_the_command_spawns_torchs_launcher_with_the_prism_entry():
    command = emulate.launcher_command(2, "builtin", ["--num-layers", "8"])
    assert command[1:4] == ["-m", "torch.distributed.run", "--standalone"]
    assert "--nproc-per-node=2" in command
    assert command[-4:] == ["prism_megatron.launch", "builtin", "--num-layers", "8"]


def test_slurm_task_variables_stand_in_for_torchruns():
    environ = {"SLURM_PROCID": "3", "SLURM_NTASKS": "4", "SLURM_LOCALID": "1"}
    launch.adopt_slurm_environment(environ)
    assert (environ["RANK"], environ["WORLD_SIZE"], environ["LOCAL_RANK"]) == ("3", "4", "1")
    under_torchrun = {"RANK": "0", "SLURM_PROCID": "3"}
    launch.adopt_slurm_environment(under_torchrun)
    assert under_torchrun["RANK"] == "0"


def run_cli(*argv: str, timeout_s: float = 300.0) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "prism_megatron.cli", *argv],
        env=quiet_env(),
        capture_output=True,
        text=True,
        timeout=timeout_s,
    )


def test_a_script_that_is_not_a_file_is_one_line_and_exit_2(tmp_path):
    done = subprocess.run(
        [sys.executable, "-m", "prism_megatron.launch", str(tmp_path / "missing.py")],
        env=quiet_env(),
        capture_output=True,
        text=True,
    )
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "is not a file" in done.stderr


def test_a_bad_rank_selection_names_the_flag(tmp_path):
    done = run_cli("emulate", "--", *TP8_PP8, *EMULATE, "--prism-ranks", "pp=9")
    assert done.returncode == 2 and "pp=9" in done.stderr


def test_list_patches_prints_every_record_and_runs_nothing():
    done = subprocess.run(
        [sys.executable, "-m", "prism_megatron.launch", "builtin", *TINY, *TP8_PP8, "--prism-list-patches"],
        env=quiet_env(), capture_output=True, text=True, timeout=120,
    )  # fmt: skip
    assert done.returncode == 0
    for name in (
        "cpu.current_device",
        "megatron.create_group",
        "megatron.p2p_communicator",
        "megatron_lm.validate_args",
        "build.mla_have_te",
        "build.current_device",
        "build.tensor_cuda",
        "plan.gbuf_range_map",
    ):
        assert name in done.stdout


@pytest.mark.slow
def test_emulate_command_runs_two_adjacent_stages_of_an_8192_job(tmp_path):
    done = run_cli(
        "emulate",
        "--",
        *TP8_PP8,
        *TINY,
        *EMULATE,
        "--prism-ranks",
        "pp=0,1;tp=0;dp=0",
        "--prism-out",
        str(tmp_path),
    )
    assert done.returncode == 0, done.stderr[-4000:]
    results = load_results(tmp_path)
    assert [r["virtual_rank"] for r in results] == [0, 1024]
    assert all(len(r["iterations"]) == 2 for r in results)


MEGATRON_LM_DIR = os.environ.get("MEGATRON_LM_DIR")
needs_megatron_lm = pytest.mark.skipif(
    not (MEGATRON_LM_DIR and os.path.isfile(os.path.join(MEGATRON_LM_DIR, "pretrain_gpt.py"))),
    reason="needs a Megatron-LM checkout (the tag matching megatron-core) in MEGATRON_LM_DIR",
)
MEGATRON_LM_FLAGS = (
    "--seq-length", "32", "--max-position-embeddings", "32", "--lr", "1e-4", "--mock-data",
    "--tokenizer-type", "NullTokenizer", "--transformer-impl", "local", "--no-gradient-accumulation-fusion",
    "--no-masked-softmax-fusion", "--no-bias-gelu-fusion", "--no-bias-dropout-fusion", "--no-persist-layer-norm",
    "--eval-iters", "0", "--eval-interval", "1000", "--log-interval", "1",
)  # fmt: skip


@pytest.mark.megatron_lm
@needs_megatron_lm
def test_megatron_lms_pretrain_gpt_trains_on_virtual_rank_5_of_8192(tmp_path):
    for module in ("six", "regex", "triton", "pydantic"):
        pytest.importorskip(module, reason="Megatron-LM's training code imports it")
    script = os.path.join(MEGATRON_LM_DIR, "pretrain_gpt.py")
    done = subprocess.run(
        [sys.executable, "-m", "prism_megatron.launch", script, *TP8_PP8, *TINY, *MEGATRON_LM_FLAGS, *EMULATE,
         "--prism-ranks", "5", "--prism-out", str(tmp_path), "--tensorboard-dir", str(tmp_path / "tb"),
         "--log-timers-to-tensorboard"],
        env=quiet_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    (result,) = load_results(tmp_path)
    assert result["virtual_rank"] == 5 and result["role"]["tp_rank"] == 5 and result["role"]["pp_rank"] == 0
    assert len(result["iterations"]) == 2
    assert all(math.isfinite(it["grad_norm"]) and it["grad_norm"] > 0 for it in result["iterations"])
    assert result["patches_used"]["megatron_lm.tp_batch_from_virtual_source"] > 0
    assert result["p2p"]["send_next.virtual"] > 0
    assert result["num_parameters"] == sum(n for n, _ in stage_params(first=True, last=False))
    # Rank W-1 is virtual: the only real rank, 5, takes Megatron-LM's last-rank duties.
    assert " iteration        2/       2 | consumed samples:         2048 |" in done.stdout
    assert result["patches_used"]["megatron_lm.tensorboard_writer_on_last_real_rank"] == 1
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    assert {"learning-rate", "batch-size", "grad-norm", "iteration-time"} <= set(events.Tags()["scalars"])


@pytest.mark.slow
@pytest.mark.megatron_lm
@needs_megatron_lm
@pytest.mark.parametrize(
    "flags, records",
    [
        (("--sequence-parallel",), ("cpu.sequence_parallel_norm",)),
        (("--sequence-parallel", "--context-parallel-size", "2"),
         ("cpu.sequence_parallel_norm", "cpu.context_parallel_attention")),
    ],
    ids=["sp", "sp-cp2"],
)  # fmt: skip
def test_megatron_lms_pretrain_gpt_runs_sequence_and_context_parallel_on_the_local_layers(
    flags, records, tmp_path
):
    """Megatron-LM's script as written for a GPU job (SP, CP) on CPU: the CPU records supply the norm
    and the attention its local spec lacks, and the real rank trains among virtual TP and CP peers."""
    for module in ("six", "regex", "triton", "pydantic"):
        pytest.importorskip(module, reason="Megatron-LM's training code imports it")
    script = os.path.join(MEGATRON_LM_DIR, "pretrain_gpt.py")
    done = subprocess.run(
        [sys.executable, "-m", "prism_megatron.launch", script, *TP8_PP8, *TINY, *MEGATRON_LM_FLAGS, *EMULATE,
         *flags, "--prism-ranks", "5", "--prism-out", str(tmp_path)],
        env=quiet_env(), capture_output=True, text=True, timeout=600,
    )  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    (result,) = load_results(tmp_path)
    assert len(result["iterations"]) == 2
    assert all(math.isfinite(it["grad_norm"]) and it["grad_norm"] > 0 for it in result["iterations"])
    for record in records:
        assert result["patches_used"].get(record, 0) > 0, record


def test_an_unverified_megatron_core_is_refused_in_one_line_before_any_process(monkeypatch, capsys, tmp_path):
    from prism_megatron import cli
    from prism_megatron.patches import versions

    monkeypatch.setattr(versions, "installed_megatron_core_version", lambda: "0.18.2")
    out = tmp_path / "run"
    assert cli.main(["emulate", "--", *TP8_PP8, *TINY, *EMULATE, "--prism-out", str(out)]) == 2
    error = capsys.readouterr().err.strip()
    assert "\n" not in error and "megatron-core 0.18.2 is not" in error
    assert "--prism-allow-untested-megatron" in error
    assert not out.exists()


def test_an_earlier_result_is_kept_unless_overwrite_is_given(tmp_path):
    from prism_megatron.config import OutputConfig, PrismConfig
    from prism_megatron.megatron.run import results

    config = PrismConfig(output=OutputConfig(out=str(tmp_path)))
    results.write(config, 5, {"virtual_rank": 5})
    with pytest.raises(ValueError, match="--prism-overwrite"):
        results.check_writable(config, 5)
    results.check_writable(config, 6)  # another rank's file is free
    results.check_writable(PrismConfig(output=OutputConfig(out=str(tmp_path), overwrite=True)), 5)
