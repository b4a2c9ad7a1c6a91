"""A Chrome trace-event writer: timelines that Perfetto (ui.perfetto.dev) and chrome://tracing open.

Generic on purpose: anything with `process` (int, one track group per rank), `thread` (str, one
track per stream), `name`, `category`, `start_ns`, `end_ns` and `args` (dict) is a span. The format
is the JSON trace-event format ("X" complete events, "M" metadata for track names); timestamps are
in microseconds with ns kept as decimals.
"""

from __future__ import annotations

import json
import os
import tempfile
from collections.abc import Iterable, Mapping


def chrome_trace(spans: Iterable, process_names: Mapping[int, str] | None = None) -> dict:
    """The trace as a JSON-ready dict; threads are numbered per process in order of appearance."""
    events: list[dict] = []
    threads: dict[tuple[int, str], int] = {}
    for span in spans:
        key = (span.process, span.thread)
        if key not in threads:
            threads[key] = sum(1 for p, _ in threads if p == span.process)
            events.append(_meta("thread_name", span.process, threads[key], span.thread))
            events.append(
                {
                    "ph": "M",
                    "name": "thread_sort_index",
                    "pid": span.process,
                    "tid": threads[key],
                    "args": {"sort_index": threads[key]},
                }
            )
        events.append(
            {
                "ph": "X",
                "name": span.name,
                "cat": span.category,
                "pid": span.process,
                "tid": threads[key],
                "ts": span.start_ns / 1000,
                "dur": (span.end_ns - span.start_ns) / 1000,
                "args": dict(span.args),
            }
        )
    for process, name in (process_names or {}).items():
        events.append(_meta("process_name", process, 0, name))
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def write_chrome_trace(path: str, spans: Iterable, process_names: Mapping[int, str] | None = None) -> str:
    """Write the trace atomically (temporary file, then rename); return the path."""
    directory = os.path.dirname(os.path.abspath(path))
    os.makedirs(directory, exist_ok=True)
    fd, tmp = tempfile.mkstemp(dir=directory, prefix=".trace-", suffix=".tmp")
    try:
        with os.fdopen(fd, "w", encoding="utf-8") as f:
            json.dump(chrome_trace(spans, process_names), f, separators=(",", ":"))
        mask = os.umask(0o022)
        os.umask(mask)
        os.chmod(tmp, 0o666 & ~mask)  # what a plain open would give; mkstemp's are owner-only
        os.replace(tmp, path)
    except BaseException:
        os.unlink(tmp)
        raise
    return path


def _meta(kind: str, process: int, thread: int, name: str) -> dict:
    return {"ph": "M", "name": kind, "pid": process, "tid": thread, "args": {"name": name}}
