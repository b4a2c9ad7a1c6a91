"""One launch of real processes: torch's own launcher (`torch.distributed.run`) on this machine.

Each launch starts one process per rank of a batch, `python -m prism_megatron.launch SCRIPT` with
the user's flags plus the launch's own (`--prism-ranks`, `--prism-phase`, `--prism-out`). Their
output goes to files under `<run>/logs/<launch>/` (torchrun's per-process stdout.log and
stderr.log, and the launcher's own launcher.log), so the terminal shows only the progress line.

When a process dies, torchrun stops the others at once (SIGTERM; SIGKILL after its grace period)
and exits non-zero, naming the first process that failed ("Root Cause"). `LaunchFailed` then says
which virtual rank that was, how it ended, how far it got (its progress file), its last op (the
flight recorder it printed on an uncaught exception) and the last error line it wrote.

When a process hangs, its watchdog (`watchdog.py`) leaves a verdict in `<out>/watchdog/`; the
launch then waits a moment for every process's stacks and flight recorder, stops everything and
fails naming the hung rank, the pass, where it was and its last op. Interrupted (Ctrl-C, SIGTERM),
the launch stops every process it started within seconds (`processes.stop`).
"""

from __future__ import annotations

import dataclasses
import glob
import os
import re
import signal
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from typing import IO

from prism_megatron import files
from prism_megatron.emulation import processes
from prism_megatron.emulation.progress import Progress
from prism_megatron.passes import watchdog
from prism_megatron.passes.rank import read_progress

POLL_S = 0.3
DUMP_WAIT_S = 5.0
"""How long a hung launch waits for every process's stacks before it is stopped."""
_ROOT_CAUSE = re.compile(r"Root Cause.*?rank\s*:\s*(\d+).*?exitcode\s*:\s*(-?\d+)", re.S)
_ERROR_LINE = re.compile(r"^(?:\w+\.)*\w*(?:Error|Exception)\b.*|^prism\S*: .*")


@dataclasses.dataclass(frozen=True)
class Launch:
    """One start of real processes."""

    name: str
    """A label, also the log folder's name ("capture-1", "emulate")."""
    ranks: tuple[int, ...]
    """Virtual ranks by physical rank (process i runs ranks[i])."""
    out_dir: str
    """The processes' --prism-out."""
    flags: tuple[str, ...]
    """Flags added after the user's."""
    num_iterations: int | None = None


class RunFailed(RuntimeError):
    """A phase of the run could not complete; the message says why and what to do."""

    def __init__(self, message: str, *, dead_rank: int | None = None, last_op: str | None = None) -> None:
        super().__init__(message)
        self.dead_rank = dead_rank
        self.last_op = last_op


class LaunchFailed(RunFailed):
    """A launch ended with a failed process."""


def command(launch: Launch, script: str, user_args: Sequence[str], log_dir: str) -> list[str]:
    ranks = ",".join(str(r) for r in launch.ranks)
    return [
        sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc-per-node={len(launch.ranks)}",
        f"--log-dir={log_dir}", "--redirects=3",
        "-m", "prism_megatron.launch", script, *user_args,
        "--prism-ranks", ranks, "--prism-out", launch.out_dir, *launch.flags,
    ]  # fmt: skip


def run_launch(
    launch: Launch, *, script: str, user_args: Sequence[str], run_dir: str, progress: Progress
) -> None:
    """Start the launch and wait for it, updating `progress`.

    Raises:
        LaunchFailed: a process failed (see the module docstring).
    """
    run_launches([launch], at_once=1, script=script, user_args=user_args, run_dir=run_dir, progress=progress)


def run_launches(
    launches: Sequence[Launch],
    *,
    at_once: int,
    script: str,
    user_args: Sequence[str],
    run_dir: str,
    progress: Progress,
    on_end: Callable[[Launch, float], None] | None = None,
) -> None:
    """Run the launches, up to `at_once` of them at the same time, in their order; each one's wall
    time (seconds from its start to its end) goes to `on_end` as it ends.

    At once only where the launches' processes do not measure time (a modelled GPU's captures, each
    process alone): a measured pass must have the machine's share it is given to itself. The first
    launch that fails stops the others (their processes too) and is raised.

    Raises:
        LaunchFailed: a process failed (see the module docstring).
    """
    if at_once < 1:
        raise ValueError(f"run_launches: at_once must be >= 1, got {at_once}")
    waiting = list(launches)
    running: list[_Running] = []
    try:
        while waiting or running:
            while waiting and len(running) < at_once:
                running.append(_start(waiting.pop(0), script, user_args, run_dir))
            for item in list(running):
                if item.process.poll() is None:
                    hung = _own_verdicts(item.launch)
                    if hung:
                        _await_dumps(item.launch, item.process)
                        raise hung_failure(item.launch, _own_verdicts(item.launch))
                    continue
                running.remove(item)
                item.log.close()
                if item.process.returncode != 0:
                    hung = _own_verdicts(item.launch)
                    raise (
                        hung_failure(item.launch, hung)
                        if hung
                        else diagnose(item.launch, item.launcher_log, item.log_dir, item.process.returncode)
                    )
                if on_end is not None:
                    on_end(item.launch, time.monotonic() - item.started_s)
            if running:
                progress.update("; ".join(_describe(item.launch) for item in running))
                time.sleep(POLL_S)
    finally:
        for item in running:  # a failure, an interrupt: nothing this call started outlives it
            processes.stop(item.process)
            item.log.close()


