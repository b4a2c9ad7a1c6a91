"""What a run can check before its first process: the cluster, a reused graph, the script, the folder.

A mistake found after the capture pass costs minutes, leaves a run folder behind and reads as a
failure of the run; found here it is one line, exit status 2, and nothing is created. `plan_run`
calls `check` once the plan is made, so every entry (the command, --report-only, the SLURM chain)
gets the same checks.
"""

from __future__ import annotations

import os
import sys

from prism_megatron.files import check_output
from prism_megatron.topology import Layout

BUILTIN = "builtin"
"""The script name of the built-in training entry (`prism_megatron.launch builtin`)."""
MODEL_FACTS = ("num_layers", "hidden_size", "seq_length", "micro_batch_size", "num_microbatches")
"""Facts of the job a graph records (metadata.extra) that must match for it to be reused."""


def check(
    *,
    cluster: str,
    script: str,
    out_dir: str | None,
    graph_path: str | None,
    layout: Layout,
    facts: dict[str, object],
):
    """Every check below, in order, on what the plan holds (it calls this; this module knows no
    plan); ValueError naming the flag and the fix. Returns the graph --prism-graph names, loaded
    (None without it), for the run to use.

    `out_dir`: the run folder to be created (None: it holds the passes' outputs already, --report-only);
    `facts`: the job's facts a reused graph must record (`RunPlan.graph_facts`)."""
    check_cluster(cluster)
    check_script(script)
    if out_dir is not None:
        check_output(out_dir, "--prism-out", directory=True)
    return check_graph(graph_path, layout, facts) if graph_path is not None else None


def check_cluster(source: str) -> None:
    """The cluster preset or file (a cluster spec, or costs measured where the job runs), loaded and
    validated whole, as every pass that simulates will read it (`closed_loop.network_cost`)."""
    from prism_megatron.passes.closed_loop import network_cost

    try:
        network_cost(source)
    except ValueError as exc:
        raise ValueError(f"--prism-cluster {source}: {exc}") from None


def check_script(script: str, name: str = "--script") -> None:
    """A Megatron-LM script exists and its checkout's `megatron.training` is importable from it.

    The real processes import `megatron.training` with the script's folder on the path, after the
    installed megatron-core (`megatron.run.script.make_importable`); `megatron` is a namespace
    package, so that works when any folder on that path holds `megatron/training/`.
    """
    if script == BUILTIN:
        return
    if not os.path.isfile(script):
        raise ValueError(f"{name} {script!r} is not a file; give a Megatron-LM training script")
    folder = os.path.dirname(os.path.abspath(script))
    path = [folder, *(entry or os.getcwd() for entry in sys.path)]
    if not any(os.path.isfile(os.path.join(entry, "megatron", "training", "__init__.py")) for entry in path):
        raise ValueError(
            f"{name} {script}: Megatron-LM's megatron.training is not importable from it ({folder} holds no "
            "megatron/training/); give the pretrain_gpt.py of a Megatron-LM checkout whose tag matches the "
            "installed megatron-core, or put that checkout on PYTHONPATH"
        )


def check_graph(path: str, layout: Layout, facts: dict[str, object]):
    """A reused graph is whole (its digest) and describes this job (its layout and model facts);
    returns it (an `ExecutionGraph`)."""
    from prism_megatron.passes.closed_loop import load_or_build_graph

    try:
        graph = load_or_build_graph(path, layout, extra=facts)
    except (OSError, ValueError) as exc:
        message = str(exc)
        raise ValueError(
            message if message.startswith("--prism-graph") else f"--prism-graph {path}: {message}"
        ) from None
    mismatches = graph.metadata.mismatches(layout.kwargs(), {key: facts[key] for key in MODEL_FACTS})
    if mismatches:
        raise ValueError(
            f"--prism-graph {path} was captured for another job: {'; '.join(mismatches)}; "
            "capture again (leave out --prism-graph) or pass the flags it was captured with"
        )
    return graph
