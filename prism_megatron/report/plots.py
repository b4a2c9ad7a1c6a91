"""The report's PNG plots: iteration time per iteration, time breakdown per role, memory per real rank.

Each plot function takes the `RunReport` and either returns the PNG bytes or raises `NothingToPlot`
with the reason (a failed run without iterations, no simulation), which report.md then states. Plots
draw on a bare matplotlib `Figure` with the Agg canvas: no pyplot, no global backend switch, no
display needed.
"""

from __future__ import annotations

import io

from matplotlib.backends.backend_agg import FigureCanvasAgg
from matplotlib.figure import Figure
from matplotlib.ticker import MaxNLocator

from prism_megatron.report.model import RunReport

ITERATION_TIME_PNG = "iteration_time.png"
BREAKDOWN_PNG = "breakdown.png"
MEMORY_PNG = "memory.png"
_BREAKDOWN_PARTS = (
    ("compute_s", "compute"),
    ("exposed_comm_s", "exposed communication"),
    ("bubble_s", "bubble"),
)
_GIB = 1 << 30
MAX_ROLES_DRAWN = 48
"""A job with more roles (deep pipelines times expert shards) shows its first 48; the table has all."""


class NothingToPlot(Exception):
    """The report holds no data for this plot; the message says why."""


def _png(figure: Figure) -> bytes:
    FigureCanvasAgg(figure)
    figure.tight_layout()
    out = io.BytesIO()
    figure.savefig(out, format="png", dpi=110)
    return out.getvalue()


def _legend_below(axes, *, columns: int) -> None:
    """A legend under the axes, where it hides no bar."""
    axes.legend(
        loc="upper center", bbox_to_anchor=(0.5, -0.22), ncol=columns, fontsize="small", frameon=False
    )


def _time_unit(seconds: list[float]) -> tuple[float, str]:
    """Scale and unit so that the largest time reads between 1 and 1000."""
    largest = max(seconds, default=0.0)
    if largest >= 1:
        return 1.0, "s"
    return (1e3, "ms") if largest >= 1e-3 else (1e6, "µs")


def iteration_time_png(report: RunReport) -> bytes:
    """Bars of each iteration's time, warm-up in grey; lines at the median and the simulated time."""
    if not report.iterations:
        raise NothingToPlot("no iteration was measured")
    times = [it.time_s for it in report.iterations]
    references = [t for t in (report.iteration_time_s, report.simulated_iteration_time_s) if t is not None]
    scale, unit = _time_unit(times + references)
    figure = Figure(figsize=(7, 4))
    axes = figure.add_subplot()
    colours = ["0.7" if it.warmup else "tab:blue" for it in report.iterations]
    axes.bar([it.index for it in report.iterations], [t * scale for t in times], color=colours)
    if report.iteration_time_s is not None:
        median = report.iteration_time_s * scale
        axes.axhline(
            median, color="tab:blue", linestyle="--", label=f"median after warm-up {median:.4g} {unit}"
        )
    if report.simulated_iteration_time_s is not None:
        simulated = report.simulated_iteration_time_s * scale
        axes.axhline(simulated, color="tab:orange", linestyle=":", label=f"simulated {simulated:.4g} {unit}")
    axes.xaxis.set_major_locator(MaxNLocator(integer=True))
    axes.set_xlabel("iteration (grey: warm-up)")
    axes.set_ylabel(f"iteration time ({unit})")
    axes.set_title("Iteration time")
    if references:
        _legend_below(axes, columns=2)
    return _png(figure)


def breakdown_png(report: RunReport) -> bytes:
    """Stacked horizontal bars per role: compute, exposed communication, bubble (simulated)."""
    if not report.roles:
        raise NothingToPlot("no simulated breakdown per role (the run has no simulation result)")
    roles = list(reversed(report.roles[:MAX_ROLES_DRAWN]))  # first role on top
    scale, unit = _time_unit([r.compute_s + r.exposed_comm_s + r.bubble_s for r in roles])
    figure = Figure(figsize=(7, 1.8 + 0.35 * len(roles)))
    axes = figure.add_subplot()
    left = [0.0] * len(roles)
    labels = [f"{r.role} (x{r.count})" for r in roles]
    for key, label in _BREAKDOWN_PARTS:
        widths = [getattr(r, key) * scale for r in roles]
        axes.barh(labels, widths, left=left, label=label)
        left = [a + b for a, b in zip(left, widths, strict=True)]
    axes.set_xlabel(f"time per iteration ({unit})")
    shown = (
        "" if len(report.roles) <= MAX_ROLES_DRAWN else f" (first {MAX_ROLES_DRAWN} of {len(report.roles)})"
    )
    axes.set_title("Simulated time breakdown per role" + shown)
    _legend_below(axes, columns=3)
    return _png(figure)


def memory_png(report: RunReport) -> bytes:
    """Stacked bars per real rank: bytes by category at the rank's peak, in GiB."""
    ranks = [r for _, r in sorted(report.ranks.items()) if r.memory_by_category]
    if not ranks:
        raise NothingToPlot("no real rank reported memory by category")
    categories = list(dict.fromkeys(c for r in ranks for c in r.memory_by_category))
    figure = Figure(figsize=(max(5.5, 2.5 + 0.8 * len(ranks)), 4))
    axes = figure.add_subplot()
    labels = [str(r.virtual_rank) for r in ranks]
    bottom = [0.0] * len(ranks)
    for category in categories:
        heights = [r.memory_by_category.get(category, 0) / _GIB for r in ranks]
        axes.bar(labels, heights, bottom=bottom, label=category.replace("_", " "))
        bottom = [a + b for a, b in zip(bottom, heights, strict=True)]
    axes.set_xlabel("real rank (virtual rank)")
    axes.set_ylabel("memory at peak (GiB)")
    axes.set_title("Peak memory by category")
    axes.legend(loc="upper left", bbox_to_anchor=(1.02, 1.0), fontsize="small")
    return _png(figure)


PLOTS = {ITERATION_TIME_PNG: iteration_time_png, BREAKDOWN_PNG: breakdown_png, MEMORY_PNG: memory_png}
"""File name -> plot function, in the order report.md shows them."""
