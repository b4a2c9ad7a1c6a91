"""`prism-megatron emulate` end to end on CPU: capture, graph, simulation, emulation, report.

The job: GPT on W=16 GPUs, TP2 PP2 (DP4), 4 micro-batches per iteration, with virtual ranks 0 and 8
(two adjacent pipeline stages, so real pipeline traffic happens) run for real. Its four roles run
two programs (one per stage), captured in one pass of two processes. One run is shared by the tests that read its
outputs; the rerun with --prism-graph and the failure test start from its graph.
"""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time

import pytest
from launching import alive_in_groups, process_groups_naming, quiet_env

from prism_megatron.config import EmulationConfig
from prism_megatron.graph import load_graph
from prism_megatron.report import schema

JOB = (
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
    "--vocab-size", "1000", "--micro-batch-size", "1", "--global-batch-size", "16",
    "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
    "--hidden-dropout", "0", "--attention-dropout", "0",
    "--prism-emulate", "--prism-world-size", "16", "--prism-device", "cpu", "--prism-ranks", "pp=0,1;tp=0;dp=0",
)  # fmt: skip
REAL_RANKS = [0, 8]


def emulate(
    *flags: str, timeout_s: float = 400, flags_before: tuple[str, ...] = ()
) -> subprocess.CompletedProcess:
    return subprocess.run(
        [sys.executable, "-m", "prism_megatron.cli", "emulate", *flags_before, "--", *JOB, *flags],
        env=quiet_env(), capture_output=True, text=True, timeout=timeout_s,
    )  # fmt: skip


