"""Our simulated iteration against ASTRA-sim's on the same traces: end time and per-collective times.

Why: `export chakra` promises that ASTRA-sim runs what we simulate. The check is a 16-NPU job, TP2
PP2 DP4 on two DGX H100 nodes, in two variants: with the distributed optimizer (gradients
reduce-scattered and parameters all-gathered over DP) and without (one DP all-reduce). For each:

1. our simulator (`prism_megatron.sim`, the `dgx-h100` preset's NCCL cost model) gives the iteration
   time and every collective's time from its issue to its completion on each rank;
2. the graph is exported as ASTRA-sim reads it (`export chakra --all-ranks --cluster dgx-h100`,
   `export astra-network dgx-h100 --world-size 16`, plus the system and remote-memory files
   written here), and, when `--astra-sim BIN` names ASTRA-sim's analytical binary, ASTRA-sim runs it:
   its end time is the largest "sys[N] finished, T cycles" (cycles are ns there), its per-collective
   times come from the issue / callback lines of its debug log (the lines Chakra's timeline
   visualizer reads; `trace-enabled` is set in the system file).

Goal: the end times within 1 %. Per-collective times are listed side by side; they differ by
construction where the models differ (ours picks NCCL's cheapest algorithm and protocol with
per-call base latencies; ASTRA-sim runs a ring per dimension with its own chunking), which the
Markdown says next to them.

The graph is the synthetic pipeline of `prism_megatron.sim.synthetic` (Megatron's 1F1B order, TP
all-reduces after each compute piece, pipeline sends on their own stream) with the sizes of a
GPT layer stack (hidden 4096, sequence 4096, bf16); a run folder's own graph can be given instead
with `--graph RUN/graph` (then only that graph is compared).

Run: ``python -m benchmarks.astra.run [--astra-sim BIN] [--graph DIR] [--work DIR] [--out DIR]``.
Without --astra-sim it writes the inputs, our numbers and the command that runs ASTRA-sim on them.
How to build ASTRA-sim: benchmarks/astra/README.md. Writes ``<DIR>/<YYYY-MM-DD>-astra.json`` / ``.md``.
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import re
import statistics
import subprocess
import sys
import time

from benchmarks import common
from prism_megatron import files
from prism_megatron.graph import ExpandedGraph, load_graph, world_from_metadata
from prism_megatron.graph.chakra import export_chakra
from prism_megatron.graph.chakra.export import node_ids
from prism_megatron.graph.schema import COMPUTE_STREAM, ExecutionGraph, NodeType, RoleGraph
from prism_megatron.graph.world import LayoutWorld
from prism_megatron.network import PRESETS, CostModel
from prism_megatron.network.astra import astra_network_yaml
from prism_megatron.replay.schedule import OpKind
from prism_megatron.sim import PipelineSpec, layout_pipeline_graph, simulate
from prism_megatron.sim.cost import NetworkCost
from prism_megatron.topology import Layout

CLUSTER = "dgx-h100"
LAYOUT = Layout(world_size=16, tp=2, pp=2)
MIB = 1 << 20
SPEC = PipelineSpec(
    num_microbatches=8,
    fwd_ns=2_000_000,
    bwd_ns=4_000_000,
    activation_bytes=32 * MIB,  # sequence 4096 x hidden 4096 x bf16
    tp_allreduce_bytes=32 * MIB,
    tp_allreduces_per_chunk=4,  # two layers per stage, two all-reduces each
    dp_grad_bytes=384 * MIB,  # bf16 gradients of two layers' TP shard (2 x 12 h^2 / 2 parameters)
    optimizer_ns=3_000_000,
)
GOAL_END_TIME = 0.01
SYSTEM = {
    # ASTRA-sim's system layer: a ring per dimension for every collective, one chunk at a time, as
    # close to a single NCCL ring as its model gets; trace-enabled for the issue / callback lines.
    "scheduling-policy": "FIFO",
    "endpoint-delay": 0,
    "active-chunks-per-dimension": 1,
    "preferred-dataset-splits": 1,
    "all-reduce-implementation": ["ring", "ring"],
    "all-gather-implementation": ["ring", "ring"],
    "reduce-scatter-implementation": ["ring", "ring"],
    "all-to-all-implementation": ["direct", "direct"],
    "collective-optimization": "localBWAware",
    "local-mem-bw": 3350,
    "boost-mode": 0,
    "trace-enabled": 1,
}
REMOTE_MEMORY = {"memory-type": "NO_MEMORY_EXPANSION"}
_FINISHED = re.compile(r"sys\[(\d+)\] finished, (\d+) cycles")
_EVENT = re.compile(r"(issue|callback),sys->id=(\d+), tick=(\d+), node->id=(\d+), node->name=([^,]*),")


def without_distributed_optimizer(graph: ExecutionGraph) -> ExecutionGraph:
    """The same job with Megatron's plain DDP: the DP reduce-scatter of gradients becomes an all-reduce
    of the same buffer, and the parameter all-gather after the optimizer goes (it is the compute
    stream's last op, so no dependency points at it)."""
    roles = {}
    for name, role in graph.roles.items():
        ops = list(role.streams[COMPUTE_STREAM])
        last = ops[-1]
        if not (last.comm == OpKind.ALL_GATHER and last.group == "dp"):
            raise ValueError(f"role {name}: the compute stream does not end with the DP all-gather")
        ops = [
            dataclasses.replace(op, comm=OpKind.ALL_REDUCE)
            if op.comm == OpKind.REDUCE_SCATTER and op.group == "dp"
            else op
            for op in ops[:-1]
        ]
        roles[name] = RoleGraph(role=name, streams={**role.streams, COMPUTE_STREAM: tuple(ops)})
    return ExecutionGraph(graph.metadata, roles)


def collective_key(op) -> str:
    size = f"{op.size_bytes / MIB:g} MiB" if op.size_bytes >= MIB else f"{op.size_bytes} B"
    return f"{op.comm.name} {op.group} {size}"


def ours(expanded: ExpandedGraph, cost) -> dict:
    """Our iteration time and, per collective key, the issue-to-completion times over every rank."""
    result = simulate(expanded.graph, expanded.world, cost, symmetric=False)
    per_key: dict[str, list[float]] = {}
    for rank in range(expanded.world_size):
        for timing in result.timeline(rank):
            if timing.op.type == NodeType.COLLECTIVE:
                key = collective_key(timing.op)
                per_key.setdefault(key, []).append((timing.end_ns - timing.start_ns) / 1e3)
    return {"end_us": result.iteration_time_ns / 1e3, "collectives_us": per_key}


def write_inputs(expanded: ExpandedGraph, cost, work: str) -> dict[str, str]:
    """Every file ASTRA-sim needs, and the command line that runs it (BIN left as a placeholder)."""
    os.makedirs(work, exist_ok=True)
    export_chakra(expanded, os.path.join(work, "et"), all_ranks=True, cost_fn=cost)
    paths = {
        "workload": os.path.join(work, "et", "chakra"),
        "comm_groups": os.path.join(work, "et", "comm_groups.json"),
        "network": os.path.join(work, "network.yml"),
        "system": os.path.join(work, "system.json"),
        "remote_memory": os.path.join(work, "remote_memory.json"),
        "logs": os.path.join(work, "astra-log"),
    }
    files.write_atomically(paths["network"], astra_network_yaml(PRESETS[CLUSTER], expanded.world_size))
    files.write_json(SYSTEM, paths["system"], indent=1)
    files.write_json(REMOTE_MEMORY, paths["remote_memory"], indent=1)
    return paths


def astra_command(binary: str, paths: dict[str, str]) -> list[str]:
    return [
        binary,
        f"--workload-configuration={paths['workload']}",
        f"--comm-group-configuration={paths['comm_groups']}",
        f"--system-configuration={paths['system']}",
        f"--remote-memory-configuration={paths['remote_memory']}",
        f"--network-configuration={paths['network']}",
        f"--logging-folder={paths['logs']}",
    ]


def node_keys(expanded: ExpandedGraph, virtual_rank: int) -> dict[int, str | None]:
    """node id of the rank's trace -> collective key (None for other nodes), with the export's ids."""
    streams = expanded.streams(virtual_rank)
    out = {}
    for (name, index), node_id in node_ids(streams).items():
        op = streams[name][index].op
        out[node_id] = collective_key(op) if op.type == NodeType.COLLECTIVE else None
    return out


def run_astra(binary: str, paths: dict[str, str], expanded: ExpandedGraph) -> dict:
    """ASTRA-sim's end time and per-collective issue-to-callback times (ns ticks, in us)."""
    started = time.monotonic()
    done = subprocess.run(astra_command(binary, paths), capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise RuntimeError(f"ASTRA-sim exited {done.returncode}: {(done.stdout + done.stderr)[-2000:]}")
    finished = {int(npu): int(cycles) for npu, cycles in _FINISHED.findall(done.stdout + done.stderr)}
    if len(finished) != expanded.world_size:
        raise RuntimeError(f"ASTRA-sim reported {len(finished)} finished NPUs of {expanded.world_size}")
    issued: dict[tuple[int, int], int] = {}
    per_key: dict[str, list[float]] = {}
    keys = {npu: node_keys(expanded, npu) for npu in range(expanded.world_size)}
    log_text = ""
    for name in sorted(os.listdir(paths["logs"])):
        if name.startswith("log"):
            with open(os.path.join(paths["logs"], name), encoding="utf-8", errors="replace") as f:
                log_text += f.read()
    for kind, npu, tick, node_id, _ in _EVENT.findall(log_text):
        at = (int(npu), int(node_id))
        if kind == "issue":
            issued[at] = int(tick)
        elif at in issued and keys[at[0]].get(at[1]):
            per_key.setdefault(keys[at[0]][at[1]], []).append((int(tick) - issued.pop(at)) / 1e3)
    return {
        "end_us": max(finished.values()) / 1e3,
        "collectives_us": per_key,
        "wall_s": time.monotonic() - started,
    }


def compare_case(name: str, expanded: ExpandedGraph, cost, work: str, binary: str | None) -> dict:
    mine = ours(expanded, cost)
    paths = write_inputs(expanded, cost, os.path.join(work, name))
    record = {
        "case": name,
        "ours_end_us": mine["end_us"],
        "command": " ".join(astra_command(binary or "ASTRA_SIM_BIN", paths)),
        "collectives": {},
    }
    theirs = run_astra(binary, paths, expanded) if binary else None
    if theirs is not None:
        record["astra_end_us"] = theirs["end_us"]
        record["end_time_error"] = theirs["end_us"] / mine["end_us"] - 1
        record["astra_wall_s"] = theirs["wall_s"]
    for key, values in sorted(mine["collectives_us"].items()):
        row = {"ours_median_us": statistics.median(values), "count": len(values)}
        if theirs is not None and theirs["collectives_us"].get(key):
            row["astra_median_us"] = statistics.median(theirs["collectives_us"][key])
        record["collectives"][key] = row
    return record


def markdown(record: dict) -> str:
    lines = [
        "# ASTRA-sim against our simulator on the same Chakra traces",
        "",
        common.machine_line(record["environment"]),
        "",
        f"Job: 16 NPUs, TP2 PP2 DP4, cluster `{CLUSTER}` ({record['astra_sim'] or 'ASTRA-sim not run'}).",
        "",
        "| case | ours end (us) | ASTRA-sim end (us) | error | goal <= 1 % |",
        "|---|---:|---:|---:|---|",
    ]
    for case in record["cases"]:
        if "astra_end_us" in case:
            met = "met" if abs(case["end_time_error"]) <= GOAL_END_TIME else "**NOT met**"
            theirs, error = f"{case['astra_end_us']:.1f}", f"{100 * case['end_time_error']:+.2f} %"
        else:
            met, theirs, error = "not run", "-", "-"
        lines.append(f"| {case['case']} | {case['ours_end_us']:.1f} | {theirs} | {error} | {met} |")
    if not record["astra_sim"]:
        lines += [
            "",
            "ASTRA-sim not run (no --astra-sim binary; benchmarks/astra/README.md says how to build one): "
            "the end-time goal is **not judged** here. The inputs it would read were written, and the "
            "command that runs it on them is below each case.",
        ]
    for case in record["cases"]:
        lines += [
            "",
            f"## {case['case']}: per collective, median issue-to-completion (us)",
            "",
            "| collective | count | ours | ASTRA-sim |",
            "|---|---:|---:|---:|",
        ]
        for key, row in case["collectives"].items():
            theirs = f"{row['astra_median_us']:.1f}" if "astra_median_us" in row else "-"
            lines.append(f"| {key} | {row['count']} | {row['ours_median_us']:.1f} | {theirs} |")
        lines += ["", f"ASTRA-sim command: `{case['command']}`"]
    lines += [
        "",
        "Issue-to-completion includes waiting for the other members. The models differ: ours picks NCCL's "
        "cheapest algorithm and protocol with its per-call base latency (NVLink SHARP where the cluster "
        "has it); ASTRA-sim runs a ring per dimension of its network (one ring over a group smaller than "
        "the job), charging each message hops x link latency plus its size over the link bandwidth, and "
        "each received message that a reduce-scatter or the reduce-scatter half of an all-reduce adds "
        "up another three passes over local memory (two reads, one write at `local-mem-bw`), which "
        "NCCL's reduction, fused into its copy, does not cost. ASTRA-sim also keeps one communication "
        "in flight per NPU (receives aside) and completes a send without waiting for its receive; ours "
        "overlaps a pipeline send with the compute stream's collectives and pairs it with its receive. "
        "It replays a broadcast for the duration the export gives it.",
    ]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--astra-sim", help="ASTRA-sim's AstraSim_Analytical_Congestion_Unaware binary")
    parser.add_argument("--graph", help="compare this graph folder (a run's graph/) instead of the two cases")
    parser.add_argument("--work", default="astra-work", help="folder for the traces and configuration files")
    parser.add_argument("--out", default=common.RESULTS_DIR, help="folder for the results")
    args = parser.parse_args(argv)
    if args.astra_sim and not os.access(args.astra_sim, os.X_OK):
        parser.error(f"--astra-sim {args.astra_sim!r} is not an executable file")
    cost = NetworkCost(CostModel(PRESETS[CLUSTER]))
    if args.graph:
        graph = load_graph(args.graph)
        cases = {"graph": ExpandedGraph(graph, world_from_metadata(graph.metadata.layout))}
    else:
        with_distopt = layout_pipeline_graph(LAYOUT, SPEC)
        world = LayoutWorld(LAYOUT)
        cases = {
            "distributed-optimizer": ExpandedGraph(with_distopt, world),
            "ddp": ExpandedGraph(without_distributed_optimizer(with_distopt), world),
        }
    record = {
        "date": common.today(),
        "environment": common.environment(),
        "astra_sim": args.astra_sim,
        "cluster": CLUSTER,
        "system": SYSTEM,
        "cases": [compare_case(name, ex, cost, args.work, args.astra_sim) for name, ex in cases.items()],
    }
    paths = common.write_results("astra", record, markdown(record), args.out)
    print(markdown(record), end="")
    print(f"wrote {paths[0]} and {paths[1]}", file=sys.stderr)
    missed = [
        c for c in record["cases"] if "end_time_error" in c and abs(c["end_time_error"]) > GOAL_END_TIME
    ]
    return 1 if missed else 0


if __name__ == "__main__":
    sys.exit(main())
