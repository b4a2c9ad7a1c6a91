"""The rank watchdog: a real process that stops making progress fails the run and says where it was.

The replay engine and the real sub-communicators already time out a wait on a peer
(--prism-timeout); nothing timed out a rank that hangs *outside* an op: a script that sleeps, a
dataloader that blocks, a deadlock in Python. So every real process of an emulation runs this
watchdog, a daemon thread that looks twice a second (`poll_s`) at what a healthy rank keeps changing:

* the op log's activity (ops issued plus ops completed, `replay.op_activity`),
* the iterations begun and ended (`iteration_begins` / `iteration_ends`, called by the passes),
* the modules imported (a rank importing Megatron is busy, not stuck).

When none of them moved for --prism-timeout seconds (to within one look, and never later, so that
a hung rank is named before a peer waiting on it times out in its op) the rank is hung. It writes
into `<its --prism-out>/watchdog/`:

* `rank-<v>.hung.json`: the verdict (`Verdict`: who, which pass, for how long, where its main thread
  was, its last op),
* `rank-<v>.stacks.txt`: every thread's Python stack (`faulthandler`),
* `rank-<v>.flight-recorder.txt`: the op log's last ops (the backend's flight recorder).

Every other real process of the launch watches the same folder and, seeing a verdict, dumps its own
stacks and flight recorder there, so the run folder shows where every rank was. The orchestrator
(`launches.py`) then names the rank and stops the launch. A process that nobody stops (launched by
hand) exits after `GRACE_S` with status `HUNG_EXIT_STATUS`, so its launcher ends the others.

A run never outlives its command: a process whose launcher (torchrun) or orchestrator (the
`prism-megatron emulate` that started it, `ORCHESTRATOR_ENV`) is gone exits at once. And if this
thread itself cannot run (a C call holding the GIL), `faulthandler.dump_traceback_later`, re-armed
on every look, dumps the stacks to stderr and ends the process `BACKSTOP_S` after the timeout.
"""

from __future__ import annotations

import dataclasses
import faulthandler
import json
import os
import re
import sys
import sysconfig
import tempfile
import threading
import time
import traceback

from prism_megatron import files

HUNG_EXIT_STATUS = 124
"""Exit status of a hung process that no orchestrator stopped (the status `timeout(1)` uses)."""
GONE_EXIT_STATUS = 143
"""Exit status of a process whose launcher or orchestrator is gone (128 + SIGTERM)."""
GRACE_S = 20.0
"""How long a hung process waits for its orchestrator to stop the launch before it exits itself."""
BACKSTOP_S = 30.0
"""Beyond the timeout, how long this thread may be starved before faulthandler ends the process."""
ORCHESTRATOR_ENV = "PRISM_ORCHESTRATOR_PID"
"""Set by `prism-megatron emulate` for the processes it starts: its own pid."""

_RECORDER_LINE = re.compile(r"^\s+#\d+ ")


@dataclasses.dataclass(frozen=True)
class Verdict:
    """A hung rank, as its watchdog found it."""

    label: str
    """"rank-00008", or "process-1" when the process did not know its virtual rank yet."""
    virtual_rank: int | None
    physical_rank: int
    pid: int
    phase: str
    """The pass: capture, emulate or instant."""
    stalled_s: float
    stalled_since_unix_s: float
    """When it last made progress (wall clock): the rank that stalled first is the cause."""
    where: str
    """The main thread's innermost frames, innermost first ("HANG.py:3 in <module>")."""
    stage: str
    """How far the rank got ("before its first iteration", "in iteration 3")."""
    last_op: str | None

    @classmethod
    def load(cls, path: str) -> Verdict | None:
        try:
            with open(path, encoding="utf-8") as f:
                return cls(**json.load(f))
        except (OSError, ValueError, TypeError):
            return None


def verdicts(out_dir: str) -> list[Verdict]:
    """The hung ranks' verdicts in a process folder (--prism-out), the first to stall first."""
    found = (Verdict.load(p) for p in files.watchdog_paths(out_dir, files.HUNG_SUFFIX))
    return sorted((v for v in found if v is not None), key=lambda v: v.stalled_since_unix_s)


def num_dumped(out_dir: str) -> int:
    """How many processes have dumped their stacks into the folder's watchdog/."""
    return len(files.watchdog_paths(out_dir, files.STACKS_SUFFIX))


