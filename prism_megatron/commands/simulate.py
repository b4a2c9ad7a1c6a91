"""Predict a target job's iteration time from its execution graph, with what-ifs, and write a timeline."""

from __future__ import annotations

import argparse
import os
import sys

from prism_megatron import files

NAME = "simulate"
HELP = "predict the iteration time of a graph's job, per-role breakdown, timeline and replay schedules"


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = (
        "Simulate one training iteration of the whole target job described by an execution graph "
        "(a directory written by the capture or by prism_megatron.graph.save_graph) over a network "
        "model. Prints the predicted iteration time and, per role, compute, exposed communication "
        "and pipeline bubble; writes a Perfetto timeline and the replay schedules of the real ranks."
    )
    parser.add_argument("graph_dir", metavar="GRAPH_DIR", help="directory holding graph.json")
    parser.add_argument(
        "--cluster", default="default", help="network preset name or cluster file (default: default)"
    )
    parser.add_argument(
        "--straggler",
        action="append",
        default=[],
        metavar="RANK:FACTOR",
        help="slow a virtual rank's compute by FACTOR (repeatable); simulates every rank",
    )
    parser.add_argument(
        "--slow-nic",
        action="append",
        default=[],
        metavar="RANK:FACTOR",
        help="slow every communication op a virtual rank takes part in by FACTOR (repeatable)",
    )
    parser.add_argument(
        "--expert-imbalance",
        action="append",
        default=[],
        metavar="EP_RANK:FACTOR",
        help="slow the expert compute of every rank of one expert-parallel rank by FACTOR (a hot expert)",
    )
    parser.add_argument("--full", action="store_true", help="simulate every rank even without a what-if")
    parser.add_argument(
        "--real-ranks",
        default="slice",
        metavar="SPEC",
        help="ranks to write replay schedules for: slice (default), 0,7168, 'pp=0;tp=0' ...",
    )
    parser.add_argument(
        "--trace-ranks",
        default=None,
        metavar="SPEC",
        help="ranks in the timeline (default: each role's representative, stragglers, real ranks)",
    )
    parser.add_argument(
        "--chakra",
        action="store_true",
        help="also export the traced ranks as Chakra execution traces (chakra/<prefix>.<rank>.et)",
    )
    parser.add_argument(
        "--out", default=None, metavar="DIR", help="output directory (default: GRAPH_DIR/simulation)"
    )


def run(args: argparse.Namespace) -> int:
    from prism_megatron.graph import load_graph
    from prism_megatron.graph.world import world_from_metadata
    from prism_megatron.passes.closed_loop import network_cost
    from prism_megatron.sim import (
        DeadlockError,
        SimulationFault,
        WhatIf,
        parse_rank_factors,
        simulate,
    )
    from prism_megatron.topology import select_ranks

    out = args.out or os.path.join(args.graph_dir, files.SIMULATION_DIR)
    files.check_output(out, "--out" if args.out else f"GRAPH_DIR/{files.SIMULATION_DIR}", directory=True)
    graph = load_graph(args.graph_dir)
    world = world_from_metadata(graph.metadata.layout)
    what_if = WhatIf(
        stragglers=_in_world(
            parse_rank_factors(args.straggler, "--straggler"), world.world_size, "--straggler"
        ),
        slow_nics=_in_world(parse_rank_factors(args.slow_nic, "--slow-nic"), world.world_size, "--slow-nic"),
        expert_slowdowns=_expert_ranks(
            world.layout, parse_rank_factors(args.expert_imbalance, "--expert-imbalance")
        ),
    )
    real_ranks = select_ranks(world.layout, args.real_ranks)
    cost = network_cost(args.cluster)
    slowdown = _compute_slowdown(graph, args.graph_dir)
    try:
        result = simulate(
            graph, world, cost, what_if, symmetric=False if args.full else None, compute_slowdown=slowdown
        )
    except (DeadlockError, SimulationFault) as exc:
        print(f"prism-megatron simulate: {exc}", file=sys.stderr)
        return 1
    os.makedirs(out, exist_ok=True)
    _print_summary(result, what_if)
    extra = [*what_if.stragglers, *what_if.slow_nics, *real_ranks]
    trace_ranks = select_ranks(world.layout, args.trace_ranks) if args.trace_ranks else None
    for path in _write_outputs(result, graph, world, out, real_ranks, trace_ranks, extra, args.chakra):
        print(f"wrote {path}")
    return 0


