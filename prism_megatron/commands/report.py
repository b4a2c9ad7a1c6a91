"""Re-render a run folder's report (report.md, plots, timeline) or check report.json against its schema."""

from __future__ import annotations

import argparse
import os
import sys

from prism_megatron import files

NAME = "report"
HELP = "re-render report.md, the plots and the timeline of a run folder, or --check its report.json"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Render report.md, the PNG plots and timeline.json of a run folder (--prism-out) again from what "
        "the run left there: report.json, the real ranks' op logs (ops/) and the simulated virtual "
        "tracks (spans/). A run folder without saved virtual tracks but with its execution graph "
        "(graph/) gets them by simulating the graph over the run's --prism-cluster. With --check, only "
        "validate report.json against its schema."
    )
    parser.add_argument("run_dir", metavar="RUN_DIR", help="the run folder holding report.json")
    parser.add_argument(
        "--check",
        action="store_true",
        help="validate report.json and exit: 0 valid and finished (ok or failed, every file it lists "
        "there), 1 invalid (each problem printed with its key path) or not finished (running, "
        "interrupted, or a file it lists missing)",
    )


def run(args: argparse.Namespace) -> int:
    from prism_megatron.report import schema
    from prism_megatron.report.writer import load_report, rerender

    if not os.path.isdir(args.run_dir):
        raise ValueError(f"RUN_DIR {args.run_dir!r} is not a directory; pass a run's --prism-out folder")
    if args.check:
        path = os.path.join(args.run_dir, files.REPORT_JSON)
        doc = files.read_json(path, "run report")
        try:
            schema.validate(doc, path)
        except schema.SchemaError as exc:
            print(f"{path}: invalid ({len(exc.errors)} problem(s))", file=sys.stderr)
            for error in exc.errors:
                print(f"  {error}", file=sys.stderr)
            return 1
        if doc["status"] not in schema.FINISHED:
            why = (doc.get("failure") or {}).get(
                "message"
            ) or "it had not finished when report.json was written"
            print(f"{path}: the run is not finished (status {doc['status']}: {why})", file=sys.stderr)
            return 1
        missing = missing_artefacts(args.run_dir, doc)
        if missing:
            print(
                f"{path}: the run is not finished ({', '.join(missing)} missing: status {doc['status']}, "
                "but its report was not written in full)",
                file=sys.stderr,
            )
            return 1
        print(f"{path}: valid (schema {doc['schema_version']}, status {doc['status']})")
        return 0
    report = load_report(args.run_dir)
    written = rerender(args.run_dir, simulated=_simulated_from_graph(args.run_dir, report))
    for path in written.paths.values():
        print(f"wrote {path}")
    for name, why in written.skipped.items():
        print(f"skipped {name}: {why}")
    return 0


def missing_artefacts(run_dir: str, doc: dict) -> list[str]:
    """The files report.json lists (`artefacts`; report.md for a report written before the list
    existed) that are not in the run folder."""
    listed = doc.get("artefacts", [files.REPORT_MD])
    return [name for name in listed if not os.path.isfile(os.path.join(run_dir, name))]


def _simulated_from_graph(run_dir: str, report):
    """Virtual tracks simulated from graph/ when the run saved none (None otherwise)."""
    from prism_megatron.report.timeline import DEFAULT_MAX_VIRTUAL_TRACKS, SimulatedTracks, timeline_ranks

    graph_dir = os.path.join(run_dir, files.GRAPH_DIR)
    if os.path.exists(os.path.join(run_dir, files.SIMULATED_SPANS_FILE)) or not os.path.isdir(graph_dir):
        return None
    from prism_megatron.graph import load_graph
    from prism_megatron.graph.world import world_from_metadata
    from prism_megatron.passes.closed_loop import network_cost
    from prism_megatron.sim import WhatIf, simulate
    from prism_megatron.sim.contention import compute_slowdown_of, graph_device

    graph = load_graph(graph_dir)
    emulation = report.prism.get("emulation", {})
    cluster = report.prism.get("cluster", {}).get("cluster", "default")
    stragglers = _stragglers(emulation.get("straggler"))
    device = graph_device(graph.metadata.extra) or emulation.get("device")  # old graphs record none
    result = simulate(
        graph,
        world_from_metadata(graph.metadata.layout),
        network_cost(cluster),
        WhatIf(stragglers=stragglers),
        compute_slowdown=compute_slowdown_of(device),
    )
    print(f"virtual tracks: simulated {graph_dir} over cluster {cluster!r} (the run saved none)")
    shown = list(report.real_ranks)
    if report.modelled is not None:  # the ranks --prism-ranks asked for first, as the run drew them
        shown = [*_asked_ranks(emulation.get("ranks"), graph.metadata.layout, shown), *shown]
    ranks = timeline_ranks(
        result, shown, modelled=report.modelled is not None, limit=DEFAULT_MAX_VIRTUAL_TRACKS
    )
    return SimulatedTracks.from_result(result, ranks)


def _asked_ranks(spec: str | None, layout: dict, captured: list[int]) -> list[int]:
    """The ranks the run's --prism-ranks selected that no process captured (a modelled run captures
    one rank per class and draws the asked ones beside them)."""
    from prism_megatron.graph.world import world_from_metadata
    from prism_megatron.topology.selection import select_ranks

    if not spec:
        return []
    return [r for r in select_ranks(world_from_metadata(layout).layout, spec) if r not in captured]


def _stragglers(text: str | None) -> dict[int, float]:
    from prism_megatron.config import EmulationConfig

    return EmulationConfig(straggler=text).stragglers() if text else {}
