"""Hybrid emulation end to end: capture the slice, build and simulate the graph, emulate, report.

    from prism_megatron.emulation import plan_run, run_plan, format_summary
    plan = plan_run(["--num-layers", "8", ..., "--prism-emulate", "--prism-world-size", "8192"])
    outcome = run_plan(plan)              # RunOutcome: report, simulation, per-rank results
    print(format_summary(outcome))

The phases, each a small pass over the `RunPlan` (`driver.py`):

1. plan (`plan.py`): the target job's layout, the real ranks (--prism-ranks), the slice (one rank
   per role) and the run folder; every user mistake is a ValueError here, before any process.
2. capture: the slice in passes of `nproc` real processes (torch's launcher, `launches.py`), each
   rank in the virtual world with instant virtual peers, recording its ops (`passes.rank.CapturePhase`);
   skipped with --prism-graph.
3. graph: the recordings become one role graph per role (`graph.capture`), saved in graph/.
4. simulate: one iteration of the whole job over the network model (--prism-cluster); the real
   ranks' replay schedules in simulation/.
5. emulate: the real ranks run the program (`passes.rank.EmulatePhase`): each simulates the graph itself,
   loads its replay schedule, and after each iteration folds what it measured into the next
   (`passes/closed_loop.py`).
6. report: report.json, report.md, timeline.json and plots (`outputs.py` over `prism_megatron.report`).

Several machines: run the passes by hand with your own torchrun or srun (`python -m
prism_megatron.launch SCRIPT <flags> --prism-emulate ...`): each capture batch with
`--prism-phase capture --prism-ranks <batch> --prism-out RUN/capture`, then the emulation with
`--prism-phase emulate --prism-graph RUN/capture` (a folder of capture files is built into the
graph by every rank alike) or `--prism-graph <a graph folder>`, `--prism-out RUN`; then
`prism-megatron emulate --report-only -- <the same flags> --prism-graph ... --prism-out RUN` writes
the report. RUN must be on a filesystem every node sees.

Knows no Megatron internals: the real processes run `prism_megatron.launch`, and the per-process
passes (`prism_megatron.passes`) are called by the training entries through the lifecycle of
`prism_megatron.megatron.run.runtime.Runtime`.
"""

from __future__ import annotations

import importlib

_EXPORTS = {
    "RunPlan": "plan",
    "plan_run": "plan",
    "RunOutcome": "driver",
    "run_plan": "driver",
    "Progress": "progress",
    "format_summary": "summary",
}

__all__ = sorted(_EXPORTS)


def __getattr__(name: str):
    if name not in _EXPORTS:
        raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
    module = importlib.import_module(f"{__name__}.{_EXPORTS[name]}")
    return getattr(module, "run" if name == "run_plan" else name)
