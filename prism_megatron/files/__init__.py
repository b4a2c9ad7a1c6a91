"""Files on the bottom floor: the one atomic writer, and every name inside a run folder.

Both sit below every package (they import nothing of the project), so topology and replay up to the
commands, the benchmarks and the tools all write files and name run-folder paths the same way:

    from prism_megatron import files
    files.write_json(doc, files.op_log_path(run_dir, virtual_rank))
"""

from prism_megatron.files.atomic import TEMPORARY_PREFIX, atomic_open, read_json, write_atomically, write_json
from prism_megatron.files.run_folder import (
    CAPTURE_DIR,
    CHAKRA_DIR,
    COMPARE_DIR,
    COMPARE_JSON,
    COMPARE_MD,
    COMPARE_PNG,
    GRAPH_DIR,
    GRAPH_FILE,
    LAUNCHER_LOG,
    LOGS_DIR,
    OPS_DIR,
    PLOTS_DIR,
    PROGRESS_DIR,
    REPORT_JSON,
    REPORT_MD,
    RUN_ENTRIES,
    SIMULATED_SPANS_FILE,
    SIMULATION_DIR,
    SPANS_DIR,
    TIMELINE_JSON,
    capture_path,
    capture_paths,
    is_rank_file,
    op_log_dir,
    op_log_path,
    progress_path,
    results_path,
    results_paths,
    schedule_path,
)

__all__ = [
    "CAPTURE_DIR",
    "CHAKRA_DIR",
    "COMPARE_DIR",
    "COMPARE_JSON",
    "COMPARE_MD",
    "COMPARE_PNG",
    "GRAPH_DIR",
    "GRAPH_FILE",
    "LAUNCHER_LOG",
    "LOGS_DIR",
    "OPS_DIR",
    "PLOTS_DIR",
    "PROGRESS_DIR",
    "REPORT_JSON",
    "REPORT_MD",
    "RUN_ENTRIES",
    "SIMULATED_SPANS_FILE",
    "SIMULATION_DIR",
    "SPANS_DIR",
    "TEMPORARY_PREFIX",
    "TIMELINE_JSON",
    "atomic_open",
    "capture_path",
    "capture_paths",
    "is_rank_file",
    "op_log_dir",
    "op_log_path",
    "progress_path",
    "read_json",
    "results_path",
    "results_paths",
    "schedule_path",
    "write_atomically",
    "write_json",
]
