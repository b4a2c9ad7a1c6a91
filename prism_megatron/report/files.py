"""Atomic file writes for the run folder: a reader never sees half a report.

Each file is written to a temporary name in its directory and renamed into place (`os.replace` is
atomic on POSIX), with the permissions a plain `open` would give (mkstemp's are owner-only).
`check_output` lets a command refuse an output path that cannot be written before it does the work.
"""

from __future__ import annotations

import json
import os
import tempfile
from typing import Any


def write_atomically(path: str, data: bytes | str) -> str:
    """Write `data` to `path` through a temporary file and a rename; return the path."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".prism-", suffix=".tmp")
    try:
        with os.fdopen(fd, "wb") as f:
            f.write(data.encode("utf-8") if isinstance(data, str) else data)
        mask = os.umask(0o022)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def check_output(path: str, flag: str, *, directory: bool = False) -> None:
    """Refuse, before any work, an output the command could not write; ValueError names the flag.

    A file output must not be a directory and its directory must exist (a typo in it would otherwise
    create a tree); a directory output must not be a file and may be created, under the nearest
    existing directory. Either way that directory must be writable. Nothing is created here.
    """
    if directory and os.path.isfile(path):
        raise ValueError(f"{flag} {path} is a file; name a directory")
    if not directory and os.path.isdir(path):
        raise ValueError(f"{flag} {path} is a directory; name the file to write")
    parent = os.path.dirname(os.path.abspath(path))
    if not directory and not os.path.isdir(parent):
        raise ValueError(f"{flag} {path}: directory {parent} does not exist; create it or name another file")
    while not os.path.exists(parent):
        parent = os.path.dirname(parent)
    if not os.path.isdir(parent):
        raise ValueError(f"{flag} {path}: {parent} is a file, so nothing can be written under it")
    if not os.access(parent, os.W_OK | os.X_OK):
        raise ValueError(f"{flag} {path}: directory {parent} is not writable")
    if not directory and os.path.exists(path) and not os.access(path, os.W_OK):
        raise ValueError(f"{flag} {path}: the file exists and is not writable")


def write_json(doc: Any, path: str, *, indent: int | None = None) -> str:
    """Write `doc` as JSON atomically; `indent` for files people read, None for compact data."""
    separators = None if indent else (",", ":")
    return write_atomically(path, json.dumps(doc, indent=indent, separators=separators) + "\n")


def read_json(path: str, what: str) -> Any:
    """Parse a JSON file; ValueError naming the file and `what` it should hold."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError as exc:
        raise ValueError(f"{path}: no {what} here") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{path}: damaged {what} (not JSON: {exc})") from exc
