"""report.md: the run report for people, with the configuration, tables and the plots embedded.

It states everything report.json holds that a person reads (status and failure first), and for each
output that could not be made (no simulation, nothing measured) one line saying why, so a missing
plot is never a mystery.

Text that comes from inputs (role names from a graph file, a failure's message, a setting's value)
goes through `escape` or `code`, so it reads as the text it is: a role named `a|b` or `**x**` neither
splits a table cell nor turns bold, and a newline does not end a table row.
"""

from __future__ import annotations

import re
from collections.abc import Mapping

from prism_megatron.report.model import MEGATRON_NAMES, RunReport, target_to_json

_TITLES = {
    "iteration_time.png": "Iteration time",
    "breakdown.png": "Time breakdown per role",
    "memory.png": "Peak memory by category",
}


def _seconds(value: float | None) -> str:
    if value is None:
        return "n/a"
    if value >= 1:
        return f"{value:.3f} s"
    return f"{value * 1e3:.3f} ms" if value >= 1e-3 else f"{value * 1e6:.1f} µs"


def _bytes(value: int | None) -> str:
    if value is None:
        return "n/a"
    for unit, size in (("GiB", 1 << 30), ("MiB", 1 << 20), ("KiB", 1 << 10)):
        if value >= size:
            return f"{value / size:.2f} {unit}"
    return f"{value} B"


_INLINE_SPECIAL = re.compile(r"([\\`*_\[\]<>|#!~])")


def escape(text: object) -> str:
    """`text` as literal Markdown on one line (a table cell or prose): every character Markdown
    would act on inline is backslash-escaped, and line breaks become spaces."""
    return _INLINE_SPECIAL.sub(r"\\\1", " ".join(str(text).splitlines()))


def code(text: object) -> str:
    """`text` as a code span on one line, whatever backticks it holds (a fence one longer than its
    longest run of them); a pipe is escaped, as a table cell needs even inside code."""
    text = " ".join(str(text).splitlines()).replace("|", "\\|")
    longest = max((len(run) for run in re.findall(r"`+", text)), default=0)
    fence = "`" * (longest + 1)
    padding = " " if longest else ""
    return f"{fence}{padding}{text}{padding}{fence}"


def _table(header: list[str], rows: list[list[object]]) -> list[str]:
    lines = ["| " + " | ".join(header) + " |", "|" + "---|" * len(header)]
    return lines + ["| " + " | ".join(str(cell) for cell in row) + " |" for row in rows]


def render_markdown(report: RunReport, outputs: Mapping[str, str], skipped: Mapping[str, str]) -> str:
    """The report.md text.

    Args:
        outputs: output name (plot file name, "timeline") -> its path relative to the run folder.
        skipped: output name -> why it was not made.
    """
    sections = [
        ["# prism-megatron run report"],
        _status(report),
        _summary(report),
        _agreement(report),
        report.modelled.markdown() if report.modelled is not None else [],
        _target(report),
        _capture(report),
        _ranks(report),
        _roles(report),
        _iterations(report),
        _plots(outputs, skipped),
        _timeline(outputs, skipped, modelled=report.modelled is not None),
        _settings(report),
    ]
    return "\n\n".join("\n".join(section).strip() for section in sections) + "\n"


def _status(report: RunReport) -> list[str]:
    if report.status == "ok":
        return [f"Status: **ok** (report made {report.created})."]
    if report.status == "running":
        return [f"Status: **running**: the run had not finished when this was written ({report.created})."]
    if report.status == "interrupted":
        why = escape(report.failure.message) if report.failure else "stopped by a signal"
        return [
            f"Status: **interrupted**: {why}.",
            "",
            "- everything below is what was measured before it stopped.",
        ]
    failure = report.failure
    lines = [f"Status: **failed**: {escape(failure.message) if failure else 'no reason recorded'}", ""]
    if failure and failure.dead_rank is not None:
        lines.append(f"- rank that died or stopped answering: virtual rank {failure.dead_rank}")
    if failure and failure.last_op:
        lines.append(f"- last op in flight: {code(failure.last_op)}")
    lines.append("- everything below is what was measured before the failure.")
    return lines


