"""Write a run folder's report: report.json, report.md, timeline.json and the plots.

`write_report` is what the orchestrator calls at the end of a run (and on failure, with what was
measured). It validates the report first, so nothing malformed reaches disk, keeps the inputs the
timeline needs (each real rank's op log under ops/, the simulated virtual tracks under spans/),
renders the rest, and writes report.json last, listing what it wrote (`artefacts`): a report phase
that is interrupted or fails (a full disk) leaves the report.json that was there (status "running"
while a run is under way), never one that says "ok" beside a missing report.md.
`rerender` renders again from those files alone; that is `prism-megatron report RUN_DIR`.

Every piece that cannot be made (no simulation in a failed run, no op logs, a plot that fails to
draw) is skipped with a line in report.md saying why, never a crash: a failed run's report must
still come out.
"""

from __future__ import annotations

import dataclasses
import os
from collections.abc import Iterable, Mapping, Sequence

from prism_megatron import files
from prism_megatron.replay.events import OpEvent
from prism_megatron.report import schema
from prism_megatron.report.markdown import render_markdown
from prism_megatron.report.model import RunReport
from prism_megatron.report.oplog import OpLog, as_op_logs, load_op_logs, save_op_log
from prism_megatron.report.plots import PLOTS, NothingToPlot
from prism_megatron.report.timeline import (
    DEFAULT_MAX_VIRTUAL_TRACKS,
    SimulatedTracks,
    timeline_ranks,
    timeline_trace,
)
from prism_megatron.sim import SimResult
from prism_megatron.topology import Layout

OP_LOGS = "op logs"


@dataclasses.dataclass(frozen=True)
class WrittenReport:
    """What was written (output name -> path) and what was skipped (output name -> why)."""

    paths: Mapping[str, str]
    skipped: Mapping[str, str]


def write_report(
    report: RunReport,
    out_dir: str,
    *,
    sim_result: SimResult | None = None,
    measured_ops: Mapping[int, OpLog | Sequence[OpEvent]] | None = None,
    layout: Layout | None = None,
    virtual_ranks: Iterable[int] | None = None,
    max_virtual_tracks: int = DEFAULT_MAX_VIRTUAL_TRACKS,
) -> WrittenReport:
    """Write the report of a run into `out_dir` (created if needed; earlier report files replaced).

    Args:
        sim_result: the simulation whose arrivals the replay engine played (for the virtual tracks).
        measured_ops: per real virtual rank, its `OpLog` or its list of `OpEvent`s.
        layout: the target job's layout (coordinates in track names); default from `report.target`.
        virtual_ranks: the virtual ranks to draw; default `timeline_ranks` (neighbours and peers
            of the real ranks, one representative per role; on a modelled GPU the captured ranks
            and one representative per role), at most `max_virtual_tracks`.

    Raises:
        SchemaError: the report does not follow the schema (nothing is written then).
    """
    doc = report.to_json()
    schema.validate(doc)
    os.makedirs(out_dir, exist_ok=True)
    logs = as_op_logs(measured_ops)
    for log in logs.values():
        save_op_log(out_dir, log)
    if not logs:
        logs = load_op_logs(out_dir)  # the real ranks may have written their own
    simulated = None
    if sim_result is not None:
        ranks = (
            list(virtual_ranks)
            if virtual_ranks is not None
            else timeline_ranks(
                sim_result, report.real_ranks, modelled=report.modelled is not None, limit=max_virtual_tracks
            )
        )
        simulated = SimulatedTracks.from_result(sim_result, ranks[:max_virtual_tracks])
        simulated.save(out_dir)
    written = render(report, out_dir, logs=logs, simulated=simulated, layout=layout)
    _write_report_json(doc, out_dir, written)
    return written


def _write_report_json(doc: dict, out_dir: str, written: WrittenReport) -> None:
    """report.json, last, listing the files written beside it (relative to the run folder)."""
    path = os.path.join(out_dir, files.REPORT_JSON)
    listed = sorted(os.path.relpath(p, out_dir) for name, p in written.paths.items() if p != path)
    doc = {**doc, "artefacts": listed}
    schema.validate(doc, path)
    files.write_json(doc, path, indent=1)


