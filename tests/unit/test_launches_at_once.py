"""`launches.run_launches`: several launches at the same time (a modelled GPU's capture passes), each
one's wall time reported as it ends, the first failure stopping the others.

The launcher command is a stand-in (a Python one-liner per launch) so that what is tested is the
scheduling: how many run at once, in which order they start, what a failure does to the rest.
"""

from __future__ import annotations

import sys
import time

import pytest

from prism_megatron.emulation import launches
from prism_megatron.emulation.launches import Launch, LaunchFailed, run_launches
from prism_megatron.emulation.progress import Progress

SCRIPT = """
import os, sys, time
name, seconds, status = sys.argv[1], float(sys.argv[2]), int(sys.argv[3])
with open(os.path.join(sys.argv[4], name + ".start"), "w") as f:
    f.write(repr(time.monotonic()))
time.sleep(seconds)
with open(os.path.join(sys.argv[4], name + ".end"), "w") as f:
    f.write(repr(time.monotonic()))
sys.exit(status)
"""


@pytest.fixture
def stand_in(monkeypatch, tmp_path):
    """Each launch's flags are (seconds, exit status): its process sleeps that long and exits so."""
    marks = tmp_path / "marks"
    marks.mkdir()

    def command(launch, script, user_args, log_dir):
        seconds, status = launch.flags
        return [sys.executable, "-c", SCRIPT, launch.name, seconds, status, str(marks)]

    monkeypatch.setattr(launches, "command", command)
    return marks


def _launch(tmp_path, name: str, seconds: float, status: int = 0) -> Launch:
    out = tmp_path / "capture"
    out.mkdir(exist_ok=True)
    return Launch(name=name, ranks=(0,), out_dir=str(out), flags=(str(seconds), str(status)))


def _run(tmp_path, items, at_once: int) -> dict[str, float]:
    ended: dict[str, float] = {}
    run_launches(
        items, at_once=at_once, script="builtin", user_args=(), run_dir=str(tmp_path),
        progress=Progress(quiet=True), on_end=lambda launch, s: ended.__setitem__(launch.name, s),
    )  # fmt: skip
    return ended


def _mark(marks, name: str, which: str) -> float:
    return float((marks / f"{name}.{which}").read_text())


def test_two_at_once_overlap_and_each_reports_its_own_wall_time(stand_in, tmp_path):
    items = [_launch(tmp_path, f"capture-{n}", 1.0) for n in (1, 2, 3)]
    ended = _run(tmp_path, items, at_once=2)
    assert sorted(ended) == ["capture-1", "capture-2", "capture-3"]
    assert all(s >= 1.0 for s in ended.values())
    # capture-1 and capture-2 ran at the same time; capture-3 started only when one of them ended.
    assert _mark(stand_in, "capture-2", "start") < _mark(stand_in, "capture-1", "end")
    first_end = min(_mark(stand_in, f"capture-{n}", "end") for n in (1, 2))
    assert _mark(stand_in, "capture-3", "start") >= first_end


def test_one_at_a_time_runs_them_in_order(stand_in, tmp_path):
    items = [_launch(tmp_path, f"capture-{n}", 0.2) for n in (1, 2)]
    _run(tmp_path, items, at_once=1)
    assert _mark(stand_in, "capture-2", "start") >= _mark(stand_in, "capture-1", "end")


def test_a_failed_launch_is_raised_and_stops_the_one_beside_it(stand_in, tmp_path):
    items = [_launch(tmp_path, "capture-1", 0.2, status=3), _launch(tmp_path, "capture-2", 60.0)]
    start = time.monotonic()
    with pytest.raises(LaunchFailed, match=r"capture-1 launch .* failed: exit status 3"):
        _run(tmp_path, items, at_once=2)
    assert time.monotonic() - start < 30.0  # capture-2 was stopped, not waited for
    assert not (stand_in / "capture-2.end").exists()


def test_at_once_below_one_is_refused(tmp_path):
    with pytest.raises(ValueError, match="at_once must be >= 1, got 0"):
        _run(tmp_path, [], at_once=0)


@pytest.mark.parametrize(
    ("modelled", "cores", "available", "expected"),
    [
        (False, 16, 64 << 30, 1),  # a measured pass has the machine's share to itself
        (True, 2, 24 << 30, 12),  # modelled: as many as memory holds (2 GiB each) ...
        (True, 2, 3 << 30, 2),  # ... at least one per core
        (True, 4, None, 4),  # no /proc/meminfo: one per core
    ],
)
def test_modelled_capture_passes_run_as_many_at_once_as_memory_allows(
    monkeypatch, modelled, cores, available, expected
):
    from types import SimpleNamespace

    from prism_megatron.emulation import driver

    monkeypatch.setattr(driver.os, "sched_getaffinity", lambda pid: set(range(cores)), raising=False)
    monkeypatch.setattr(driver, "_available_memory_bytes", lambda: available)
    assert driver.capture_at_once(SimpleNamespace(modelled=modelled)) == expected
