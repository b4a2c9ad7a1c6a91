"""The orchestrator's processes: started so that none outlives the command, stopped within seconds.

torch's launcher starts each worker in a session of its own (`start_new_session`), so signalling the
launcher's process group does not reach them: on SIGTERM the launcher forwards the signal itself
and waits up to 30 s, and a launcher that is killed outright leaves its workers running under PID 1.
So `stop` finds the launcher's descendants first (from /proc, on Linux), asks the launcher and every
descendant's group to end (SIGTERM), and kills what is left after `STOP_GRACE_S` (SIGKILL): every
process is gone within `STOP_GRACE_S` plus a moment. The workers also watch their launcher and the
orchestrator themselves (`watchdog.py`), so even an orchestrator killed with SIGKILL takes them down.

`stop_signals` turns SIGINT, SIGTERM and SIGHUP into `StopRequested` (a KeyboardInterrupt) while a
run lasts, so every phase unwinds through the same path: stop the launch, write the report as
"interrupted", exit 128 + the signal's number. Only the first signal counts: a second one (an
impatient Ctrl-C) must not cut the report short; SIGKILL still ends the command at once.
"""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import time
from collections.abc import Iterator, Sequence

from prism_megatron.passes.watchdog import ORCHESTRATOR_ENV

STOP_GRACE_S = 5.0
"""How long a stopped launch may take to end on SIGTERM before what is left is killed."""
_STOP_SIGNALS = (signal.SIGINT, signal.SIGTERM, signal.SIGHUP)


class StopRequested(KeyboardInterrupt):
    """The command was asked to stop (SIGINT, SIGTERM or SIGHUP)."""

    def __init__(self, signum: int = signal.SIGINT) -> None:
        super().__init__(signal.Signals(signum).name)
        self.signum = signum

    @property
    def signal_name(self) -> str:
        return signal.Signals(self.signum).name

    @property
    def exit_status(self) -> int:
        return 128 + self.signum


def as_stop(exc: KeyboardInterrupt) -> StopRequested:
    """A KeyboardInterrupt as a StopRequested (a plain Ctrl-C is SIGINT)."""
    return exc if isinstance(exc, StopRequested) else StopRequested(signal.SIGINT)


@contextlib.contextmanager
def stop_signals() -> Iterator[None]:
    """While the block runs, the first SIGINT, SIGTERM or SIGHUP raises StopRequested in the main
    thread; later ones are ignored while the run stops."""
    received: list[int] = []

    def raise_stop(signum, _frame):
        received.append(signum)
        if len(received) == 1:
            raise StopRequested(signum)

    previous = {signum: signal.signal(signum, raise_stop) for signum in _STOP_SIGNALS}
    try:
        yield
    finally:
        for signum, handler in previous.items():
            signal.signal(signum, handler)


def start(command: Sequence[str], *, env: dict[str, str] | None = None, **popen_kwargs) -> subprocess.Popen:
    """Start a launcher in a session of its own, telling its workers who the orchestrator is."""
    env = {**(os.environ if env is None else env), ORCHESTRATOR_ENV: str(os.getpid())}
    return subprocess.Popen(list(command), env=env, start_new_session=True, **popen_kwargs)


def wait(process: subprocess.Popen, *, poll_s: float = 0.3) -> int:
    """Wait for a launcher; on StopRequested (or Ctrl-C) stop it and everything it started, re-raise."""
    try:
        while process.poll() is None:
            time.sleep(poll_s)
    except BaseException:
        stop(process)
        raise
    return process.returncode


def stop(process: subprocess.Popen, *, grace_s: float = STOP_GRACE_S) -> None:
    """End the launcher and every process under it: SIGTERM, then SIGKILL after `grace_s`."""
    under = descendants(process.pid)
    groups = {process.pid, *(_group_of(pid) for pid in under)} - {None, 0, os.getpgrp()}
    pids = [process.pid, *under]
    _signal_groups(groups, signal.SIGTERM)
    deadline_s = time.monotonic() + grace_s
    while time.monotonic() < deadline_s and any(_alive(pid, process) for pid in pids):
        time.sleep(0.1)
    if any(_alive(pid, process) for pid in pids):
        _signal_groups(groups, signal.SIGKILL)
        for pid in pids[1:]:
            with contextlib.suppress(ProcessLookupError, PermissionError):
                os.kill(pid, signal.SIGKILL)
    with contextlib.suppress(subprocess.TimeoutExpired):
        process.wait(timeout=grace_s)


def descendants(pid: int) -> list[int]:
    """Every process under `pid` (children, theirs ...), from /proc; [] where there is no /proc."""
    children: dict[int, list[int]] = {}
    for entry in _proc_entries():
        stat = _stat(entry)
        if stat is not None:
            children.setdefault(stat[0], []).append(entry)
    found, todo = [], [pid]
    while todo:
        for child in children.get(todo.pop(), []):
            found.append(child)
            todo.append(child)
    return found


def _proc_entries() -> list[int]:
    try:
        return [int(name) for name in os.listdir("/proc") if name.isdigit()]
    except OSError:
        return []


def _stat(pid: int) -> tuple[int, int] | None:
    """(parent pid, process group) of a process, None when it is gone."""
    try:
        with open(f"/proc/{pid}/stat", encoding="ascii", errors="replace") as f:
            fields = f.read().rsplit(")", 1)[1].split()
    except (OSError, IndexError):
        return None
    return int(fields[1]), int(fields[2])


def _group_of(pid: int) -> int | None:
    stat = _stat(pid)
    return stat[1] if stat else None


def _signal_groups(groups: set[int | None], signum: int) -> None:
    for group in groups:
        with contextlib.suppress(ProcessLookupError, PermissionError):
            os.killpg(group, signum)


def _alive(pid: int, process: subprocess.Popen) -> bool:
    if pid == process.pid:
        return process.poll() is None
    stat_path = f"/proc/{pid}/stat"
    try:
        with open(stat_path, encoding="ascii", errors="replace") as f:
            state = f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return False
    return state != "Z"  # a zombie has ended; its parent reaps it
