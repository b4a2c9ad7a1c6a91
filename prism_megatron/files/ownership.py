"""Who owns a run folder: one run at a time (a lock), and what --prism-overwrite may replace.

Two runs started into one folder at the same instant would both pass a "the folder is empty" check
and write a mix of both; so a run takes the folder's lock before it writes anything and holds it to
its end. The lock is `flock` on a hidden file in the folder: the kernel releases it when its holder
ends, however it ends, so a lock file a killed run left behind is recognised as stale (nobody holds
it) and taken over. The file says who holds it (process id, host, start time), for the refusal.

`--prism-overwrite` replaces only a folder that holds a run of ours (a report.json that reads as one),
removes only the entries a run writes (`RUN_ENTRIES`, per-rank files), never follows a symbolic link
out of the folder, and keeps every other file.
"""

from __future__ import annotations

import contextlib
import errno
import fcntl
import json
import os
import shutil
import socket
import time
from collections.abc import Iterator

from prism_megatron.files.run_folder import REPORT_JSON, RUN_ENTRIES, is_rank_file

LOCK_FILE = ".prism-run.lock"
"""The run folder's lock (hidden; removed by the run that held it when it ends)."""


class RunFolderBusy(ValueError):
    """Another live run holds the folder's lock (a user mistake: exit status 2, one line)."""


def _holder_text(fd: int) -> str:
    os.lseek(fd, 0, os.SEEK_SET)
    return os.read(fd, 512).decode("utf-8", "replace").strip()


@contextlib.contextmanager
def run_folder_lock(run_dir: str, *, flag: str = "--prism-out") -> Iterator[str | None]:
    """Hold `run_dir`'s lock for the block (the folder is created when missing).

    Yields the holder a stale lock file named (a run that ended without releasing it), else None.

    Raises:
        RunFolderBusy: a live run holds the lock; the message names it and the flag.
        ValueError: the lock cannot be taken (the lock path is a link, the folder is not writable).
    """
    os.makedirs(run_dir, exist_ok=True)
    path = os.path.join(run_dir, LOCK_FILE)
    while True:
        try:
            fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC | os.O_NOFOLLOW, 0o644)
        except OSError as exc:
            why = "it is a symbolic link" if exc.errno == errno.ELOOP else exc.strerror
            raise ValueError(f"{flag} {run_dir}: cannot take the run folder's lock {path} ({why})") from exc
        try:
            fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
        except BlockingIOError:
            holder = _holder_text(fd) or "starting"
            os.close(fd)
            raise RunFolderBusy(
                f"{flag} {run_dir} is in use by another run ({holder}); wait for it to end or name "
                "another folder"
            ) from None
        # The run before us may have removed the file between our open and our lock: hold the lock
        # of the file that is there now, or the next run would lock a new one beside ours.
        try:
            same = os.stat(path, follow_symlinks=False).st_ino == os.fstat(fd).st_ino
        except FileNotFoundError:
            same = False
        if same:
            break
        os.close(fd)
    stale = _holder_text(fd) or None
    os.ftruncate(fd, 0)
    os.pwrite(
        fd, f"pid {os.getpid()} on {socket.gethostname()} since {time.strftime('%H:%M:%S')}\n".encode(), 0
    )
    try:
        yield stale
    finally:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(path)
        os.close(fd)


def run_entries(run_dir: str) -> list[str]:
    """The folder's entries, less the lock file (a folder holding only a stale lock is empty)."""
    return sorted(name for name in os.listdir(run_dir) if name != LOCK_FILE)


def holds_prism_run(run_dir: str) -> bool:
    """Whether the folder holds a run of ours: a report.json, a plain file (not a link), that reads
    as one (a JSON object with an integer schema_version, a status and a target)."""
    path = os.path.join(run_dir, REPORT_JSON)
    if os.path.islink(path) or not os.path.isfile(path):
        return False
    try:
        with open(path, encoding="utf-8") as f:
            doc = json.load(f)
    except (OSError, ValueError, RecursionError):
        return False
    return (
        isinstance(doc, dict)
        and type(doc.get("schema_version")) is int
        and isinstance(doc.get("status"), str)
        and isinstance(doc.get("target"), dict)
    )


def check_run_folder(run_dir: str, *, overwrite: bool, flag: str = "--prism-out") -> None:
    """Refuse a folder a new run may not write into; ValueError naming the flag (nothing is changed).

    An empty or missing folder is fine; a non-empty one only with `overwrite`, and then only when it
    holds a run of ours and is not itself a symbolic link (removing through one would reach outside).
    """
    if os.path.isfile(run_dir):
        raise ValueError(f"{flag} {run_dir} is a file; name a directory")
    if not os.path.isdir(run_dir) or not run_entries(run_dir):
        return
    if not overwrite:
        raise ValueError(f"{flag} {run_dir} already holds a run; pass --prism-overwrite or another {flag}")
    if os.path.islink(run_dir.rstrip(os.sep) or run_dir):
        raise ValueError(
            f"{flag} {run_dir} is a symbolic link; --prism-overwrite replaces only a real run folder "
            "(name the folder it points to)"
        )
    if not holds_prism_run(run_dir):
        raise ValueError(
            f"{flag} {run_dir} holds files but no run of ours (no readable {REPORT_JSON}); "
            "--prism-overwrite replaces only a prism run folder: name an empty or new folder"
        )


def clear_run(run_dir: str) -> list[str]:
    """Remove what an earlier run wrote in `run_dir` (its `RUN_ENTRIES` and per-rank files); a
    symbolic link is removed as a link, never followed; other files stay. Returns the removed names."""
    removed = []
    names = [n for n in run_entries(run_dir) if n in RUN_ENTRIES or is_rank_file(n)]
    # report.json last: a removal that fails half-way leaves a folder still recognised as a run.
    for name in sorted(names, key=lambda n: n == REPORT_JSON):
        path = os.path.join(run_dir, name)
        if os.path.isdir(path) and not os.path.islink(path):
            shutil.rmtree(path)
        else:
            os.unlink(path)
        removed.append(name)
    return removed