def last_op(flight_recorder: str) -> str | None:
    """The newest op of a flight-recorder dump ("#41 ALL_REDUCE on group ..."), None without ops."""
    lines = [line.strip() for line in flight_recorder.splitlines() if _RECORDER_LINE.match(line)]
    return lines[-1] if lines else None


class RankWatchdog:
    """One process's watchdog (see the module docstring); `look` is one look, the thread loops it."""

    def __init__(
        self,
        *,
        out_dir: str,
        timeout_s: float,
        phase: str,
        physical_rank: int,
        virtual_rank: int | None = None,
        launcher_pid: int | None = None,
        orchestrator_pid: int | None = None,
    ) -> None:
        self.out_dir = out_dir
        self.timeout_s = timeout_s
        self.phase = phase
        self.physical_rank = physical_rank
        self.virtual_rank = virtual_rank
        self.launcher_pid = launcher_pid
        self.orchestrator_pid = orchestrator_pid
        self.poll_s = min(0.5, timeout_s / 20)
        self.iterations_begun = 0
        self.iterations_ended = 0
        self.beats = 0
        self._event_ns = 0
        """`time.monotonic_ns()` of the last `note`."""
        self.hung_at_s: float | None = None
        self.dumped = False
        self._seen: tuple = ()
        self._progress_s = self._looked_s = time.monotonic()
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    @property
    def label(self) -> str:
        return files.process_label(self.virtual_rank, self.physical_rank)

    def path(self, suffix: str) -> str:
        return files.watchdog_path(self.out_dir, self.label, suffix)

    # ---- the thread --------------------------------------------------------------------------

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, name="prism-watchdog", daemon=True)
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        faulthandler.cancel_dump_traceback_later()
        if self._thread is not None and self._thread is not threading.current_thread():
            self._thread.join(timeout=5)

    def _loop(self) -> None:
        while not self._stop.wait(self.poll_s):
            faulthandler.dump_traceback_later(self.timeout_s + BACKSTOP_S, exit=True, file=sys.__stderr__)
            self.look(time.monotonic())

    def note(self, event: str) -> None:
        """A Python-side step: "beat", "begin" or "end" (of an iteration)."""
        if event == "begin":
            self.iterations_begun += 1
        elif event == "end":
            self.iterations_ended += 1
        else:
            self.beats += 1
        self._event_ns = time.monotonic_ns()

    def look(self, now_s: float) -> None:
        """One look: the launcher and orchestrator, progress, this rank's verdict, the peers'."""
        gone = self._gone()
        if gone:
            print(f"prism watchdog: {gone}; this process stops", file=sys.stderr, flush=True)
            os._exit(GONE_EXIT_STATUS)
        self._observe(now_s)
        if self.hung_at_s is None and now_s - self._progress_s >= self.timeout_s - self.poll_s:
            self.hung_at_s = now_s
            verdict = dataclasses.asdict(self.verdict(now_s - self._progress_s))
            files.write_json(
                verdict, self.path(files.HUNG_SUFFIX), indent=1
            )  # first: the peers dump on seeing it
            self.dump()
        elif not self.dumped and verdicts(self.out_dir):
            self.dump()  # a peer hung: leave where this rank was, too
        if self.hung_at_s is not None and now_s - self.hung_at_s >= GRACE_S:
            os._exit(HUNG_EXIT_STATUS)

    def _observe(self, now_s: float) -> None:
        """Move the progress time to the newest stamp of what changed since the last look (an
        import has none: the last look), so a verdict is never late."""
        num_ops, op_ns = _op_activity()
        seen = (self.beats, self.iterations_begun, self.iterations_ended, num_ops, len(sys.modules))
        if seen != self._seen:
            stamps = [self._event_ns / 1e9, op_ns / 1e9]
            if seen[-1:] != self._seen[-1:]:
                stamps.append(self._looked_s)
            self._seen, self._progress_s = seen, max(self._progress_s, *stamps)
        self._looked_s = now_s

    def _gone(self) -> str | None:
        if self.launcher_pid is not None and os.getppid() != self.launcher_pid:
            return f"its launcher (pid {self.launcher_pid}) is gone"
        if self.orchestrator_pid is not None and not _alive(self.orchestrator_pid):
            return f"the prism-megatron emulate that started it (pid {self.orchestrator_pid}) is gone"
        return None

    # ---- what it leaves ----------------------------------------------------------------------

    def dump(self) -> None:
        """This process's stacks and flight recorder, into watchdog/ (once)."""
        self.dumped = True
        files.write_atomically(self.path(files.RECORDER_SUFFIX), _flight_recorder())
        with tempfile.TemporaryFile("w+", encoding="utf-8") as f:  # faulthandler writes to a descriptor
            faulthandler.dump_traceback(file=f, all_threads=True)
            f.seek(0)
            stacks = f.read()
        header = f"Python stacks of {self.label} (pid {os.getpid()}), {self.phase} pass\n"
        files.write_atomically(self.path(files.STACKS_SUFFIX), header + stacks)

    def verdict(self, stalled_s: float) -> Verdict:
        if self.iterations_begun == 0:
            stage = "before its first iteration"
        elif self.iterations_begun > self.iterations_ended:
            stage = f"in iteration {self.iterations_begun}"
        else:
            stage = f"after iteration {self.iterations_ended}"
        return Verdict(
            label=self.label, virtual_rank=self.virtual_rank, physical_rank=self.physical_rank,
            pid=os.getpid(), phase=self.phase, stalled_s=round(stalled_s, 1),
            stalled_since_unix_s=time.time() - stalled_s, where=main_thread_frames(), stage=stage,
            last_op=last_op(_flight_recorder()),
        )  # fmt: skip