def _own_verdicts(launch: Launch) -> list[watchdog.Verdict]:
    """The watchdog verdicts of this launch's processes (launches at once share a --prism-out, so
    the folder may hold another's); one without a virtual rank is kept, as it cannot be placed."""
    return [
        v
        for v in watchdog.verdicts(launch.out_dir)
        if v.virtual_rank is None or v.virtual_rank in launch.ranks
    ]


@dataclasses.dataclass
class _Running:
    launch: Launch
    process: subprocess.Popen
    log: IO[str]
    launcher_log: str
    log_dir: str
    started_s: float


def _start(launch: Launch, script: str, user_args: Sequence[str], run_dir: str) -> _Running:
    log_dir = os.path.join(run_dir, files.LOGS_DIR, launch.name)
    os.makedirs(log_dir, exist_ok=True)
    launcher_log = os.path.join(log_dir, files.LAUNCHER_LOG)
    env = {**os.environ, "OMP_NUM_THREADS": os.environ.get("OMP_NUM_THREADS", "1")}
    log = open(launcher_log, "w", encoding="utf-8")  # noqa: SIM115 (closed when the launch ends)
    try:
        process = processes.start(
            command(launch, script, user_args, log_dir), stdout=log, stderr=subprocess.STDOUT, env=env
        )
    except BaseException:
        log.close()
        raise
    return _Running(launch, process, log, launcher_log, log_dir, time.monotonic())


def _await_dumps(launch: Launch, process: subprocess.Popen) -> None:
    """Give every process of the launch a moment to leave its stacks in watchdog/."""
    deadline_s = time.monotonic() + DUMP_WAIT_S
    while time.monotonic() < deadline_s and process.poll() is None:
        if watchdog.num_dumped(launch.out_dir) >= len(launch.ranks):
            return
        time.sleep(0.1)


def hung_failure(launch: Launch, hung: Sequence[watchdog.Verdict]) -> LaunchFailed:
    """The failure of a launch whose watchdogs found processes hung: the first to stall is named;
    the others (often waiting on it in an op) are listed with where they stopped."""

    def virtual_rank(verdict: watchdog.Verdict) -> int | None:
        if verdict.virtual_rank is None and verdict.physical_rank < len(launch.ranks):
            return launch.ranks[verdict.physical_rank]
        return verdict.virtual_rank

    first = hung[0]
    also = "".join(
        f"; virtual rank {virtual_rank(v)} stalled {v.stalled_since_unix_s - first.stalled_since_unix_s:.1f} s "
        f"later, {v.stage}, last op: {v.last_op or 'none'}"
        for v in hung[1:]
    )
    folder = os.path.join(launch.out_dir, files.WATCHDOG_DIR)
    message = (
        f"virtual rank {virtual_rank(first)} (process {first.physical_rank}) made no progress for "
        f"{first.stalled_s:.0f} s (--prism-timeout) in the {launch.name} pass, {first.stage}, at {first.where}; "
        f"last op: {first.last_op or 'none'}{also}; every rank's Python stacks and flight recorder are in {folder}"
    )
    return LaunchFailed(message, dead_rank=virtual_rank(first), last_op=first.last_op)


def _describe(launch: Launch) -> str:
    done = []
    for rank in launch.ranks:
        state = read_progress(files.progress_path(launch.out_dir, rank))
        done.append(state["iterations_done"] if state else 0)
    total = f"/{launch.num_iterations}" if launch.num_iterations else ""
    if not any(done):
        return f"ranks {_ranks(launch.ranks)} starting"
    return f"ranks {_ranks(launch.ranks)} at iteration {min(done)}{total}"


def _ranks(ranks: Sequence[int]) -> str:
    return ", ".join(map(str, ranks)) if len(ranks) <= 4 else f"{ranks[0]}, ... ({len(ranks)} ranks)"


def diagnose(launch: Launch, launcher_log: str, log_dir: str, returncode: int) -> LaunchFailed:
    """What went wrong in a failed launch, from torchrun's summary and the processes' own logs."""
    text = _read(launcher_log)
    match = _ROOT_CAUSE.search(text)
    if match is None:
        errors = [line for line in text.splitlines() if _ERROR_LINE.match(line.strip())]
        reason = errors[-1].strip() if errors else f"exit status {returncode}"
        return LaunchFailed(f"the {launch.name} launch of ranks {_ranks(launch.ranks)} failed: {reason}")
    physical, exitcode = int(match.group(1)), int(match.group(2))
    dead = launch.ranks[physical] if physical < len(launch.ranks) else None
    stderr = _read_rank_log(log_dir, physical, "stderr.log")
    last_op = watchdog.last_op(stderr)
    state = read_progress(files.progress_path(launch.out_dir, dead)) if dead is not None else None
    how = (
        f"was killed by {signal.Signals(-exitcode).name}"
        if exitcode < 0
        else f"exited with status {exitcode}"
    )
    where = f"after {state['iterations_done']} iterations" if state else "before its first iteration"
    parts = [f"virtual rank {dead} (process {physical}) {how} in the {launch.name} pass, {where}"]
    parts.append(
        f"last op: {last_op}" if last_op else "last op: not recorded (the process printed no flight recorder)"
    )
    errors = [line.strip() for line in stderr.splitlines() if _ERROR_LINE.match(line.strip())]
    if errors:
        parts.append(f"error: {errors[-1]}")
    return LaunchFailed("; ".join(parts), dead_rank=dead, last_op=last_op)


def _read(path: str) -> str:
    try:
        with open(path, encoding="utf-8", errors="replace") as f:
            return f.read()
    except OSError:
        return ""


def _read_rank_log(log_dir: str, physical_rank: int, name: str) -> str:
    paths = glob.glob(os.path.join(log_dir, "*", "attempt_*", str(physical_rank), name))
    return _read(sorted(paths)[-1]) if paths else ""