def load_report(run_dir: str) -> RunReport:
    """The run folder's report.json, validated (ValueError naming the file when it is not one)."""
    path = os.path.join(run_dir, files.REPORT_JSON)
    return RunReport.from_json(files.read_json(path, "run report"), path)


def rerender(run_dir: str, *, simulated: SimulatedTracks | None = None) -> WrittenReport:
    """Render report.md, the plots and the timeline again from the run folder's files.

    `simulated` replaces the saved virtual tracks (spans/simulated.json) when given.
    """
    doc = files.read_json(os.path.join(run_dir, files.REPORT_JSON), "run report")
    written = render(
        load_report(run_dir),
        run_dir,
        logs=load_op_logs(run_dir),
        simulated=simulated if simulated is not None else SimulatedTracks.load(run_dir),
        layout=None,
    )
    _write_report_json(doc, run_dir, written)
    return written


def render(
    report: RunReport,
    out_dir: str,
    *,
    logs: Mapping[int, OpLog],
    simulated: SimulatedTracks | None,
    layout: Layout | None,
) -> WrittenReport:
    """Write the plots, the timeline and report.md (report.json comes after them).

    A plot or a timeline that cannot be made is skipped with the reason in report.md; a file that
    cannot be written (OSError: a full disk) ends the rendering, since the report would be missing
    a piece without saying so."""
    paths: dict[str, str] = {os.path.basename(files.REPORT_JSON): os.path.join(out_dir, files.REPORT_JSON)}
    relative: dict[str, str] = {}
    skipped: dict[str, str] = {}
    for name, plot in PLOTS.items():
        path = os.path.join(out_dir, files.PLOTS_DIR, name)
        try:
            files.write_atomically(path, plot(report))
        except NothingToPlot as exc:
            skipped[name] = str(exc)
        except OSError:
            raise
        except Exception as exc:  # a plot must never cost the report (see the module docstring)
            skipped[name] = f"could not be drawn ({type(exc).__name__}: {exc})"
        else:
            relative[name] = f"{files.PLOTS_DIR}/{name}"
            continue
        _remove_stale(path)
    path = os.path.join(out_dir, files.TIMELINE_JSON)
    modelled = report.modelled is not None  # every rank simulated: no real rank runs on a model
    if logs or simulated is not None:
        try:
            trace = timeline_trace(
                () if modelled else report.real_ranks,
                {} if modelled else logs,
                simulated,
                layout or _layout_of(report),
                modelled=modelled,
            )
            files.write_json(trace, path)
            relative["timeline"] = files.TIMELINE_JSON
        except OSError:
            raise
        except Exception as exc:  # as for plots
            skipped["timeline"] = f"could not be written ({type(exc).__name__}: {exc})"
    else:
        skipped["timeline"] = "no real rank left an op log and the run has no simulated timeline"
    if "timeline" in skipped:
        _remove_stale(path)
    without_log = [] if modelled else [r for r in report.real_ranks if r not in logs]
    if without_log and "timeline" in relative:
        skipped[OP_LOGS] = (
            f"no op log from real rank(s) {', '.join(map(str, without_log))}: their tracks are empty"
        )
    md_path = files.write_atomically(
        os.path.join(out_dir, files.REPORT_MD), render_markdown(report, relative, skipped)
    )
    paths.update({name: os.path.join(out_dir, rel) for name, rel in relative.items()})
    paths[files.REPORT_MD] = md_path
    return WrittenReport(paths=paths, skipped=skipped)


def _layout_of(report: RunReport) -> Layout | None:
    try:
        return report.target.layout()
    except ValueError:  # sizes Layout refuses: track names then go without coordinates
        return None


def _remove_stale(path: str) -> None:
    """A file an earlier rendering wrote and this one skipped would contradict report.md."""
    if os.path.exists(path):
        os.unlink(path)
