"""Export for other tools: Chakra execution traces of a run's graph, a cluster as ASTRA-sim's network."""

from __future__ import annotations

import argparse
import os
import re
import shutil

from prism_megatron import files
from prism_megatron.topology.grid import MAX_WORLD_SIZE

NAME = "export"
HELP = "export a graph as Chakra execution traces, or a cluster as ASTRA-sim's network configuration"

_SIZE = re.compile(r"^\s*([0-9]*\.?[0-9]+)\s*([KMGT]?i?B)?\s*$", re.IGNORECASE)
_UNITS = {"": 1, "b": 1, "kb": 10**3, "mb": 10**6, "gb": 10**9, "tb": 10**12}
_UNITS |= {"kib": 1 << 10, "mib": 1 << 20, "gib": 1 << 30, "tib": 1 << 40}


def add_arguments(parser: argparse.ArgumentParser) -> None:
    parser.description = "Write what prism-megatron knows in the formats of the Chakra / ASTRA-sim ecosystem."
    kinds = parser.add_subparsers(dest="kind", metavar="KIND", required=True, parser_class=type(parser))
    chakra = kinds.add_parser(
        "chakra",
        help="binary Chakra execution traces (.et) of a run's execution graph",
        description="Write Chakra execution traces (length-delimited protobuf, Chakra's schema) of the "
        "execution graph in RUN_OR_GRAPH_DIR: by default one file per role (its representative rank's) "
        "and roles.json; with --all-ranks one file per NPU, <prefix>.<npu>.et, as ASTRA-sim reads them "
        "(--workload-configuration DIR/<prefix>). comm_groups.json maps the communicator-group ids "
        "(--comm-group-configuration).",
    )
    chakra.add_argument(
        "source", metavar="RUN_OR_GRAPH_DIR", help="a run folder (with graph/) or a graph folder"
    )
    chakra.add_argument("--out", required=True, help="folder for the traces")
    chakra.add_argument("--all-ranks", action="store_true", help="one file per NPU of the whole job")
    chakra.add_argument("--prefix", default="chakra", help="file name prefix (default: chakra)")
    chakra.add_argument(
        "--max-size",
        default="4GiB",
        help="refuse --all-ranks when its estimated size is larger (default: 4GiB; e.g. 500MB, 20GiB)",
    )
    chakra.add_argument(
        "--cluster",
        help="network preset or cluster file: each broadcast gets its modelled time as its duration, "
        "which ASTRA-sim replays (it simulates all-reduce, all-gather, reduce-scatter and all-to-all only)",
    )
    network = kinds.add_parser(
        "astra-network",
        help="a cluster preset or file as ASTRA-sim's analytical network configuration (YAML)",
        description="Write the cluster (a preset name or a cluster file) as the YAML of ASTRA-sim's "
        "analytical network backend (--network-configuration) for a job of --world-size NPUs.",
    )
    network.add_argument("cluster", metavar="CLUSTER", help="preset name (dgx-h100, ...) or cluster file")
    network.add_argument("--world-size", type=int, required=True, help="NPUs of the job (W)")
    network.add_argument("--out", required=True, help="the YAML file to write")


def run(args: argparse.Namespace) -> int:
    return _chakra(args) if args.kind == "chakra" else _astra_network(args)


MAX_SIZE_BYTES = 1 << 50
"""--max-size's upper bound (1 PiB)."""


def parse_size(text: str) -> int:
    """'4GiB', '500MB', '1e9' -> bytes (ValueError naming --max-size)."""
    match = _SIZE.match(text)
    try:
        value = float(match.group(1)) * _UNITS[(match.group(2) or "").lower()] if match else float(text)
    except ValueError:
        raise ValueError(f"--max-size {text!r}: expected a size such as 500MB or 4GiB") from None
    if not 0 < value <= MAX_SIZE_BYTES:  # NaN and infinity fail the comparison too
        raise ValueError(f"--max-size {text!r}: expected a size > 0 and at most 1PiB, such as 500MB or 4GiB")
    return int(value)


def check_prefix(prefix: str) -> str:
    """--prefix names files inside --out: a plain name, no folder part, nothing that leaves --out."""
    if (
        not prefix
        or prefix in (".", "..")
        or os.path.basename(prefix) != prefix
        or "/" in prefix
        or any(ord(c) < 32 for c in prefix)
    ):
        raise ValueError(
            f"--prefix {prefix!r} must be a plain file-name prefix (no folder part, no '/' or control "
            "characters), such as chakra; the traces go inside --out"
        )
    return prefix


def _graph_dir(source: str) -> str:
    if os.path.isfile(os.path.join(source, files.GRAPH_FILE)):
        return source
    if os.path.isfile(os.path.join(source, files.GRAPH_DIR, files.GRAPH_FILE)):
        return os.path.join(source, files.GRAPH_DIR)
    raise ValueError(f"RUN_OR_GRAPH_DIR {source!r} holds neither graph.json nor graph/graph.json")


def _chakra(args: argparse.Namespace) -> int:
    from prism_megatron.graph import ExpandedGraph, load_graph, world_from_metadata
    from prism_megatron.graph.chakra import export_chakra

    max_bytes = parse_size(args.max_size)
    prefix = check_prefix(args.prefix)
    files.check_output(args.out, "--out", directory=True)
    graph_dir = _graph_dir(args.source)
    graph = load_graph(graph_dir)
    expanded = ExpandedGraph(graph, world_from_metadata(graph.metadata.layout))
    cost_fn = None
    if args.cluster is not None:
        from prism_megatron.network import CostModel, load_cluster
        from prism_megatron.sim.cost import NetworkCost

        cost_fn = NetworkCost(CostModel(load_cluster(args.cluster)))
    existed = os.path.exists(args.out)
    try:
        exported = export_chakra(
            expanded, args.out, all_ranks=args.all_ranks, prefix=prefix, max_bytes=max_bytes, cost_fn=cost_fn
        )
    except BaseException:
        if not existed:  # a refusal or a failure half-way leaves no folder behind
            shutil.rmtree(args.out, ignore_errors=True)
        raise
    traces = [p for p in exported.paths if p.endswith(".et")]
    what = f"every NPU of {expanded.world_size}" if args.all_ranks else "one per role"
    print(
        f"wrote {len(traces)} Chakra traces ({what}, {exported.num_bytes / (1 << 20):.2f} MiB) to {args.out}"
    )
    for path in exported.paths:
        if not path.endswith(".et"):
            print(f"wrote {path}")
    if not args.all_ranks:
        print("ASTRA-sim needs every NPU's trace: add --all-ranks (the size is estimated first)")
    return 0


def _astra_network(args: argparse.Namespace) -> int:
    from prism_megatron.network import load_cluster
    from prism_megatron.network.astra import astra_network_yaml

    if not 1 <= args.world_size <= MAX_WORLD_SIZE:
        raise ValueError(f"--world-size must be from 1 to {MAX_WORLD_SIZE}, got {args.world_size}")
    files.check_output(args.out, "--out")
    text = astra_network_yaml(load_cluster(args.cluster), args.world_size)
    files.write_atomically(args.out, text)
    print(text, end="")
    print(f"wrote {args.out}")
    return 0