def _summary(report: RunReport) -> list[str]:
    measured, simulated = report.iteration_time_s, report.simulated_iteration_time_s
    versus = "n/a"
    if measured is not None and simulated:
        versus = f"{(measured - simulated) / simulated * 100:+.2f} %"
    # Three significant figures: CPU demo models run at milli-TFLOP/s, production ones at hundreds.
    tflops = "n/a" if report.tflops_per_gpu is None else f"{report.tflops_per_gpu:.3g}"
    tokens = "n/a" if report.tokens_per_s_per_gpu is None else f"{report.tokens_per_s_per_gpu:.4g}"
    megatron = {key: name.split(" [")[0] for key, name in MEGATRON_NAMES.items()}
    rows = [
        ["iteration time (median after warm-up)", _seconds(measured), f"`{megatron['iteration_time_s']}`"],
        ["simulated iteration time (graph as captured)", _seconds(simulated), "-"],
        ["emulated relative to the graph as captured", versus, "-"],
        *_against_capture(report),
        ["model TFLOP/s per GPU", tflops, f"`{megatron['tflops_per_gpu']}`"],
        ["tokens/s per GPU", tokens, "- (Megatron-LM does not log it)"],
        [
            "global batch size",
            str(report.target.global_batch_size),
            f"`{megatron['target.global_batch_size']}`",
        ],
        ["real ranks (virtual rank)", ", ".join(map(str, report.real_ranks)) or "none", "-"],
    ]
    return ["## Summary", "", *_table(["", "", "Megatron-LM's name"], rows)]


def _against_capture(report: RunReport) -> list[list[str]]:
    """A summary row: each real rank's median compute over the compared iterations against the
    capture's (a sum of per-span medians, `RankAgreement.compute_against_capture_pct`)."""
    parts = [
        f"{a.virtual_rank}: {a.compute_against_capture_pct:+.1f} %"
        for a in report.agreement
        if a.compute_against_capture_pct is not None
    ]
    return (
        [["real ranks' median compute in the emulation, against the capture's", ", ".join(parts), "-"]]
        if parts
        else []
    )


def _median_and_range(median: float | None, spread: tuple[float, float] | None) -> list[str]:
    """Two cells: '+0.12 %' and '-0.30 .. +0.85 %', or '-' twice without them."""
    if median is None or spread is None:
        return ["-", "-"]
    return [f"{median:+.2f} %", f"{spread[0]:+.2f} .. {spread[1]:+.2f} %"]


def _agreement(report: RunReport) -> list[str]:
    if not report.agreement:
        return []
    rows = []
    for a in report.agreement:
        low, high = a.spread_pct
        drift = a.compute_drift_spread_pct
        rows.append([
            a.virtual_rank, len(a.iterations), f"{a.median_pct:+.2f} %", f"{low:+.2f} .. {high:+.2f} %",
            *_median_and_range(a.expected_median_pct, a.expected_spread_pct),
            *_median_and_range(a.replayed_median_pct, a.replayed_spread_pct),
            "-" if drift is None else f"{a.compute_drift_median_pct:+.2f} % ({drift[0]:+.2f} .. {drift[1]:+.2f} %)",
            _seconds(a.closed_loop_final_s),
        ])  # fmt: skip
    return [
        "## Emulated against its own simulation",
        "",
        "Each emulated iteration after warm-up against the rank's simulated time in the replay "
        "schedule it ran (the closed loop re-simulates from the measured spans between iterations), "
        "against that schedule's expected time (the schedule replayed with each iteration it was "
        "simulated from, the median of those replays: the real ranks' compute moves from iteration to "
        "iteration and the emulation takes the moves one-sidedly, see below), "
        "and against that schedule replayed with the compute the real ranks measured in the iteration "
        "itself and, on the CPU device, the times they measured of the ops among them (what is left is "
        "the emulation's own error; the gap between this replay and the simulation is the drift of "
        "those measurements). "
        "The drift of the compute is given as the rank's measured compute in each iteration against "
        "what its schedule assumed. Where the rank exchanges with virtual peers it need not cancel out "
        "over iterations: a rank that computes more than assumed reaches its next exchange with a "
        "virtual peer late and the exchange ends late, while one that computes less waits there for "
        "the peer, which keeps to the schedule. "
        "The closed loop's last schedule is the simulation from the last measurements.",
        "",
        *_table(
            [
                "real rank",
                "iterations",
                "against the simulation: median",
                "range",
                "expected: median",
                "expected: range",
                "replayed: median",
                "replayed: range",
                "compute against the schedule's: median (range)",
                "closed loop, last schedule",
            ],
            rows,
        ),
    ]


def _target(report: RunReport) -> list[str]:
    t = target_to_json(report.target)
    keys = [
        "world_size",
        "tp",
        "pp",
        "vpp",
        "cp",
        "ep",
        "etp",
        "dp",
        "micro_batch_size",
        "global_batch_size",
        "seq_length",
        "order",
    ]
    return ["## Target job", "", *_table(keys, [[t[k] if t[k] is not None else "-" for k in keys]])]


def _capture(report: RunReport) -> list[str]:
    capture = report.capture
    if capture is None:
        return []
    lines = ["## Capture", "", capture.describe() + "."]
    shared = {rep: members for rep, members in capture.classes.items() if len(members) > 1}
    if shared:
        rows = [
            [escape(rep), len(members), _some([escape(m) for m in members])]
            for rep, members in shared.items()
        ]
        lines += ["", "Roles that run the same program share the captured spans of their class:", ""]
        lines += _table(["class of", "roles", "members"], rows)
    captured = _some([f"{escape(role)} (rank {rank})" for role, rank in capture.captured_ranks.items()])
    return [*lines, "", f"Captured: {captured or 'nothing'}."]


