"""Names inside a run folder, in one place (the orchestrator and the real ranks both use them).

<run>/report.json, report.md, timeline.json, plots/   the report (prism_megatron.report)
<run>/graph/graph.json                               the execution graph (--prism-graph, simulate)
<run>/simulation/schedule-<rank>.json                replay schedules of the real ranks
<run>/capture/capture-<rank>.json, rank-<rank>.json  what each slice rank recorded, its results
<run>/rank-<rank>.json, ops/rank-<rank>.json         each real rank's results and measured op log
<run>/progress/rank-<rank>.json                      where each real process is (for progress)
<run>/logs/<launch>/...                              each launch's output, per process
"""

from __future__ import annotations

import glob
import os

CAPTURE_DIR = "capture"
GRAPH_DIR = "graph"
SIMULATION_DIR = "simulation"
PROGRESS_DIR = "progress"
LOGS_DIR = "logs"


def capture_path(directory: str, virtual_rank: int) -> str:
    """A capture-phase process's recording, in its --prism-out folder."""
    return os.path.join(directory, f"capture-{virtual_rank:05d}.json")


def capture_paths(directory: str) -> list[str]:
    return sorted(glob.glob(os.path.join(directory, "capture-*.json")))


def progress_path(run_dir: str, virtual_rank: int) -> str:
    return os.path.join(run_dir, PROGRESS_DIR, f"rank-{virtual_rank:05d}.json")