def _compute_slowdown(graph, graph_dir: str) -> float:
    """The contention term's slowdown (`sim.contention`) for the device the graph was captured on: its
    metadata's, or, for a graph written before graphs recorded it, the device in the report.json of
    the run folder that holds GRAPH_DIR (the run that captured it)."""
    from prism_megatron.sim.contention import compute_slowdown_of, graph_device

    device = graph_device(graph.metadata.extra)
    if device is None:
        device = _report_device(os.path.dirname(os.path.abspath(graph_dir)))
        if device is not None:
            print(f"device {device} (the graph records none): from the run's {files.REPORT_JSON}")
    return compute_slowdown_of(device)


def _report_device(run_dir: str) -> str | None:
    """--prism-device of the run in `run_dir`, from its report.json; None without a readable one."""
    import json

    try:
        with open(os.path.join(run_dir, files.REPORT_JSON), encoding="utf-8") as handle:
            report = json.load(handle)
    except (OSError, ValueError):
        return None
    device = ((report.get("prism") or {}).get("emulation") or {}).get("device")
    return str(device) if isinstance(device, str) and device else None


def _expert_ranks(layout, factors: dict[int, float]) -> dict[int, float]:
    """{EP rank: factor} -> {virtual rank: factor} over every rank holding that expert shard."""
    from prism_megatron.topology import select_ranks

    out = {}
    for ep_rank, factor in factors.items():
        if ep_rank >= layout.ep:
            raise ValueError(
                f"--expert-imbalance EP rank {ep_rank} is outside 0..{layout.ep - 1} (EP = {layout.ep})"
            )
        out.update(dict.fromkeys(select_ranks(layout, f"ep={ep_rank}"), factor))
    return out


def _in_world(table: dict[int, float], world_size: int, flag: str) -> dict[int, float]:
    for rank in table:
        if rank >= world_size:
            raise ValueError(f"{flag} rank {rank} is outside the world (0..{world_size - 1})")
    return table


def _print_summary(result, what_if) -> None:
    from prism_megatron.sim import breakdown, rank_breakdown
    from prism_megatron.sim.breakdown import format_table

    mode = "symmetric (one rank per role)" if result.problem.symmetric else "full (every rank)"
    print(f"simulated {result.problem.num_nodes} nodes, {mode}, {result.num_events} events")
    print(format_table(breakdown(result), result.iteration_time_ns))
    injected = sorted({*what_if.stragglers, *what_if.slow_nics})  # expert shards show as their roles
    if injected:
        print("what-if ranks:")
        print(
            format_table([rank_breakdown(result, r) for r in injected], result.iteration_time_ns).split(
                "\n", 1
            )[1]
        )


def _write_outputs(result, graph, world, out, real_ranks, trace_ranks, extra, chakra) -> list[str]:
    from prism_megatron.graph.chakra import export_chakra
    from prism_megatron.graph.expand import ExpandedGraph
    from prism_megatron.report.trace import write_chrome_trace
    from prism_megatron.sim import replay_schedules
    from prism_megatron.sim.timeline import default_ranks, process_names, spans

    ranks = trace_ranks if trace_ranks is not None else default_ranks(result, extra)
    paths = [
        write_chrome_trace(
            os.path.join(out, files.TIMELINE_JSON), spans(result, ranks), process_names(result, ranks)
        )
    ]
    for rank, schedule in replay_schedules(result, real_ranks).items():
        path = files.schedule_path(out, rank)
        schedule.save(path)
        paths.append(path)
    if chakra:
        paths += export_chakra(ExpandedGraph(graph, world), os.path.join(out, files.CHAKRA_DIR), ranks).paths
    return paths