def _some(names: list[str] | tuple[str, ...], shown: int = 8) -> str:
    more = f", ... ({len(names) - shown} more)" if len(names) > shown else ""
    return ", ".join(names[:shown]) + more


def _ranks(report: RunReport) -> list[str]:
    lines = ["## Real ranks", ""]
    missing = [r for r in report.real_ranks if r not in report.ranks]
    if report.ranks:
        categories = list(dict.fromkeys(c for r in report.ranks.values() for c in r.memory_by_category))
        header = [
            "virtual rank",
            "role",
            "peak allocated (Megatron: max allocated)",
            "peak reserved (Megatron: max reserved)",
            "compute",
            "exposed comm",
            "bubble",
            *(c.replace("_", " ") for c in categories),
        ]
        rows = []
        for virtual_rank, rank in sorted(report.ranks.items()):
            rows.append(
                [
                    virtual_rank,
                    escape(rank.role) if rank.role else "-",
                    _bytes(rank.peak_memory_allocated_bytes),
                    _bytes(rank.peak_memory_reserved_bytes),
                    _seconds(rank.compute_s),
                    _seconds(rank.exposed_comm_s),
                    _seconds(rank.bubble_s),
                    *(_bytes(rank.memory_by_category.get(c)) for c in categories),
                ]
            )
        lines += _table(header, rows)
        lines += [
            "",
            "Memory by category is at the moment of the peak; compute, exposed communication and "
            "bubble per iteration are the simulator's breakdown of the rank.",
        ]
    if missing:
        lines += ["", f"No results from virtual rank(s) {', '.join(map(str, missing))}."]
    return lines


def _roles(report: RunReport) -> list[str]:
    lines = ["## Roles (simulated)", ""]
    if not report.roles:
        return [*lines, "Skipped: the run has no simulation result."]
    rows = [
        [
            escape(r.role),
            r.count,
            r.virtual_rank,
            _seconds(r.compute_s),
            _seconds(r.exposed_comm_s),
            _seconds(r.bubble_s),
        ]
        for r in report.roles
    ]
    return lines + _table(["role", "ranks", "representative", "compute", "exposed comm", "bubble"], rows)


def _iterations(report: RunReport) -> list[str]:
    lines = ["## Iterations", ""]
    if not report.iterations:
        return [*lines, "No iteration was measured."]
    rows = [[it.index, _seconds(it.time_s), "warm-up" if it.warmup else ""] for it in report.iterations]
    return lines + _table(["iteration", "time", ""], rows)


def _plots(outputs: Mapping[str, str], skipped: Mapping[str, str]) -> list[str]:
    lines = ["## Plots", ""]
    for name, title in _TITLES.items():
        if name in outputs:
            lines += [f"![{title}]({outputs[name]})", ""]
        elif name in skipped:
            lines += [f"- {title}: skipped: {skipped[name]}.", ""]
    return lines


def _timeline(outputs: Mapping[str, str], skipped: Mapping[str, str], *, modelled: bool = False) -> list[str]:
    lines = ["## Timeline", ""]
    if "timeline" in outputs:
        path = outputs["timeline"]
        drawn = (
            "the simulated iteration of the ranks asked for, the captured ones and one rank per role, "
            "every time modelled"
            if modelled
            else "the real ranks (measured) and of the virtual ranks around them (replayed)"
        )
        lines.append(f"[{path}]({path}): a Chrome trace of {drawn}; open it in Perfetto (ui.perfetto.dev).")
        if "op logs" in skipped:
            lines += ["", f"Note: {skipped['op logs']}."]
        return lines
    return [*lines, f"Skipped: {skipped.get('timeline', 'not written')}."]


def _settings(report: RunReport) -> list[str]:
    lines = []
    if report.prism:
        rows = [
            [escape(f"{section}.{key}" if isinstance(values, Mapping) else section), code(value)]
            for section, values in report.prism.items()
            for key, value in (values.items() if isinstance(values, Mapping) else [("", values)])
        ]
        lines += ["## Prism settings", "", *_table(["setting", "value"], rows), ""]
    for title, counts in (
        ("Patches used (calls)", report.patches),
        ("Shims used (calls)", report.shims_used),
    ):
        if counts:
            rows = [[escape(name), calls] for name, calls in sorted(counts.items())]
            lines += [f"## {title}", "", *_table(["name", "calls"], rows), ""]
    lines += [
        "## Versions",
        "",
        *_table(
            ["package", "version"], [[escape(k), escape(v) if v else "-"] for k, v in report.versions.items()]
        ),
    ]
    return lines
