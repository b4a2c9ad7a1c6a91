"""Execution graphs: the schema, its printable form and files, expansion to every rank, export.

Chakra's binary traces are written by `prism_megatron.graph.chakra`. Knows nothing of Megatron: capture (in `prism_megatron.megatron`) fills the schema, the simulator
(`prism_megatron.sim`) reads it.
"""

from prism_megatron.graph.expand import ExpandedGraph, ResolvedOp
from prism_megatron.graph.io import load_graph, save_graph
from prism_megatron.graph.printable import format_op, parse_op
from prism_megatron.graph.schema import (
    COMPUTE_STREAM,
    SCHEMA_VERSION,
    WORLD_GROUP,
    Dep,
    ExecutionGraph,
    GraphMetadata,
    NodeType,
    Op,
    RoleGraph,
)
from prism_megatron.graph.world import ExplicitWorld, LayoutWorld, World, world_from_metadata

__all__ = [
    "COMPUTE_STREAM",
    "SCHEMA_VERSION",
    "WORLD_GROUP",
    "Dep",
    "ExecutionGraph",
    "ExpandedGraph",
    "ExplicitWorld",
    "GraphMetadata",
    "LayoutWorld",
    "NodeType",
    "Op",
    "ResolvedOp",
    "RoleGraph",
    "World",
    "format_op",
    "load_graph",
    "parse_op",
    "save_graph",
    "world_from_metadata",
]


def __getattr__(name: str):
    """`export_chakra` on first use (it loads protobuf; not in __all__, so `import *` does not)."""
    if name == "export_chakra":
        from prism_megatron.graph.chakra import export_chakra

        return export_chakra
    raise AttributeError(f"module {__name__!r} has no attribute {name!r}")
