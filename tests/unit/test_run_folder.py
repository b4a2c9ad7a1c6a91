"""A run folder belongs to one run at a time, and its report.json tells the truth however the run ends.

The runs here are `emulation.driver.run` over a real plan with the capture and the emulation pass
replaced by stand-ins (no process starts): the lock, the overwrite rules and the report phase are
the driver's own.
"""

from __future__ import annotations

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import threading

import pytest

from prism_megatron import cli, files
from prism_megatron.emulation import driver, processes
from prism_megatron.emulation.plan import plan_run
from prism_megatron.sim import PipelineSpec, layout_pipeline_graph
from prism_megatron.topology import Layout

JOB = (
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
    "--vocab-size", "1000", "--micro-batch-size", "1", "--global-batch-size", "16", "--train-iters", "2",
    "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
    "--prism-emulate", "--prism-world-size", "16", "--prism-device", "cpu", "--prism-ranks", "0",
)  # fmt: skip
GRAPH = layout_pipeline_graph(
    Layout(world_size=16, tp=2, pp=2),
    PipelineSpec(num_microbatches=2, fwd_ns=1_000_000, bwd_ns=2_000_000, activation_bytes=1 << 16),
)


def _plan(out, *flags: str):
    return plan_run([*JOB, "--prism-out", str(out), *flags])


@pytest.fixture
def no_processes(monkeypatch):
    """The capture and the emulation pass replaced: the graph is GRAPH, the emulation does nothing
    (or what `hold` says: it waits on that event, so a test can keep a run in its middle)."""
    state = {"hold": None, "started": threading.Event()}

    def obtain_graph(plan, progress, walls):
        progress.begin("graph")
        walls["graph"] = progress.end()
        return GRAPH

    def emulate(plan, progress, walls):
        progress.begin("emulate")
        state["started"].set()
        if state["hold"] is not None:
            assert state["hold"].wait(30)
        files.write_json({"virtual_rank": 0, "run": plan.out_dir}, files.results_path(plan.out_dir, 0))
        walls["emulate"] = progress.end()

    monkeypatch.setattr(driver, "obtain_graph", obtain_graph)
    monkeypatch.setattr(driver, "emulate", emulate)
    return state


def _status(out) -> str:
    with open(os.path.join(out, files.REPORT_JSON), encoding="utf-8") as f:
        return json.load(f)["status"]


def _check(out, capsys) -> tuple[int, str]:
    capsys.readouterr()
    status = cli.main(["report", str(out), "--check"])
    captured = capsys.readouterr()
    return status, captured.out + captured.err


def test_a_finished_run_lists_what_it_wrote_and_leaves_no_lock(tmp_path, no_processes, capsys):
    outcome = driver.run(_plan(tmp_path / "run"))
    assert outcome.ok
    doc = json.loads((tmp_path / "run" / files.REPORT_JSON).read_text())
    assert "report.md" in doc["artefacts"] and all(
        (tmp_path / "run" / name).is_file() for name in doc["artefacts"]
    )
    assert not (tmp_path / "run" / files.LOCK_FILE).exists()
    assert _check(tmp_path / "run", capsys)[0] == 0


def test_two_runs_started_into_one_folder_at_once_exactly_one_proceeds(tmp_path, no_processes):
    out = tmp_path / "run"
    plans = [_plan(out), _plan(out)]  # both planned while the folder is empty: both pass that check
    no_processes["hold"] = threading.Event()
    outcomes, errors = {}, {}

    def first():
        try:
            outcomes["first"] = driver.run(plans[0])
        except BaseException as exc:  # reported below
            errors["first"] = exc

    thread = threading.Thread(target=first)
    thread.start()
    assert no_processes["started"].wait(30)  # the first run is in its emulation, holding the folder
    with pytest.raises(files.RunFolderBusy, match=r"--prism-out .* is in use by another run \(pid \d+"):
        driver.run(plans[1])
    no_processes["hold"].set()
    thread.join(30)
    assert not errors and outcomes["first"].ok
    assert _status(out) == "ok"
    # Once the first has ended, the second is refused by what the folder now holds, not let in.
    with pytest.raises(ValueError, match="already holds a run; pass --prism-overwrite"):
        driver.run(plans[1])


