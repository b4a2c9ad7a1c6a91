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
    batches_us:                    # optional: ops in one pipeline batch with two peers: [bytes, us] ...
      2: [[4, 301.0], [262144, 420.5]]
      4: [[4, 350.2], [262144, 610.0]]
    concurrency:                   # optional: op kind / group size: [groups at once, factor] ...
      ALL_REDUCE/2: [[1, 1.0], [2, 1.31], [4, 1.92], [8, 3.4], [16, 6.1]]
      SEND/2: [[1, 1.0], [2, 1.2], [4, 1.7], [8, 2.9]]

The cost of an op is its kind's table for its group size: the nearest measured size of that kind
(the larger on a tie); a collective kind without a table costs what an all-reduce of the same group
and bytes does, RECV what SEND does, a group of one nothing. Between measured message sizes the
cost is linear, segment by segment (gloo switches algorithms with size, so one latency + bandwidth
line fits it badly); below the first size it is the first cost, beyond the last the last segment
continues. Costs are made non-decreasing in size when loaded (a median below a smaller size's is
noise). Byte conventions are the cost model's (`network.model`).

`concurrency` makes a cost depend on what runs beside the op in the simulated schedule
(`prism_megatron.sim.concurrency`): with it, `costs_us` are the costs of one group alone, and an op
that becomes ready while ranks of G groups of its size communicate costs its cost alone times its
table's factor at G (linear between measured G, flat beyond the ends, exactly 1 when it runs
alone). A kind finds its table as in `costs_us`; a kind with none has no concurrency term.

`batches_us` costs a pipeline batch whose p2p ops go to two peers (three ranks): megatron-core's
interleaved schedule posts send-next with receive-previous (2 ops) or both directions at once
(4 ops) in one `batch_isend_irecv`, which a one-peer exchange (`SEND/2`) does not measure. Every
op of such a batch costs its table's cost at the batch's largest message (the table with the
nearest op count, the larger on a tie); without the key a batch's ops cost what each costs alone.
"""

from __future__ import annotations

import dataclasses
import itertools
import json
import os
import reprlib
from collections.abc import Mapping, Sequence

import yaml

from prism_megatron.replay.schedule import OpKind
from prism_megatron.topology.grid import MAX_WORLD_SIZE

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
    batches: Mapping[int, Points] = dataclasses.field(default_factory=dict)
    """Ops in a pipeline batch with two peers -> points (see the module docstring); may be empty."""
    concurrency: Mapping[tuple[OpKind, int], tuple[tuple[float, float], ...]] = dataclasses.field(
        default_factory=dict
    )
    """(op kind, group size) -> (groups at once, factor on the cost alone), sorted; may be empty."""

    def __post_init__(self) -> None:
        if not self.tables:
            raise ValueError(f"measured costs {self.name!r} hold no table")

    factor_by_group_size = True
    """The concurrency factor depends on the op's kind, group size and groups alone (`sim.concurrency`)."""

    @property
    def concurrency_factor(self):
        """The concurrency term (`sim.concurrency`), or None when the file measured none."""
        return self._factor if self.concurrency else None

    def _factor(self, kind: OpKind, members: tuple[int, ...], size_bytes: int, groups: float) -> float:
        """The factor of `kind`'s table at the nearest group size (the size of the message aside:
        a factor is measured as the median over sizes)."""
        del size_bytes
        group_size = len(members)
        if groups <= 1.0:
            return 1.0
        kind = OpKind.SEND if OpKind(kind) == OpKind.RECV else OpKind(kind)
        sizes = [n for k, n in self.concurrency if k == kind]
        if not sizes:
            kind, sizes = OpKind.ALL_REDUCE, [n for k, n in self.concurrency if k == OpKind.ALL_REDUCE]
        if not sizes:
            return 1.0
        nearest = min(sizes, key=lambda m: (abs(m - group_size), -m))
        points = self.concurrency[(kind, nearest)]
        if groups >= points[-1][0]:
            return points[-1][1]
        return interpolate(points, groups)

    def batch_cost(self, num_ops: int, size_bytes: int) -> float | None:
        """Cost (ns) of each op of a pipeline batch of `num_ops` ops with two peers; None without
        a batch table (each op then costs what it costs alone)."""
        if not self.batches:
            return None
        nearest = min(self.batches, key=lambda m: (abs(m - num_ops), -m))
        return interpolate(self.batches[nearest], size_bytes)

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
            **(
                {
                    "batches_us": {
                        str(num_ops): [[size, round(ns / 1e3, 3)] for size, ns in points]
                        for num_ops, points in sorted(self.batches.items())
                    }
                }
                if self.batches
                else {}
            ),
            **(
                {
                    "concurrency": {
                        f"{kind.name}/{n}": [[groups, round(factor, 4)] for groups, factor in points]
                        for (kind, n), points in sorted(self.concurrency.items())
                    }
                }
                if self.concurrency
                else {}
            ),
        }


MAX_SIZE_BYTES = 1 << 50
"""A cost table's largest message size (1 PiB), so a size always converts to a float exactly enough."""
MAX_COST_US = 1e9
"""A cost table's largest time (1000 s for one collective): more is a typo or a unit mistake."""