def main_thread_frames() -> str:
    """Where the main thread is, innermost first: its two innermost frames and, when those are in
    Python's own library (a queue, a lock), the innermost frame outside it ('HANG.py:3 in <module>')."""
    frame = sys._current_frames().get(threading.main_thread().ident)
    if frame is None:
        return "unknown (the main thread has no Python frame)"
    frames = traceback.extract_stack(frame)
    shown = frames[-2:][::-1]
    stdlib = sysconfig.get_paths()["stdlib"]
    outside = [f for f in frames if not f.filename.startswith(stdlib) and not f.filename.startswith("<")]
    if outside and outside[-1] not in shown:
        shown.append(outside[-1])
    return " < ".join(f"{os.path.basename(f.filename)}:{f.lineno} in {f.name}" for f in shown)


def _flight_recorder() -> str:
    from prism_megatron import replay

    return replay.flight_recorder_dump()


def _op_activity() -> tuple[int, int]:
    from prism_megatron import replay

    return replay.op_activity()


def _alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


# ---- the process's one watchdog --------------------------------------------------------------

_active: RankWatchdog | None = None


def start(*, out_dir: str, timeout_s: float, phase: str, ranks_spec: str | None) -> RankWatchdog:
    """Start this process's watchdog (once; a second call returns the first)."""
    global _active
    if _active is not None:
        return _active
    physical_rank = int(os.environ.get("RANK", "0"))
    orchestrator = os.environ.get(ORCHESTRATOR_ENV)
    _active = RankWatchdog(
        out_dir=out_dir,
        timeout_s=timeout_s,
        phase=phase,
        physical_rank=physical_rank,
        virtual_rank=_listed_rank(ranks_spec, physical_rank),
        launcher_pid=os.getppid() if "TORCHELASTIC_RUN_ID" in os.environ else None,
        orchestrator_pid=int(orchestrator) if orchestrator and orchestrator.isdigit() else None,
    )
    _op_activity()  # load the extension here, on the main thread, not in the watchdog's
    _active.start()
    return _active


def stop() -> None:
    global _active
    if _active is not None:
        _active.stop()
        _active = None


def identify(virtual_rank: int) -> None:
    """The process now knows which virtual rank it plays (its files are named after it)."""
    if _active is not None:
        _active.virtual_rank = virtual_rank


def beat() -> None:
    """A step of the start-up or of a pass that neither issues ops nor imports (building the
    replay schedule, say) counts as progress."""
    if _active is not None:
        _active.note("beat")


def iteration_begins() -> None:
    if _active is not None:
        _active.note("begin")


def iteration_ends() -> None:
    if _active is not None:
        _active.note("end")


def _listed_rank(ranks_spec: str | None, physical_rank: int) -> int | None:
    """The virtual rank when --prism-ranks is a plain list ("0,8", what the orchestrator passes)."""
    words = (ranks_spec or "").split(",")
    if not all(w.strip().isdigit() for w in words):
        return None
    ranks = sorted({int(w) for w in words})
    return ranks[physical_rank] if physical_rank < len(ranks) else None