def read_json(path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


@pytest.fixture(scope="module")
def run_dir(tmp_path_factory):
    out = tmp_path_factory.mktemp("run")
    tensorboard = (
        "--tensorboard-dir",
        str(out / "tensorboard"),
        "--log-throughput",
        "--log-timers-to-tensorboard",
    )
    done = emulate("--train-iters", "4", "--prism-out", str(out), *tensorboard)
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    return out


@pytest.mark.slow
def test_one_command_captures_simulates_emulates_and_writes_every_output(run_dir):
    for name in ("report.json", "report.md", "timeline.json", "graph/graph.json", "rank-00000.json",
                 "rank-00008.json", "ops/rank-00000.json", "simulation/schedule-8.json"):  # fmt: skip
        assert os.path.isfile(run_dir / name), name
    assert any(name.endswith(".png") for name in os.listdir(run_dir / "plots"))
    # One rank per class of roles that run one program: stage 0's two roles, and stage 1's.
    assert [name for name in sorted(os.listdir(run_dir / "capture")) if name.startswith("capture-")] == [
        "capture-00000.json",
        "capture-00008.json",
    ]
    report = read_json(run_dir / "report.json")
    schema.validate(report)
    assert report["status"] == "ok" and report["real_ranks"] == REAL_RANKS
    assert report["target"]["world_size"] == 16 and report["target"]["dp"] == 4
    assert [it["warmup"] for it in report["iterations"]] == [True, False, False, False]
    assert report["simulated_iteration_time_s"] > 0 and report["iteration_time_s"] > 0
    assert set(report["roles"]) == {"pp0-tp0src", "pp0", "pp1-tp0src", "pp1"}
    for rank in ("0", "8"):
        assert report["ranks"][rank]["peak_memory_allocated_bytes"] > 0


@pytest.mark.slow
def test_every_pass_gives_each_real_rank_the_same_share_of_the_machine(run_dir):
    cores = sorted(os.sched_getaffinity(0))
    threads = EmulationConfig().resolved_cpu_threads(len(cores))
    passes = {
        "capture": [
            read_json(path)["cpu_share"] for path in sorted((run_dir / "capture").glob("rank-*.json"))
        ],
        "emulate": [read_json(run_dir / f"rank-{rank:05d}.json")["cpu_share"] for rank in REAL_RANKS],
    }
    assert len(passes["capture"]) == 2  # one rank per class of roles: 0 and 8, in one pass of two
    for shares in passes.values():
        assert all(share["threads"] == threads for share in shares), shares
        if len(cores) >= 2 * threads:  # two processes at once: a core set of its own each
            assert all(share["pinned"] and len(share["cores"]) == threads for share in shares), shares
            assert len({tuple(share["cores"]) for share in shares[:2]}) == 2, shares
    report = read_json(run_dir / "report.json")
    assert [report["ranks"][str(rank)]["cpu_threads"] for rank in REAL_RANKS] == [threads, threads]


@pytest.mark.slow
def test_real_ranks_log_megatrons_iteration_line_and_the_last_writes_its_tensorboard_tags(run_dir):
    emulate_logs = [
        os.path.join(root, name)
        for root, _, names in os.walk(run_dir / "logs" / "emulate")
        for name in names
        if name == "stdout.log"
    ]
    text = ""
    for path in emulate_logs:
        with open(path, encoding="utf-8") as f:
            text += f.read()
    # Each real rank prints its own line (GBS 16: 64 samples after 4 iterations).
    assert text.count(" iteration        4/       4 | consumed samples:           64 |") == len(REAL_RANKS)
    assert "| elapsed time per iteration (ms): " in text and "| throughput per GPU (TFLOP/s/GPU): " in text
    assert "| lm loss: " in text  # rank 8 is on the last pipeline stage
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    event_files = os.listdir(run_dir / "tensorboard")
    assert len(event_files) == 1, event_files  # the last real rank only, and not the capture pass
    events = EventAccumulator(str(run_dir / "tensorboard"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    assert {"lm loss", "learning-rate", "batch-size", "grad-norm", "iteration-time", "throughput"} <= tags
    assert [e.step for e in events.Scalars("lm loss")] == [1, 2, 3, 4]


@pytest.mark.slow
def test_the_timeline_is_a_chrome_trace_of_the_real_ranks_beside_replayed_virtual_ones(run_dir):
    trace = read_json(run_dir / "timeline.json")
    names = {e["pid"]: e["args"]["name"] for e in trace["traceEvents"] if e.get("name") == "process_name"}
    real = [name for name in names.values() if name.endswith(" real")]
    virtual = [name for name in names.values() if "virtual" in name]
    assert len(real) == 2 and any(name.startswith("rank 8 ") for name in real)
    assert virtual, "virtual peers are drawn from the simulation"
    spans = [e for e in trace["traceEvents"] if e["ph"] == "X"]
    assert {"compute", "p2p", "collective"} <= {e.get("cat") for e in spans if e["pid"] in (0, 8)}


@pytest.mark.slow
def test_every_emulated_iteration_after_warm_up_folds_its_measurements_into_the_next_schedule(run_dir):
    for rank in REAL_RANKS:
        phase = read_json(run_dir / f"rank-{rank:05d}.json")["prism_phase"]
        assert phase["name"] == "emulate" and phase["num_folded"] == 3 and phase["not_folded"] == {}
        simulated = phase["simulated_iteration_times_s"]
        assert simulated[0] == simulated[1], "warm-up is not folded"
        assert simulated[2] != simulated[1], "the schedule after a folded iteration is a new simulation"
        # Every folded iteration is also replayed in its schedule with the compute both real ranks
        # measured in it (exchanged with their durations); warm-up is not.
        replayed = phase["replayed_iteration_times_s"]
        assert replayed[0] is None and all(r > 0 for r in replayed[1:]), replayed
        # Beside it, the rank's compute in each folded iteration and what its schedule assumed.
        for key in ("schedule_compute_s", "measured_compute_s"):
            assert phase[key][0] is None and all(c > 0 for c in phase[key][1:]), (key, phase[key])
        # The first iteration after warm-up ran the graph as captured; each later one the schedule
        # folded from what was measured before it (the median iteration of the window).
        assert phase["schedule_compute_s"][1] == phase["captured_compute_s"]
        assert phase["schedule_compute_s"][2] == phase["measured_compute_s"][1]
        # Its expected time: the first schedule's is its simulation (no window yet); the next one,
        # simulated from one iteration, is that iteration replayed in it, which is the simulation
        # again (a replay with the simulated inputs gives the simulated finish).
        expected = phase["expected_iteration_times_s"]
        assert expected[0] is None and expected[1] == simulated[1], expected
        assert expected[2] == pytest.approx(simulated[2], abs=1e-9), (expected, simulated)
        assert expected[3] > 0, expected
    agreement = read_json(run_dir / "report.json")["agreement"]
    assert all(len(agreement[str(rank)]["replayed_s"]) == 3 for rank in REAL_RANKS)
    assert all(len(agreement[str(rank)]["expected_s"]) == 3 for rank in REAL_RANKS)
    assert all(len(agreement[str(rank)]["measured_compute_s"]) == 3 for rank in REAL_RANKS)


@pytest.mark.slow
def test_real_ranks_of_one_model_parallel_group_start_together_and_no_iteration_holds_the_resimulation(
    run_dir,
):
    """Ranks 0 and 8 share the model-parallel group {0, 1, 8, 9}. Both begin every iteration at one
    agreed time and mark the start only then; how close together the two marks land is the host's
    scheduling (tests/dist/test_agreed_start.py times it)."""
    from prism_megatron.report.oplog import load_op_logs

    logs = load_op_logs(str(run_dir))
    phases = [read_json(run_dir / f"rank-{rank:05d}.json")["prism_phase"] for rank in REAL_RANKS]
    agreed = [[s["start_ns"] for s in phase["agreed_starts"]] for phase in phases]
    assert len(agreed[0]) == 4 and agreed[0] == agreed[1]
    for rank, phase, agreed_ns in zip(REAL_RANKS, phases, agreed, strict=True):
        starts_ns = logs[rank].iteration_starts_ns
        assert all(mark >= start for mark, start in zip(starts_ns, agreed_ns, strict=True))
        ends_ns = [s + round(t * 1e9) for s, t in zip(starts_ns, phase["iteration_times_s"], strict=True)]
        # Iteration 0 is warm-up; the re-simulation after iteration i lies between its end and the
        # next start, so it is in no iteration's time.
        resimulations_s = phase["resimulation_s"]
        assert len(resimulations_s) == 3
        for i, resimulation_s in enumerate(resimulations_s[:-1], start=1):
            assert starts_ns[i + 1] - ends_ns[i] >= resimulation_s * 1e9
    # Each rank's simulated iteration is its own finish (ranks of two stages finish apart); the job's
    # time from the last re-simulation is the same on both: they re-simulate from the same measurements.
    assert phases[0]["closed_loop_final_s"] == phases[1]["closed_loop_final_s"], (
        "both re-simulate from the same measurements"
    )


@pytest.mark.slow
def test_rerunning_with_the_graph_skips_capture_and_gives_the_same_simulated_time(run_dir, tmp_path):
    done = emulate(
        "--train-iters", "2", "--prism-graph", str(run_dir / "graph"), "--prism-out", str(tmp_path)
    )
    assert done.returncode == 0, done.stderr[-4000:]
    assert not os.path.exists(tmp_path / "capture")
    assert "capture pass" not in done.stderr
    first, again = read_json(run_dir / "report.json"), read_json(tmp_path / "report.json")
    assert again["simulated_iteration_time_s"] == first["simulated_iteration_time_s"]
    assert load_graph(str(tmp_path / "graph")) == load_graph(str(run_dir / "graph"))


@pytest.mark.slow
def test_a_virtual_straggler_slows_the_real_ranks_as_the_simulation_says(run_dir, tmp_path):
    # Virtual rank 9 is real rank 8's TP peer; three times slower, it holds every TP all-reduce.
    done = emulate("--train-iters", "3", "--prism-graph", str(run_dir / "graph"), "--prism-straggler", "9:3",
                   "--prism-out", str(tmp_path))  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    base, slowed = read_json(run_dir / "report.json"), read_json(tmp_path / "report.json")
    assert slowed["simulated_iteration_time_s"] > 1.5 * base["simulated_iteration_time_s"]
    assert slowed["iteration_time_s"] > 1.5 * base["iteration_time_s"]
    # Each emulated iteration against the simulation of the schedule it ran. After the first, the
    # closed loop folds what rank 8 measured, and rank 9 computes three times that: on a shared host
    # the measured compute drifts from the capture's (rank 8: 148-238 ms an iteration against the
    # capture's 138 ms in runs here), so the job's time moves with it and the capture's simulation
    # is no fixed yardstick; the schedule each iteration ran is.
    for rank in REAL_RANKS:
        agreement = slowed["agreement"][str(rank)]
        assert abs(agreement["median_difference_pct"]) < 5, agreement


@pytest.mark.slow
def test_an_emulation_pass_launched_by_hand_builds_the_graph_from_capture_files_and_reports(
    run_dir, tmp_path
):
    """What several machines do: each pass under the user's torchrun, then --report-only."""
    command = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc-per-node=2",
               "-m", "prism_megatron.launch", "builtin", *JOB, "--train-iters", "3", "--prism-phase", "emulate",
               "--prism-graph", str(run_dir / "capture"), "--prism-out", str(tmp_path)]  # fmt: skip
    done = subprocess.run(command, env=quiet_env(), capture_output=True, text=True, timeout=300)
    assert done.returncode == 0, done.stderr[-4000:]
    assert sorted(os.listdir(tmp_path / "ops")) == ["rank-00000.json", "rank-00008.json"]
    done = emulate("--train-iters", "3", "--prism-graph", str(run_dir / "capture"), "--prism-out", str(tmp_path),
                   flags_before=("--report-only",))  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    report = read_json(tmp_path / "report.json")
    assert report["status"] == "ok" and len(report["iterations"]) == 3
    assert (
        report["simulated_iteration_time_s"]
        == read_json(run_dir / "report.json")["simulated_iteration_time_s"]
    )


def test_an_existing_run_folder_is_refused_before_any_process_starts(tmp_path):
    (tmp_path / "report.json").write_text("{}")
    done = emulate("--train-iters", "2", "--prism-out", str(tmp_path), timeout_s=60)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0 and "--prism-overwrite" in done.stderr
    assert os.listdir(tmp_path) == ["report.json"]


@pytest.mark.parametrize(
    "flags, named",
    [
        (("--prism-ranks", "pp=5"), "pp=5"),
        (("--global-batch-size", "6"), "--global-batch-size 6"),
        (("--prism-straggler", "99:2"), "--prism-straggler rank 99"),
        (("--prism-graph", "no-such-graph"), "--prism-graph no-such-graph"),
        (("--num-layers", "3"), "--num-layers 3 must be divisible"),
        (("--no-such-flag", "3"), "does not support --no-such-flag 3"),
        (("--recompute-granularity", "full"), "megatron-core refuses these flags"),
    ],
)
def test_invalid_flags_are_one_line_naming_the_flag_and_exit_2(flags, named, tmp_path):
    done = emulate("--train-iters", "2", "--prism-out", str(tmp_path / "run"), *flags, timeout_s=60)
    assert done.returncode == 2, done.stderr
    assert done.stderr.strip().count("\n") == 0 and named in done.stderr
    assert not os.path.exists(tmp_path / "run")


def start_long_emulation(run_dir, out) -> tuple[subprocess.Popen, dict]:
    """The emulation of 400 iterations from the shared graph, once rank 8 is 2 iterations in; its state."""
    command = [sys.executable, "-m", "prism_megatron.cli", "emulate", "--", *JOB, "--train-iters", "400",
               "--prism-graph", str(run_dir / "graph"), "--prism-out", str(out)]  # fmt: skip
    process = subprocess.Popen(
        command, env=quiet_env(), stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
        start_new_session=True,
    )  # fmt: skip
    progress = out / "progress" / "rank-00008.json"
    deadline_s = time.monotonic() + 240
    while time.monotonic() < deadline_s and process.poll() is None:
        state = read_json(progress) if progress.exists() else {}
        if state.get("phase") == "emulate" and state.get("iterations_done", 0) >= 2:
            break
        time.sleep(0.2)
    assert process.poll() is None, "the run ended before the fault"
    return process, state


@pytest.mark.slow
def test_sigterm_during_emulation_ends_every_process_and_keeps_what_was_measured(run_dir, tmp_path):
    process, _ = start_long_emulation(run_dir, tmp_path)
    groups = set(process_groups_naming(tmp_path).values()) - {os.getpgrp()}
    assert len(groups) >= 4, "the command, torchrun and the two real ranks, each leading a group"
    signalled_s = time.monotonic()
    process.send_signal(signal.SIGTERM)
    while alive_in_groups(groups - {process.pid}) and time.monotonic() - signalled_s < 60:
        time.sleep(0.05)
    stopped_s = time.monotonic() - signalled_s
    _, stderr = process.communicate(timeout=60)
    print(f"\nfault timing: SIGTERM during emulation: processes gone in {stopped_s:.1f} s, "
          f"command exited in {time.monotonic() - signalled_s:.1f} s")  # fmt: skip
    assert stopped_s < 10, "every process the command started ends within 10 s"
    assert not alive_in_groups(groups)
    assert process.returncode == 128 + signal.SIGTERM, stderr[-3000:]
    report = read_json(tmp_path / "report.json")
    schema.validate(report)
    assert report["status"] == "interrupted" and "SIGTERM during emulate" in report["failure"]["message"]
    assert len(report["iterations"]) >= 2, "what the ranks measured before the signal is kept"
    done = subprocess.run([sys.executable, "-m", "prism_megatron.cli", "report", "--check", str(tmp_path)],
                          env=quiet_env(), capture_output=True, text=True, timeout=60)  # fmt: skip
    assert done.returncode == 1 and "not finished" in done.stderr


@pytest.mark.slow
def test_a_killed_rank_fails_the_run_naming_it_and_the_others_stop(run_dir, tmp_path):
    process, state = start_long_emulation(run_dir, tmp_path)
    groups = set(process_groups_naming(tmp_path).values()) - {os.getpgrp()}
    os.kill(state["pid"], signal.SIGKILL)
    killed_s = time.monotonic()
    stdout, stderr = process.communicate(timeout=120)
    took_s = time.monotonic() - killed_s
    print(f"\nfault timing: SIGKILL of a real rank: run failed in {took_s:.1f} s")
    assert took_s < 60, "the other real rank stops within a minute"
    assert not alive_in_groups(groups), "no process of the run is left"
    assert process.returncode == 1, stderr[-3000:]
    report = read_json(tmp_path / "report.json")
    schema.validate(report)
    assert report["status"] == "failed"
    assert report["failure"]["dead_rank"] == 8
    assert "virtual rank 8" in report["failure"]["message"] and "SIGKILL" in report["failure"]["message"]
    assert "virtual rank 8" in stdout
    assert os.path.isfile(tmp_path / "graph" / "graph.json"), "what was made before the failure is kept"
    assert len(report["iterations"]) >= 2, "and what the ranks measured before it"


MEGATRON_LM_DIR = os.environ.get("MEGATRON_LM_DIR")
MEGATRON_LM_FLAGS = (
    "--max-position-embeddings", "32", "--lr", "1e-4", "--mock-data", "--tokenizer-type", "NullTokenizer",
    "--transformer-impl", "local", "--no-gradient-accumulation-fusion", "--no-masked-softmax-fusion",
    "--no-bias-gelu-fusion", "--no-bias-dropout-fusion", "--no-persist-layer-norm", "--eval-iters", "0",
    "--eval-interval", "1000", "--log-interval", "1",
)  # fmt: skip


@pytest.mark.slow
@pytest.mark.megatron_lm
@pytest.mark.skipif(
    not (MEGATRON_LM_DIR and os.path.isfile(os.path.join(MEGATRON_LM_DIR, "pretrain_gpt.py"))),
    reason="needs a Megatron-LM checkout (the tag matching megatron-core) in MEGATRON_LM_DIR",
)
def test_megatron_lms_pretrain_gpt_runs_both_passes_and_writes_every_output(tmp_path):
    for module in ("six", "regex", "triton", "pydantic"):
        pytest.importorskip(module, reason="Megatron-LM's training code imports it")
    script = os.path.join(MEGATRON_LM_DIR, "pretrain_gpt.py")
    done = subprocess.run(
        [sys.executable, "-m", "prism_megatron.cli", "emulate", "--script", script, "--", *JOB, *MEGATRON_LM_FLAGS,
         "--train-iters", "3", "--prism-out", str(tmp_path)],
        env=quiet_env(), capture_output=True, text=True, timeout=400,
    )  # fmt: skip
    assert done.returncode == 0, f"{done.stdout[-3000:]}\n{done.stderr[-5000:]}"
    report = read_json(tmp_path / "report.json")
    schema.validate(report)
    assert report["status"] == "ok" and report["real_ranks"] == REAL_RANKS
    for name in ("report.md", "timeline.json", "graph/graph.json", "ops/rank-00008.json"):
        assert os.path.isfile(tmp_path / name), name
    phase = read_json(tmp_path / "rank-00008.json")["prism_phase"]
    assert phase["name"] == "emulate" and phase["num_folded"] == 2 and phase["not_folded"] == {}