def test_a_stale_lock_of_a_killed_run_is_recognised_and_a_live_one_refuses_in_one_line(tmp_path, capsys):
    out = tmp_path / "run"
    hold = textwrap.dedent(
        f"""
        import sys, time
        from prism_megatron import files
        with files.run_folder_lock({str(out)!r}):
            print("held", flush=True)
            time.sleep(60)
        """
    )
    holder = subprocess.Popen([sys.executable, "-c", hold], stdout=subprocess.PIPE, text=True)
    try:
        assert holder.stdout.readline().strip() == "held"
        status = cli.main(["emulate", "--", *JOB, "--prism-out", str(out)])
        err = [line for line in capsys.readouterr().err.strip().splitlines() if "warn" not in line.lower()]
        assert status == 2 and len(err) == 1 and f"pid {holder.pid}" in err[0] and "in use" in err[0]
    finally:
        holder.send_signal(signal.SIGKILL)
        holder.wait()
    assert os.listdir(out) == [files.LOCK_FILE]  # a killed holder cannot remove its lock file ...
    with files.run_folder_lock(str(out)) as stale:  # ... but nobody holds it: it is taken over
        assert stale is not None and f"pid {holder.pid}" in stale
    assert os.listdir(out) == []
    files.check_run_folder(str(out), overwrite=False)  # a folder holding only a lock file is empty


def test_an_interrupt_in_the_report_phase_leaves_interrupted_and_check_says_unfinished(
    tmp_path, no_processes, monkeypatch, capsys
):
    from prism_megatron.report import writer

    render = writer.render

    def interrupted_render(report, out_dir, **kwargs):
        written = render(report, out_dir, **kwargs)  # report.md and the plots are on disk ...
        os.kill(os.getpid(), signal.SIGINT)  # ... and Ctrl-C comes before report.json
        return written

    monkeypatch.setattr(writer, "render", interrupted_render)
    out = tmp_path / "run"
    with processes.stop_signals(), pytest.raises(processes.StopRequested):
        driver.run(_plan(out))
    doc = json.loads((out / files.REPORT_JSON).read_text())
    assert doc["status"] == "interrupted"
    assert "interrupted by SIGINT during report" in doc["failure"]["message"]
    status, text = _check(out, capsys)
    assert status == 1 and "not finished" in text and "status interrupted" in text
    assert not (out / files.LOCK_FILE).exists()


def test_an_error_in_the_report_phase_leaves_failed(tmp_path, no_processes, monkeypatch, capsys):
    from prism_megatron.report import writer

    def no_space(*args, **kwargs):
        raise OSError(28, "No space left on device")

    monkeypatch.setattr(writer, "render", no_space)
    out = tmp_path / "run"
    with pytest.raises(OSError, match="No space"):
        driver.run(_plan(out))
    doc = json.loads((out / files.REPORT_JSON).read_text())
    assert doc["status"] == "failed" and "OSError during report" in doc["failure"]["message"]
    assert _check(out, capsys)[0] == 1


def test_check_calls_a_report_with_a_listed_file_missing_unfinished(tmp_path, no_processes, capsys):
    out = tmp_path / "run"
    assert driver.run(_plan(out)).ok
    (out / files.REPORT_MD).unlink()
    status, text = _check(out, capsys)
    assert status == 1 and "not finished" in text and "report.md missing" in text


FULL_DISK = textwrap.dedent(
    """
    import json, os, sys
    sys.path.insert(0, {tests!r})
    from prism_megatron import files
    from prism_megatron.emulation import driver
    from prism_megatron.report import writer
    import test_run_folder as t

    out = os.path.join({mount!r}, "run")
    driver.obtain_graph = lambda plan, progress, walls: t.GRAPH
    driver.emulate = lambda plan, progress, walls: files.write_json(
        {{"virtual_rank": 0}}, files.results_path(plan.out_dir, 0)
    )
    render = writer.render

    def render_on_a_full_disk(report, out_dir, **kwargs):
        stat = os.statvfs(out_dir)
        with open(os.path.join({mount!r}, "filler"), "wb") as f:  # what the disk has left, taken
            f.write(b"x" * (stat.f_bavail * stat.f_frsize))
        return render(report, out_dir, **kwargs)

    writer.render = render_on_a_full_disk
    try:
        driver.run(t._plan(out))
    except OSError as exc:
        print("raised", exc.errno)
    with open(os.path.join(out, "report.json"), encoding="utf-8") as f:
        print("status", json.load(f)["status"])
    print("report.md", os.path.exists(os.path.join(out, "report.md")))
    """
)


