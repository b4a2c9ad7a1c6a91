"""A Chrome trace-event writer: timelines that Perfetto (ui.perfetto.dev) and chrome://tracing open.

Generic on purpose: anything with `process` (int, one track group per rank), `thread` (str, one
track per stream), `name`, `category`, `start_ns`, `end_ns` and `args` (dict) is a span. The format
is the JSON trace-event format ("X" complete events, "M" metadata for track names, "C" counters,
"s"/"f" flow arrows bound to the slices they start and end in); timestamps are in microseconds with
ns kept as decimals.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from prism_megatron import files


@dataclasses.dataclass(frozen=True)
class FlowEnd:
    """Where an arrow starts or ends: a moment inside a span of (process, thread)."""

    process: int
    thread: str
    time_ns: int


@dataclasses.dataclass(frozen=True)
class Flow:
    """An arrow from one span to another (a send to its receive, a last arrival to a completion)."""

    name: str
    category: str
    source: FlowEnd
    target: FlowEnd


@dataclasses.dataclass(frozen=True)
class Counter:
    """Values of one counter track of a process at one moment (one track per key of `values`)."""

    process: int
    name: str
    time_ns: int
    values: Mapping[str, float]


def chrome_trace(
    spans: Iterable,
    process_names: Mapping[int, str] | None = None,
    *,
    flows: Iterable[Flow] = (),
    counters: Iterable[Counter] = (),
) -> dict:
    """The trace as a JSON-ready dict; threads are numbered per process in order of appearance.

    A flow whose end lies on a thread without spans is left out (nothing to bind it to).
    """
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
    for flow_id, flow in enumerate(flows, start=1):
        ends = [threads.get((end.process, end.thread)) for end in (flow.source, flow.target)]
        if None in ends:
            continue
        for phase, end, tid in (("s", flow.source, ends[0]), ("f", flow.target, ends[1])):
            event = {"ph": phase, "id": flow_id, "name": flow.name, "cat": flow.category, "pid": end.process}
            event |= {"tid": tid, "ts": end.time_ns / 1000}
            if phase == "f":
                event["bp"] = "e"  # bind to the enclosing slice, not the next one
            events.append(event)
    for counter in counters:
        events.append(
            {
                "ph": "C",
                "name": counter.name,
                "pid": counter.process,
                "tid": 0,  # counters belong to the process; the tid keeps every event's keys alike
                "ts": counter.time_ns / 1000,
                "args": dict(counter.values),
            }
        )
    return {"traceEvents": events, "displayTimeUnit": "ns"}


def write_chrome_trace(path: str, spans: Iterable, process_names: Mapping[int, str] | None = None) -> str:
    """Write the trace atomically; return the path."""
    return files.write_json(chrome_trace(spans, process_names), path)


def _meta(kind: str, process: int, thread: int, name: str) -> dict:
    return {"ph": "M", "name": kind, "pid": process, "tid": thread, "args": {"name": name}}