def _read(path: str) -> object:
    try:
        with open(path, encoding="utf-8") as f:
            raw = f.read()
        return json.loads(raw) if path.endswith(".json") else yaml.safe_load(raw)
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{path}: not a readable cluster file (not UTF-8 text: {exc.reason} at byte {exc.start})"
        ) from exc
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"{path}: not a readable cluster file ({exc})") from exc
    except RecursionError as exc:
        raise ValueError(f"{path}: not a readable cluster file (nested too deeply)") from exc


MAX_CONCURRENCY_FACTOR = 1000.0
"""The largest slow-down a concurrency table may give an op (a bound, so an infinity is refused)."""


def _is_pair(row: object) -> bool:
    """[bytes, microseconds]: numbers (a boolean is not one), finite and in range. Compared before
    any conversion, so a huge integer or an infinity is refused rather than overflowing."""
    return (
        isinstance(row, list)
        and len(row) == 2
        and all(isinstance(v, int | float) and not isinstance(v, bool) for v in row)
        and 0 <= row[0] <= MAX_SIZE_BYTES
        and 0 <= row[1] <= MAX_COST_US
    )


def is_measured(source: str | os.PathLike) -> bool:
    """Whether `source` is a file of measured costs (else a preset name or a cluster file)."""
    path = os.fspath(source)
    if not os.path.isfile(path):
        return False
    data = _read(path)
    return isinstance(data, dict) and data.get("kind") == KIND


def _table(path: str, key: str, rows: object) -> tuple[tuple[OpKind, int], Points]:
    kind_name, _, size_text = str(key).partition("/")
    if (
        kind_name not in OpKind.__members__
        or not (size_text.isascii() and size_text.isdigit())
        or not 2 <= int(size_text) <= MAX_WORLD_SIZE
    ):
        raise ValueError(
            f"{path}: costs_us key {key!r} must read KIND/GROUP_SIZE with KIND one of "
            f"{', '.join(OpKind.__members__)} and GROUP_SIZE from 2 to {MAX_WORLD_SIZE}, e.g. ALL_REDUCE/2"
        )
    return (OpKind[kind_name], int(size_text)), _points(path, f"costs_us.{key}", rows)


def _points(path: str, where: str, rows: object) -> Points:
    points = []
    for row in rows if isinstance(rows, list) else [None]:
        if not _is_pair(row):
            raise ValueError(
                f"{path}: {where} must be a list of [bytes, microseconds] pairs of numbers (not "
                f"true/false), bytes 0..{MAX_SIZE_BYTES}, microseconds 0..{MAX_COST_US:g}; got {reprlib.repr(row)}"
            )
        points.append((int(row[0]), float(row[1]) * 1e3))
    return monotone(points)


def _concurrency(path: str, tables: object) -> dict[tuple[OpKind, int], tuple[tuple[float, float], ...]]:
    if not isinstance(tables, dict):
        raise ValueError(f"{path}: concurrency must map KIND/GROUP_SIZE to [groups, factor] pairs")
    out = {}
    for key, rows in tables.items():
        table_key, _ = _table(path, key, [[0, 0]])
        if not (
            isinstance(rows, list)
            and rows
            and all(
                isinstance(row, list)
                and len(row) == 2
                and all(isinstance(v, int | float) and not isinstance(v, bool) for v in row)
                and 1 <= row[0] <= MAX_WORLD_SIZE
                and 0 < row[1] <= MAX_CONCURRENCY_FACTOR
                for row in rows
            )
        ):
            raise ValueError(
                f"{path}: concurrency.{key} must be a list of [groups >= 1, factor > 0] pairs, e.g. [[1, 1.0], [4, 1.9]]"
            )
        out[table_key] = tuple(sorted((float(g), float(f)) for g, f in rows))
    return out


def _batches(path: str, batches: object) -> dict[int, Points]:
    if not isinstance(batches, dict):
        raise ValueError(
            f"{path}: batches_us must map a batch's op count (2, 4) to [bytes, microseconds] pairs"
        )
    out = {}
    for key, rows in batches.items():
        if not str(key).isdigit() or int(key) < 2:
            raise ValueError(f"{path}: batches_us key {key!r} must be a batch's op count >= 2, e.g. 2 or 4")
        out[int(key)] = _points(path, f"batches_us.{key}", rows)
    return out


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
    valid = ("schema_version", "kind", "name", "description", "costs_us", "batches_us", "concurrency")
    unknown = sorted(set(data) - set(valid))
    if unknown:
        raise ValueError(f"{path}: unknown keys {unknown}; valid: {', '.join(valid)}")
    costs = data.get("costs_us")
    if not isinstance(costs, dict) or not costs:
        raise ValueError(f"{path}: costs_us must map KIND/GROUP_SIZE to [bytes, microseconds] pairs")
    tables = dict(_table(path, key, rows) for key, rows in costs.items())
    return MeasuredCost(
        tables,
        name=str(data.get("name", os.path.basename(path))),
        description=str(data.get("description", "")),
        batches=_batches(path, data["batches_us"]) if "batches_us" in data else {},
        concurrency=_concurrency(path, data["concurrency"]) if "concurrency" in data else {},
    )