def test_a_full_disk_in_the_report_phase_never_leaves_ok(tmp_path):
    if shutil.which("unshare") is None:
        pytest.skip("no unshare to mount a small tmpfs")
    mount = tmp_path / "disk"
    mount.mkdir()
    script = FULL_DISK.format(tests=os.path.dirname(__file__), mount=str(mount))
    probe = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f"mount -t tmpfs -o size=512k tmpfs {mount}"], capture_output=True
    )
    if probe.returncode != 0:
        pytest.skip(f"cannot mount a tmpfs here: {probe.stderr.decode().strip()}")
    result = subprocess.run(
        ["unshare", "-rm", "sh", "-c", f'mount -t tmpfs -o size=512k tmpfs {mount} && exec "$0" -c "$1"',
         sys.executable, script],
        capture_output=True, text=True, timeout=300, env={**os.environ, "PYTHONWARNINGS": "ignore"},
    )  # fmt: skip
    lines = result.stdout.split("\n")
    assert "raised 28" in lines, result.stdout + result.stderr
    status = next(line.split()[1] for line in lines if line.startswith("status"))
    assert status in ("failed", "running"), status  # "failed" when it fit, else the start's "running"


def _user_folder(root) -> dict[str, str]:
    """A folder of the user's own files, named as a run's entries are."""
    made = {"logs/train.log": "mine\n", "plots/loss.png": "mine\n", "capture/notes.txt": "mine\n",
            "notes.md": "mine\n"}  # fmt: skip
    for name, text in made.items():
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        (root / name).write_text(text)
    return made


def test_overwrite_refuses_a_folder_that_never_held_a_run_and_keeps_its_files(tmp_path, capsys):
    out = tmp_path / "mine"
    out.mkdir()
    made = _user_folder(out)
    status = cli.main(["emulate", "--", *JOB, "--prism-out", str(out), "--prism-overwrite"])
    err = [line for line in capsys.readouterr().err.strip().splitlines() if "warn" not in line.lower()]
    assert status == 2 and len(err) == 1 and "no run of ours" in err[0] and "--prism-overwrite" in err[0]
    assert all((out / name).read_text() == text for name, text in made.items())
    assert sorted(os.listdir(out)) == ["capture", "logs", "notes.md", "plots"]


def test_overwrite_replaces_a_run_never_following_a_link_out_and_keeps_other_files(tmp_path, no_processes):
    out = tmp_path / "run"
    assert driver.run(_plan(out)).ok
    elsewhere = tmp_path / "elsewhere"
    elsewhere.mkdir()
    (elsewhere / "precious.log").write_text("keep\n")
    (out / files.LOGS_DIR).symlink_to(elsewhere, target_is_directory=True)
    (out / "notes.md").write_text("mine\n")
    assert driver.run(_plan(out, "--prism-overwrite")).ok
    assert (elsewhere / "precious.log").read_text() == "keep\n"  # the link went, not what it points to
    assert not (out / files.LOGS_DIR).is_symlink() and (out / "notes.md").read_text() == "mine\n"
    assert _status(out) == "ok"


def test_overwrite_refuses_a_linked_report_and_a_linked_run_folder(tmp_path, no_processes):
    run = tmp_path / "run"
    assert driver.run(_plan(run)).ok
    linked = tmp_path / "linked"
    linked.symlink_to(run, target_is_directory=True)
    with pytest.raises(ValueError, match="is a symbolic link; --prism-overwrite replaces only a real"):
        _plan(linked, "--prism-overwrite")
    other = tmp_path / "other"
    other.mkdir()
    (other / files.REPORT_JSON).symlink_to(run / files.REPORT_JSON)
    with pytest.raises(ValueError, match="no run of ours"):
        _plan(other, "--prism-overwrite")
    assert (run / files.REPORT_JSON).is_file() and _status(run) == "ok"
