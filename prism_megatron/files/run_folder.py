"""Every name inside a run folder (`--prism-out`), in one place: the orchestrator, the real ranks,
the report and the commands that read a run folder back all build their paths here.

    <run>/report.json, report.md, timeline.json   the report (prism_megatron.report)
    <run>/plots/<name>.png                        the report's plots
    <run>/spans/simulated.json                    the simulated virtual tracks the timeline draws
    <run>/graph/graph.json                        the execution graph (--prism-graph, simulate)
    <run>/simulation/schedule-<rank>.json         replay schedules of the real ranks (none modelled)
    <run>/capture/capture-<rank>.json             what each slice rank recorded (rank-<rank>.json beside)
    <run>/rank-<rank>.json                        each real rank's results
    <run>/ops/rank-<rank>.json                    each real rank's measured op log
    <run>/progress/rank-<rank>.json               where each real process is (for progress)
    <run>/logs/<launch>/launcher.log, ...         each launch's output, per process
    <out>/watchdog/rank-<rank>.hung.json, .stacks.txt, .flight-recorder.txt
                                                  a hung rank's verdict, and every rank's stacks
                                                  and flight recorder (in each pass's --prism-out)
    <run>/compare/compare.md, .json, .png         `prism-megatron compare`'s verdict (this run as B)
    <simulation>/chakra/                          Chakra traces `simulate --chakra` exports

<rank> is the virtual rank in five digits (`rank-00008.json`), except in the schedules' names, which
`prism-megatron simulate` has always written with the plain number (`schedule-8.json`).
"""

from __future__ import annotations

import glob
import os

REPORT_JSON = "report.json"
REPORT_MD = "report.md"
TIMELINE_JSON = "timeline.json"
PLOTS_DIR = "plots"
SPANS_DIR = "spans"
SIMULATED_SPANS_FILE = os.path.join(SPANS_DIR, "simulated.json")
GRAPH_DIR = "graph"
GRAPH_FILE = "graph.json"
"""The file an execution-graph folder holds (in a run folder's graph/, or any folder `save_graph` writes)."""
SIMULATION_DIR = "simulation"
CAPTURE_DIR = "capture"
OPS_DIR = "ops"
PROGRESS_DIR = "progress"
LOGS_DIR = "logs"
LAUNCHER_LOG = "launcher.log"
COMPARE_DIR = "compare"
COMPARE_MD = "compare.md"
COMPARE_JSON = "compare.json"
COMPARE_PNG = "compare.png"
CHAKRA_DIR = "chakra"
WATCHDOG_DIR = "watchdog"
MEMORY_DIR = "memory"
"""--prism-memory-history's allocator histories (`memory_history_path`)."""
HUNG_SUFFIX = ".hung.json"
STACKS_SUFFIX = ".stacks.txt"
RECORDER_SUFFIX = ".flight-recorder.txt"

RUN_ENTRIES = (REPORT_JSON, REPORT_MD, TIMELINE_JSON, PLOTS_DIR, SPANS_DIR, OPS_DIR, GRAPH_DIR,
               SIMULATION_DIR, CAPTURE_DIR, PROGRESS_DIR, LOGS_DIR, WATCHDOG_DIR, MEMORY_DIR)  # fmt: skip
"""What a run writes in its folder besides the per-rank results (what --prism-overwrite removes)."""


def _rank_file(virtual_rank: int) -> str:
    return f"rank-{virtual_rank:05d}.json"


def is_rank_file(name: str) -> bool:
    """Whether a file name is a per-rank file's (`rank-<rank>.json`)."""
    return name.startswith("rank-") and name.endswith(".json")


def results_path(directory: str, virtual_rank: int) -> str:
    """A real rank's results, in its --prism-out folder (the run folder, or capture/ in a capture pass)."""
    return os.path.join(directory, _rank_file(virtual_rank))


def results_paths(directory: str) -> list[str]:
    """Every per-rank results file in a folder, in rank order."""
    return sorted(glob.glob(os.path.join(directory, "rank-*.json")))


def memory_history_path(directory: str, virtual_rank: int) -> str:
    """A real rank's memory history (--prism-memory-history: the CUDA allocator's, or the live-storage
    account's on the CPU and a modelled GPU), in its --prism-out folder."""
    return os.path.join(directory, MEMORY_DIR, f"rank-{virtual_rank:05d}.pickle")


def op_log_dir(run_dir: str) -> str:
    return os.path.join(run_dir, OPS_DIR)


def op_log_path(run_dir: str, virtual_rank: int) -> str:
    """A real rank's measured op log."""
    return os.path.join(run_dir, OPS_DIR, _rank_file(virtual_rank))


def progress_path(run_dir: str, virtual_rank: int) -> str:
    """Where a real process says how far it got."""
    return os.path.join(run_dir, PROGRESS_DIR, _rank_file(virtual_rank))


def process_label(virtual_rank: int | None, physical_rank: int) -> str:
    """A process's name in its files: "rank-00008", or "process-1" before it knows its virtual rank."""
    return (
        f"process-{physical_rank}" if virtual_rank is None else _rank_file(virtual_rank).removesuffix(".json")
    )


def watchdog_path(out_dir: str, label: str, suffix: str) -> str:
    """A process's watchdog file (`HUNG_SUFFIX`, `STACKS_SUFFIX`, `RECORDER_SUFFIX`) in a pass's folder."""
    return os.path.join(out_dir, WATCHDOG_DIR, label + suffix)


def watchdog_paths(out_dir: str, suffix: str) -> list[str]:
    """Every process's watchdog file of one kind in a pass's folder, sorted."""
    return sorted(glob.glob(os.path.join(out_dir, WATCHDOG_DIR, "*" + suffix)))


def capture_path(directory: str, virtual_rank: int) -> str:
    """A capture-pass process's recording, in its --prism-out folder."""
    return os.path.join(directory, f"capture-{virtual_rank:05d}.json")


def capture_paths(directory: str) -> list[str]:
    return sorted(glob.glob(os.path.join(directory, "capture-*.json")))


def role_classes_path(directory: str) -> str:
    """Beside a folder of capture files: the role classes the capture was planned with."""
    return os.path.join(directory, "role-classes.json")


def schedule_path(directory: str, virtual_rank: int) -> str:
    """A real rank's replay schedule, in a simulation folder (the run's simulation/, or simulate --out)."""
    return os.path.join(directory, f"schedule-{virtual_rank}.json")
