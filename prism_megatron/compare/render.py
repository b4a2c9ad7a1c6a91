"""What `compare` writes: a JSON document for CI, a Markdown diff for people, a PNG plot.

The JSON document (`to_json`) is the contract for CI systems: `verdict` ("same", "regression",
"improvement"), the test and thresholds used, and one entry per metric with both values, the
difference, the change in % of its scale, the p-value and the verdict. Times are seconds and memory
bytes there; the Markdown shows ms and MiB.
"""

from __future__ import annotations

import io
import math
from collections.abc import Sequence

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure

from prism_megatron.compare import stats
from prism_megatron.compare.captures import capture_share
from prism_megatron.compare.judge import IMPROVEMENT, REGRESSION, Judged, Thresholds
from prism_megatron.compare.metrics import MEMORY, THROUGHPUT, RunMetrics
from prism_megatron.report.markdown import code, escape

COMPARE_SCHEMA_VERSION = 1
_COLOURS = {REGRESSION: "tab:red", IMPROVEMENT: "tab:green"}


def to_json(
    run_a: RunMetrics, run_b: RunMetrics, judged: Sequence[Judged], verdict: str, thresholds: Thresholds
) -> dict:
    share = capture_share(run_a, run_b)
    return {
        "schema_version": COMPARE_SCHEMA_VERSION,
        "run_a": run_a.run_dir,
        "run_b": run_b.run_dir,
        "verdict": verdict,
        "test": stats.NAME,
        "alpha": thresholds.alpha,
        "max_regression_pct": thresholds.max_regression_pct,
        "max_memory_regression_pct": thresholds.max_memory_regression_pct,
        "gated": "all" if thresholds.gate_breakdown else "headline",
        "breakdown_flagged": [
            {"key": j.key, "metric": j.label, "verdict": j.verdict}
            for j in judged
            if not j.headline and j.verdict in (REGRESSION, IMPROVEMENT)
        ],
        "captures": None
        if share is None
        else {
            "measured_change_s": share.measured_change_s,
            "simulated_change_s": share.simulated_change_s,
            "explained_pct": share.share_pct,
            "sentence": share.sentence(),
        },
        "versions": {"a": dict(run_a.report.versions), "b": dict(run_b.report.versions)},
        "same_graph": (
            run_a.graph_sha256 == run_b.graph_sha256 if run_a.graph_sha256 and run_b.graph_sha256 else None
        ),
        "metrics": [
            {
                "key": j.key,
                "metric": j.label,
                "megatron_name": j.megatron_name,
                "unit": _UNITS.get(j.kind, "s"),
                "headline": j.headline,
                "a": j.a,
                "b": j.b,
                "difference": j.difference,
                "change_pct": _finite(j.change_pct),
                "change_of": j.scale,
                "p_value": j.p_value,
                "test": j.test,
                "num_samples": list(j.num_samples),
                "verdict": j.verdict,
            }
            for j in judged
        ],
    }


def _finite(value: float | None) -> float | None:
    return value if value is None or math.isfinite(value) else None


_UNITS = {MEMORY: "bytes", THROUGHPUT: "tokens/s per GPU"}


def _value(kind: str, value: float | None) -> str:
    if value is None:
        return "-"
    if kind == MEMORY:
        return f"{value / (1 << 20):.2f} MiB"
    if kind == THROUGHPUT:
        return f"{value:.1f} tok/s"
    return f"{value * 1e3:.3f} ms"


