"""Communication costs measured where the job runs: per op kind and group size, a cost by message size.

Why a second kind of cluster description: `ClusterSpec` describes NCCL on a GPU fabric from link
rates and efficiencies. A job whose network is this machine's own (gloo between CPU processes on
loopback: a CPU emulation of a job, or the fidelity suite's ground truth) is described better by what
was measured on it, table by table, than by a fabric it does not have. `--prism-cluster` takes such a
file wherever it takes a cluster file; `network_cost` in `prism_megatron.passes.closed_loop`
tells the two apart by the file's ``kind``.

File (YAML or JSON)::

    schema_version: 1
    kind: measured
    name: loopback-2cpu
    description: how and under which load it was measured
    costs_us:                      # op kind / group size: [message bytes, microseconds] ...
      ALL_REDUCE/2: [[4, 244.2], [512, 382.9], [4096, 382.9]]
      SEND/2: [[4, 212.4], [262144, 310.8]]

The cost of an op is its kind's table for its group size: the nearest measured size of that kind
(the larger on a tie); a collective kind without a table costs what an all-reduce of the same group
and bytes does, RECV what SEND does, a group of one nothing. Between measured message sizes the
cost is linear, segment by segment (gloo switches algorithms with size, so one latency + bandwidth
line fits it badly); below the first size it is the first cost, beyond the last the last segment
continues. Costs are made non-decreasing in size when loaded (a median below a smaller size's is
noise). Byte conventions are the cost model's (`network.model`).
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
from collections.abc import Mapping, Sequence

import yaml

from prism_megatron.replay.schedule import OpKind

SCHEMA_VERSION = 1
KIND = "measured"
Points = tuple[tuple[int, float], ...]
"""(message bytes, cost ns), sorted by size, non-decreasing in cost."""


def monotone(points: Sequence[tuple[int, float]]) -> Points:
    """Each cost raised to the highest at any smaller size: moving more bytes never costs less."""
    out, highest = [], 0.0
    for size, cost in sorted(points):
        highest = max(highest, cost)
        out.append((int(size), highest))
    return tuple(out)


def interpolate(points: Points, size_bytes: int) -> float:
    """Piecewise linear through `points`; flat below the first, the last segment's slope beyond."""
    if size_bytes <= points[0][0] or len(points) == 1:
        return points[0][1]
    for (x0, y0), (x1, y1) in itertools.pairwise(points):
        if size_bytes <= x1 or (x1, y1) == points[-1]:
            return y0 + (y1 - y0) * (size_bytes - x0) / (x1 - x0)
    raise AssertionError("unreachable")


@dataclasses.dataclass(frozen=True)
class MeasuredCost:
    """A simulator cost function (`prism_megatron.sim.CostFn`) from measured tables."""

    tables: Mapping[tuple[OpKind, int], Points]
    """(op kind, group size) -> points; see the module docstring for how an op finds its table."""
    name: str = "measured"
    description: str = ""

    def __post_init__(self) -> None:
        if not self.tables:
            raise ValueError(f"measured costs {self.name!r} hold no table")

    def __call__(self, kind: OpKind, members: tuple[int, ...], size_bytes: int) -> float:
        n = len(members)
        if n <= 1:
            return 0.0
        kind = OpKind(kind)
        if kind == OpKind.RECV:
            kind = OpKind.SEND
        sizes = [size for k, size in self.tables if k == kind]
        if not sizes:
            kind = OpKind.ALL_REDUCE
            sizes = [size for k, size in self.tables if k == kind]
        if not sizes:
            raise ValueError(f"measured costs {self.name!r} have no table for {OpKind(kind).name}")
        nearest = min(sizes, key=lambda m: (abs(m - n), -m))
        return interpolate(self.tables[(kind, nearest)], size_bytes)

    def to_dict(self) -> dict:
        """The file's layout, as plain data (`load_measured` reads it back from JSON or YAML)."""
        return {
            "schema_version": SCHEMA_VERSION,
            "kind": KIND,
            "name": self.name,
            "description": self.description,
            "costs_us": {
                f"{kind.name}/{n}": [[size, round(ns / 1e3, 3)] for size, ns in points]
                for (kind, n), points in sorted(self.tables.items())
            },
        }


def _read(path: str) -> object:
    with open(path, encoding="utf-8") as f:
        raw = f.read()
    try:
        return json.loads(raw) if path.endswith(".json") else yaml.safe_load(raw)
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: not a readable cluster file ({exc})") from exc


def is_measured(source: str | os.PathLike) -> bool:
    """Whether `source` is a file of measured costs (else a preset name or a cluster file)."""
    path = os.fspath(source)
    if not os.path.isfile(path):
        return False
    data = _read(path)
    return isinstance(data, dict) and data.get("kind") == KIND


def _table(path: str, key: str, rows: object) -> tuple[tuple[OpKind, int], Points]:
    kind_name, _, size_text = str(key).partition("/")
    if kind_name not in OpKind.__members__ or not size_text.isdigit() or int(size_text) < 2:
        raise ValueError(
            f"{path}: costs_us key {key!r} must read KIND/GROUP_SIZE with KIND one of "
            f"{', '.join(OpKind.__members__)} and GROUP_SIZE >= 2, e.g. ALL_REDUCE/2"
        )
    points = []
    for row in rows if isinstance(rows, list) else [None]:
        if not (
            isinstance(row, list)
            and len(row) == 2
            and all(isinstance(v, int | float) for v in row)
            and row[0] >= 0
            and row[1] >= 0
        ):
            raise ValueError(f"{path}: costs_us.{key} must be a list of [bytes, microseconds] pairs >= 0")
        points.append((int(row[0]), float(row[1]) * 1e3))
    return (OpKind[kind_name], int(size_text)), monotone(points)


def load_measured(source: str | os.PathLike) -> MeasuredCost:
    """Read a file of measured costs.

    Raises:
        ValueError: naming the file and the key: not such a file, a newer schema, an unknown key,
            a malformed table.
    """
    path = os.fspath(source)
    data = _read(path)
    if not isinstance(data, dict) or data.get("kind") != KIND:
        raise ValueError(f"{path}: not a file of measured costs (kind: {KIND})")
    if data.get("schema_version") != SCHEMA_VERSION:
        raise ValueError(
            f"{path}: schema_version {data.get('schema_version')!r}; this version reads {SCHEMA_VERSION}"
        )
    unknown = sorted(set(data) - {"schema_version", "kind", "name", "description", "costs_us"})
    if unknown:
        raise ValueError(
            f"{path}: unknown keys {unknown}; valid: schema_version, kind, name, description, costs_us"
        )
    costs = data.get("costs_us")
    if not isinstance(costs, dict) or not costs:
        raise ValueError(f"{path}: costs_us must map KIND/GROUP_SIZE to [bytes, microseconds] pairs")
    tables = dict(_table(path, key, rows) for key, rows in costs.items())
    return MeasuredCost(
        tables,
        name=str(data.get("name", os.path.basename(path))),
        description=str(data.get("description", "")),
    )
