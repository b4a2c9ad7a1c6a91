"""Reading and writing execution graphs as a directory (`DIR/graph.json`), atomically.

A graph directory is what `--prism-graph DIR` and `prism-megatron simulate DIR` take. `graph.json`
holds the schema version, the metadata, every role's streams with each op in its printable form
(`prism_megatron.graph.printable`), and a SHA-256 of the content so that a damaged file is refused
instead of simulated. The graph is written atomically (`prism_megatron.files`), so a reader sees the
old graph or the new one, never half of one.
"""

from __future__ import annotations

import hashlib
import json
import os

from prism_megatron import files
from prism_megatron.graph.printable import format_op, parse_op
from prism_megatron.graph.schema import SCHEMA_VERSION, ExecutionGraph, GraphMetadata, RoleGraph
from prism_megatron.topology.grid import MAX_WORLD_SIZE

FORMAT = "prism-megatron execution graph"


def graph_to_json(graph: ExecutionGraph) -> dict:
    content = {
        "metadata": {
            "layout": dict(graph.metadata.layout),
            "source": graph.metadata.source,
            "extra": dict(graph.metadata.extra),
        },
        "roles": [
            {
                "role": role.role,
                "streams": [[name, [format_op(op) for op in ops]] for name, ops in role.streams.items()],
            }
            for role in graph.roles.values()
        ],
    }
    return {"format": FORMAT, "schema_version": SCHEMA_VERSION, **content, "sha256": _digest(content)}


def graph_from_json(data: object, *, source: str = "execution graph") -> ExecutionGraph:
    """Rebuild a graph, refusing other formats, other schema versions and damaged content.

    Raises:
        ValueError: naming `source` and what is wrong with it.
    """
    if not isinstance(data, dict) or data.get("format") != FORMAT:
        raise ValueError(f"{source}: not a prism-megatron execution graph")
    version = data.get("schema_version")
    if version != SCHEMA_VERSION:
        raise ValueError(
            f"{source}: schema_version {version!r} is not supported (this prism-megatron reads {SCHEMA_VERSION})"
        )
    try:
        content = {"metadata": data["metadata"], "roles": data["roles"]}
        if data["sha256"] != _digest(content):
            raise ValueError("content does not match its sha256")
        meta = content["metadata"]
        _check_layout(meta["layout"], source)
        metadata = GraphMetadata(
            layout=dict(meta["layout"]), source=str(meta["source"]), extra=dict(meta["extra"])
        )
        roles = {}
        for entry in content["roles"]:
            streams = {str(name): tuple(parse_op(text) for text in ops) for name, ops in entry["streams"]}
            roles[entry["role"]] = RoleGraph(role=str(entry["role"]), streams=streams)
        return ExecutionGraph(metadata=metadata, roles=roles)
    except _OutOfRange:
        raise
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{source}: damaged execution graph ({exc})") from exc


class _OutOfRange(ValueError):
    """A well-formed graph whose metadata holds a value out of range (not damage: said as is)."""


_SIZES = ("world_size", "tp", "pp", "cp", "ep", "etp", "vpp")
_FLAGS = ("untie_embeddings", "mtp")


def _check_layout(layout: object, source: str) -> None:
    """The metadata's layout before anything is built from it: known keys, sizes integers (not
    booleans) from 1 to `MAX_WORLD_SIZE`, flags booleans. ValueError naming the file and the key."""
    if not isinstance(layout, dict):
        raise _OutOfRange(f"{source}: metadata.layout must be a mapping, got {type(layout).__name__}")
    for key, value in layout.items():
        where = f"{source}: metadata.layout.{key}"
        if key in _SIZES:
            if value is None and key in ("etp", "vpp"):
                continue
            if not (isinstance(value, int) and not isinstance(value, bool) and 1 <= value <= MAX_WORLD_SIZE):
                raise _OutOfRange(f"{where} must be an integer from 1 to {MAX_WORLD_SIZE}, got {value!r}")
        elif key in _FLAGS:
            if not isinstance(value, bool):
                raise _OutOfRange(f"{where} must be true or false, got {value!r}")
        elif key == "order":
            if not isinstance(value, str):
                raise _OutOfRange(f"{where} must be a rank order such as tp-cp-ep-dp-pp, got {value!r}")
        else:
            raise _OutOfRange(f"{where}: unknown key; known: {', '.join((*_SIZES, *_FLAGS, 'order'))}")


def save_graph(graph: ExecutionGraph, directory: str) -> str:
    """Write `graph` to `directory/graph.json` atomically (creating the directory); return the path."""
    return files.write_json(graph_to_json(graph), os.path.join(directory, files.GRAPH_FILE))


def load_graph(directory: str) -> ExecutionGraph:
    """Read the graph in `directory` (or a path to its graph.json).

    Raises:
        ValueError: no graph there, or the file is damaged or of another schema version.
    """
    path = directory if directory.endswith(".json") else os.path.join(directory, files.GRAPH_FILE)
    if not os.path.isfile(path):
        raise ValueError(f"{path}: no execution graph here (expected a directory holding {files.GRAPH_FILE})")
    return graph_from_json(files.read_json(path, "execution graph"), source=path)


def _digest(content: dict) -> str:
    canonical = json.dumps(content, sort_keys=True, separators=(",", ":"), ensure_ascii=False)
    return hashlib.sha256(canonical.encode("utf-8")).hexdigest()