def to_markdown(doc: dict, judged: Sequence[Judged], *, plot_name: str | None = None) -> str:
    """The Markdown diff: the verdict first, then how it was reached, then every metric."""
    gate_all = doc["gated"] == "all"
    flagged = [j for j in judged if j.verdict in (REGRESSION, IMPROVEMENT) and (j.headline or gate_all)]
    lines = [
        "# prism-megatron compare",
        "",
        f"- A (before): {code(doc['run_a'])}",
        f"- B (after): {code(doc['run_b'])}",
        "",
        f"Verdict: **{doc['verdict']}**"
        + (f" ({', '.join(f'{escape(j.label)}: {j.verdict}' for j in flagged)})" if flagged else "")
        + ".",
        *_breakdown_note(doc["breakdown_flagged"], gate_all),
        *([] if doc["captures"] is None else ["", doc["captures"]["sentence"]]),
        "",
        f"How: the verdict rests on {'every metric' if gate_all else 'the headline metrics'} "
        f"({'--gate-breakdown' if gate_all else 'iteration time, throughput, peak memory'}). A metric of "
        f"B is a regression when it moved the wrong way by more than {doc['max_regression_pct']:g} % "
        f"(times, throughput) or {doc['max_memory_regression_pct']:g} % (memory) of its scale in A and, "
        f"where both runs have per-iteration samples, the {doc['test']} finds the shift significant at "
        f"alpha = {doc['alpha']:g}; a metric with one value per run is judged on the threshold alone. "
        "A time part's change is a percentage of the iteration time.",
        "",
        *_graph_note(doc["same_graph"]),
        "Headline metrics (what the verdict rests on) in bold.",
        "",
        "| metric | Megatron's name | A | B | difference | change % | of | p | verdict |",
        "|---|---|---:|---:|---:|---:|---|---:|---|",
    ]
    for j in judged:
        change = "-" if j.change_pct is None else f"{j.change_pct:+.2f}"
        p = "-" if j.p_value is None else f"{j.p_value:.3g}"
        difference = "-" if j.difference is None else _signed(j.kind, j.difference)
        verdict = f"**{j.verdict}**" if j.verdict in (REGRESSION, IMPROVEMENT) else j.verdict
        label = f"**{escape(j.label)}**" if j.headline else escape(j.label)
        lines.append(
            f"| {label} | {escape(j.megatron_name) if j.megatron_name else '-'} | "
            f"{_value(j.kind, j.a)} | {_value(j.kind, j.b)} | "
            f"{difference} | {change} | {j.scale} | {p} | {verdict} |"
        )
    notes = sorted({j.test for j in judged if j.test.startswith("too few")})
    if notes:
        lines += ["", *(f"Note: {note}; the threshold alone decided there." for note in notes)]
    if plot_name:
        lines += ["", f"![change per metric]({plot_name})"]
    versions = doc["versions"]
    lines += [
        "",
        "| package | A | B |",
        "|---|---|---|",
        *(
            f"| {escape(k)} | {escape(versions['a'].get(k) or '-')} | {escape(versions['b'].get(k) or '-')} |"
            for k in dict.fromkeys([*versions["a"], *versions["b"]])
        ),
    ]
    return "\n".join(lines) + "\n"


def _breakdown_note(flagged: list[dict], gate_all: bool) -> list[str]:
    if not flagged or gate_all:
        return []
    named = ", ".join(f"{escape(m['metric'])}: {m['verdict']}" for m in flagged)
    return [
        "",
        f"Breakdown beyond its threshold (reported, not gated; `--gate-breakdown` gates it): {named}.",
    ]


def _graph_note(same_graph: bool | None) -> list[str]:
    if same_graph is None:
        return []
    if same_graph:
        return ["Both runs emulated the same execution graph.", ""]
    return [
        "Note: the virtual peers of each run carry their own capture's noise; for a gate, emulate one graph "
        "before and after the change (`--prism-graph RUN_A/graph`).",
        "",
    ]


def _signed(kind: str, value: float) -> str:
    text = _value(kind, abs(value))
    return ("+" if value >= 0 else "-") + text


def plot_png(run_a: RunMetrics, run_b: RunMetrics, judged: Sequence[Judged], thresholds: Thresholds) -> bytes:
    """Left: the iteration times of both runs; right: each judged metric's change with the thresholds."""
    shown = [j for j in judged if j.change_pct is not None and math.isfinite(j.change_pct)]
    figure = Figure(figsize=(12, max(3.5, 0.28 * len(shown) + 1.5)))
    FigureCanvasAgg(figure)
    left, right = figure.subplots(1, 2, gridspec_kw={"width_ratios": [1, 2]})
    for index, (run, name) in enumerate(((run_a, "A"), (run_b, "B"))):
        metric = run.metrics.get("iteration")
        samples = metric.samples if metric is not None else ()
        left.scatter([index] * len(samples), [s * 1e3 for s in samples], alpha=0.6, label=name)
        if metric is not None:
            left.hlines(metric.value * 1e3, index - 0.25, index + 0.25, colors="black")
    left.set_xticks([0, 1], ["A (before)", "B (after)"])
    left.set_xlim(-0.6, 1.6)
    left.set_ylabel("iteration time (ms); line: median")
    left.set_title("iteration time per iteration")
    labels = [j.label for j in shown]
    right.barh(
        range(len(shown)),
        [j.change_pct for j in shown],
        color=[_COLOURS.get(j.verdict, "tab:grey") for j in shown],
    )
    right.set_yticks(range(len(shown)), labels, fontsize="small")
    right.invert_yaxis()
    for limit, style in ((thresholds.max_regression_pct, "--"), (thresholds.max_memory_regression_pct, ":")):
        right.axvline(limit, color="black", linestyle=style, linewidth=0.8)
        right.axvline(-limit, color="black", linestyle=style, linewidth=0.8)
    right.axvline(0, color="black", linewidth=0.5)
    right.set_xlabel("change B - A, % of its scale (dashed: time threshold, dotted: memory threshold)")
    right.set_title("change per metric (red: regression, green: improvement)")
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="png", dpi=100)
    return out.getvalue()
