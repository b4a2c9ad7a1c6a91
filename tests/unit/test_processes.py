"""The orchestrator's processes: a launcher and the workers it starts in sessions of their own end
within seconds of `stop`, even those that ignore SIGTERM; SIGTERM becomes StopRequested."""

from __future__ import annotations

import os
import signal
import sys
import time

import pytest

from prism_megatron.emulation import processes

# A launcher that, like torchrun, starts two workers in new sessions; one ignores SIGTERM.
LAUNCHER = """
import signal, subprocess, sys, time
worker = "import signal, time; signal.signal(signal.SIGTERM, signal.SIG_IGN) if sys.argv[1] == 'stubborn' else None; time.sleep(600)"
for kind in ("plain", "stubborn"):
    subprocess.Popen([sys.executable, "-c", "import sys\\n" + worker, kind], start_new_session=True)
print("started", flush=True)
time.sleep(600)
"""


def _alive(pid: int) -> bool:
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


@pytest.mark.skipif(not os.path.isdir("/proc"), reason="finds the workers through /proc")
def test_stop_ends_the_launcher_and_every_worker_within_the_grace_period():
    import subprocess

    launcher = processes.start([sys.executable, "-c", LAUNCHER], stdout=subprocess.PIPE, text=True)
    assert launcher.stdout.readline().strip() == "started"
    deadline = time.monotonic() + 30
    while len(processes.descendants(launcher.pid)) < 2 and time.monotonic() < deadline:
        time.sleep(0.05)
    workers = processes.descendants(launcher.pid)
    assert len(workers) == 2
    assert all(os.getpgid(pid) == pid for pid in workers), "each worker leads a session of its own"
    started_s = time.monotonic()
    processes.stop(launcher, grace_s=1.0)
    took_s = time.monotonic() - started_s
    deadline = time.monotonic() + 5
    while any(_alive(pid) for pid in workers) and time.monotonic() < deadline:
        time.sleep(0.05)
    assert launcher.poll() is not None and not any(_alive(pid) for pid in workers)
    assert took_s < 1.0 + 2.0, f"stop took {took_s:.1f} s"


def test_sigterm_and_sighup_become_stop_requests_while_a_run_lasts():
    for signum in (signal.SIGTERM, signal.SIGHUP, signal.SIGINT):
        with pytest.raises(processes.StopRequested) as stopped, processes.stop_signals():
            os.kill(os.getpid(), signum)
            time.sleep(5)  # the handler raises first
        assert stopped.value.signal_name == signal.Signals(signum).name
        assert stopped.value.exit_status == 128 + signum
        assert isinstance(stopped.value, KeyboardInterrupt), "the Ctrl-C path handles it too"
    assert signal.getsignal(signal.SIGTERM) == signal.SIG_DFL, "the handlers are put back"
    with pytest.raises(processes.StopRequested), processes.stop_signals():
        try:
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(5)
        finally:  # writing the report: a second signal must not cut it short
            os.kill(os.getpid(), signal.SIGTERM)
            time.sleep(0.2)
    assert processes.as_stop(KeyboardInterrupt()).signal_name == "SIGINT"
