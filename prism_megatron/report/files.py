"""Atomic file writes for the run folder: a reader never sees half a report.

Each file is written to a temporary name in its directory and renamed into place (`os.replace` is
atomic on POSIX), with the permissions a plain `open` would give (mkstemp's are owner-only).
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
