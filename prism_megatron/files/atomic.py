"""Atomic file writes: a reader sees the old file or the new one, never half of one.

Every file the project writes whole (the run folder's reports, results and op logs, execution graphs,
replay schedules, cluster files, Chakra traces, benchmark records) goes through `atomic_open`: the
content goes to a temporary file in the destination's directory, which is renamed over the
destination (`os.replace`, atomic on POSIX) only once it is complete. On any failure, including one
half-way through the content (a value JSON cannot encode, a full disk, an interrupt), the temporary
file is removed and the destination is left as it was.

The file gets the permissions a plain `open` would give (the umask's), not mkstemp's owner-only ones.
`check_output` lets a command refuse an output path that cannot be written before it does the work.
"""

from __future__ import annotations

import contextlib
import json
import os
import tempfile
from collections.abc import Callable, Iterator
from typing import IO, Any

TEMPORARY_PREFIX = ".prism-"
"""Temporary files start with this (hidden, so a listing of a run folder in progress stays clean)."""


def _umask() -> int:
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


@contextlib.contextmanager
def atomic_open(path: str | os.PathLike, mode: str = "w", *, make_dirs: bool = True) -> Iterator[IO]:
    """A file to write `path`'s new content into; it replaces `path` when the block ends without error.

    Args:
        mode: "w" (text, UTF-8) or "wb".
        make_dirs: create the destination's directory when missing (False: a missing directory is
            the caller's error, `FileNotFoundError`).
    """
    if mode not in ("w", "wb"):
        raise ValueError(f"atomic_open: mode must be 'w' or 'wb', got {mode!r}")
    path = os.fspath(path)
    directory = os.path.dirname(os.path.abspath(path))
    if make_dirs:
        os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=TEMPORARY_PREFIX, suffix=".tmp")
    try:
        with os.fdopen(fd, mode, **({} if "b" in mode else {"encoding": "utf-8"})) as f:
            yield f
        os.chmod(tmp, 0o666 & ~_umask())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


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


def write_atomically(path: str | os.PathLike, data: bytes | str, *, make_dirs: bool = True) -> str:
    """Write `data` (str as UTF-8) to `path` atomically; return the path."""
    with atomic_open(path, "wb", make_dirs=make_dirs) as f:
        f.write(data.encode("utf-8") if isinstance(data, str) else data)
    return os.fspath(path)


def write_json(
    doc: Any,
    path: str | os.PathLike,
    *,
    indent: int | None = None,
    default: Callable[[Any], Any] | None = None,
) -> str:
    """Write `doc` as JSON atomically, streamed (a large graph is never held twice); return the path.

    Args:
        indent: for files people read; None writes compact data.
        default: what `json.dump` calls for an object it cannot encode (None: such an object fails
            the write, and the destination keeps its old content).
    """
    with atomic_open(path) as f:
        if indent:
            json.dump(doc, f, indent=indent, default=default)
        else:
            _dump_compact(doc, f, json.JSONEncoder(separators=(",", ":"), default=default), STREAMED_LEVELS)
        f.write("\n")
    return os.fspath(path)


STREAMED_LEVELS = 2
"""Compact JSON is written as `json.dump` writes it, byte for byte, but the top `STREAMED_LEVELS`
levels of dicts and lists item by item (the last level's list items `_ITEMS_PER_CALL` at a time)
and each item below them in one call of the C encoder:
`json.dump` itself streams through the pure-Python encoder, several times slower, and a modelled
16,384-rank run's timeline (tens of MB: a dict of a list of events) spent seconds in it, while
`json.dumps` of the whole would hold the document twice."""


_ITEMS_PER_CALL = 1024


def _dump_compact(doc: Any, f: IO[str], encoder: json.JSONEncoder, levels: int) -> None:
    if levels and isinstance(doc, dict) and all(isinstance(key, str) for key in doc):
        f.write("{")
        for number, (key, value) in enumerate(doc.items()):
            f.write(f"{',' if number else ''}{encoder.encode(key)}:")
            _dump_compact(value, f, encoder, levels - 1)
        f.write("}")
    elif levels == 1 and isinstance(doc, (list, tuple)):
        # The last streamed level: items encoded `_ITEMS_PER_CALL` at a time, the chunk's brackets
        # dropped (a timeline's hundreds of thousands of events cost one call each before).
        f.write("[")
        for start in range(0, len(doc), _ITEMS_PER_CALL):
            if start:
                f.write(",")
            f.write(encoder.encode(doc[start : start + _ITEMS_PER_CALL])[1:-1])
        f.write("]")
    elif levels and isinstance(doc, (list, tuple)):
        f.write("[")
        for number, value in enumerate(doc):
            if number:
                f.write(",")
            _dump_compact(value, f, encoder, levels - 1)
        f.write("]")
    else:
        f.write(encoder.encode(doc))


def read_json(path: str | os.PathLike, what: str) -> Any:
    """Parse a JSON file; ValueError naming the file and `what` it should hold."""
    try:
        with open(path, encoding="utf-8") as f:
            return json.load(f)
    except FileNotFoundError as exc:
        raise ValueError(f"{os.fspath(path)}: no {what} here") from exc
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise ValueError(f"{os.fspath(path)}: damaged {what} (not JSON: {exc})") from exc
    except RecursionError as exc:  # thousands of nested brackets: no file of ours is shaped so
        raise ValueError(f"{os.fspath(path)}: damaged {what} (nested too deeply to be one)") from exc
