"""Reading (and writing) the stdout of the nccl-tests programs: all_reduce_perf, all_gather_perf ...

A run's output has ``#`` header lines (the program, one ``#  Rank  r Group g Pid p on HOST device d``
line per rank, the column titles) and one row per size: ``size count type redop root`` then
``time algbw busbw #wrong`` for out-of-place and again for in-place. Older versions lack the
``root`` or ``Group`` fields or name ``#wrong`` ``error``; the column titles are read from the
header, so those parse too. Lines tagged by mpirun (``[1,0]<stdout>:``) are untagged first.

With ``-J FILE.json`` (nccl-tests 2.17+) a run also writes a JSON document (src/util.cu, JSON file
version 3): ``args`` (argv, the program first), ``config`` (``nthreads``, ``ngpus`` per process and
``devices``: one ``{rank, group, pid, hostname, device, ...}`` per process, its first rank) and
``results``: per size ``{size, count, type, redop, root, out_of_place: {time, alg_bw, bus_bw,
nwrong}, in_place: {...}}`` (``cpu_time`` instead of ``time`` with -C; ``out_of_place`` null when
only in-place ran). `read_nccl_tests` reads either form; the rows mean the same.

The writer produces the text layout from predicted times; tests use it to make synthetic logs.
"""

from __future__ import annotations

import dataclasses
import json
import os
import re

from prism_megatron.network.measured import MAX_COST_US, MAX_SIZE_BYTES
from prism_megatron.replay.schedule import OpKind
from prism_megatron.topology.grid import MAX_WORLD_SIZE

OPS: dict[str, OpKind] = {
    "all_reduce": OpKind.ALL_REDUCE,
    "all_gather": OpKind.ALL_GATHER,
    "reduce_scatter": OpKind.REDUCE_SCATTER,
    "alltoall": OpKind.ALL_TO_ALL,
    "broadcast": OpKind.BROADCAST,
    "reduce": OpKind.REDUCE,
    "sendrecv": OpKind.SEND,
}
"""nccl-tests program (without ``_perf``) -> the op kind whose cost it measures."""

BUS_BANDWIDTH_FACTORS = {
    # nccl-tests (src/*.cu GetBw): algbw = size / time, busbw = algbw * factor(number of ranks)
    OpKind.ALL_REDUCE: lambda n: 2.0 * (n - 1) / n,
    OpKind.ALL_GATHER: lambda n: (n - 1) / n,
    OpKind.REDUCE_SCATTER: lambda n: (n - 1) / n,
    OpKind.ALL_TO_ALL: lambda n: (n - 1) / n,
    OpKind.BROADCAST: lambda n: 1.0,
    OpKind.REDUCE: lambda n: 1.0,
    OpKind.SEND: lambda n: 1.0,
}

_TAG = re.compile(r"^\[[^\]]*\](?:<\w+>)?:?\s?")
_RANK = re.compile(r"^#\s*Rank\s+(\d+)\s+(?:Group\s+\d+\s+)?Pid\s+\d+\s+on\s+(\S+)\s+device\s+(\d+)")
_PROGRAM = re.compile(r"^#\s*Collective test starting:\s*(\S+)")


@dataclasses.dataclass(frozen=True)
class NcclTestsRow:
    """One size of a run: the size column (bytes) and the mean of its out-of-place and in-place times."""

    size_bytes: int
    time_us: float
    line_number: int


@dataclasses.dataclass(frozen=True)
class NcclTestsRun:
    """One nccl-tests program run.

    Attributes:
        source: the file it came from.
        op: the program without ``_perf`` (a key of OPS).
        placement: for each rank, (node index, local GPU index), nodes numbered in order of
            appearance of their host names.
        rows: the sizes measured, in file order.
    """

    source: str
    op: str
    placement: tuple[tuple[int, int], ...]
    rows: tuple[NcclTestsRow, ...]

    @property
    def kind(self) -> OpKind:
        return OPS[self.op]

    @property
    def num_ranks(self) -> int:
        return len(self.placement)

    @property
    def num_nodes(self) -> int:
        return len({node for node, _ in self.placement})


def op_from_name(name: str) -> str | None:
    """The op named in a program or file name (``all_reduce_perf_mpi`` -> ``all_reduce``), else None."""
    base = os.path.basename(name).lower().replace("-", "_")
    for op in sorted(OPS, key=len, reverse=True):  # reduce_scatter before reduce
        if op in base:
            return op
    return None


def read_nccl_tests(path: str, op: str | None = None) -> list[NcclTestsRun]:
    """Parse every run in a file, stdout or -J JSON; ``op`` names the program when the log does not."""
    with open(path, encoding="utf-8", errors="replace") as f:
        text = f.read()
    if text.lstrip().startswith("{"):
        try:
            doc = json.loads(text)
        except (json.JSONDecodeError, RecursionError) as exc:
            raise ValueError(f"{path}: looks like nccl-tests JSON (-J) but is not JSON ({exc})") from exc
        return [parse_nccl_tests_json(doc, source=path, op=op)]
    return parse_nccl_tests(text, source=path, op=op)


def parse_nccl_tests_json(doc: object, *, source: str, op: str | None = None) -> NcclTestsRun:
    """One run from the JSON document nccl-tests writes with -J (see the module docstring).

    Raises:
        ValueError: naming ``source`` and the key that is missing or wrong.
    """
    if not isinstance(doc, dict) or not isinstance(doc.get("results"), list):
        raise ValueError(f"{source}: not nccl-tests JSON output (no 'results' list)")
    args = doc.get("args") or []
    program = (
        op or (op_from_name(args[0]) if args and isinstance(args[0], str) else None) or op_from_name(source)
    )
    if program is None or program not in OPS:
        raise ValueError(
            f"{source}: cannot tell which nccl-tests program wrote this (args[0] is {args[:1]}); "
            f"prefix the path with the program, e.g. all_gather:{source}"
        )
    config = doc.get("config")
    if not isinstance(config, dict) or not config.get("devices"):
        raise ValueError(f"{source}: config.devices is missing; the ranks' hosts cannot be told")
    counts = {key: config.get(key, 1) for key in ("nthreads", "ngpus")}
    for key, value in counts.items():
        if not _is_int(value) or not 1 <= value <= MAX_WORLD_SIZE:
            raise ValueError(
                f"{source}: config.{key} must be an integer from 1 to {MAX_WORLD_SIZE}, got {value!r}"
            )
    per_process = counts["nthreads"] * counts["ngpus"]
    if per_process * len(config["devices"]) > MAX_WORLD_SIZE:
        raise ValueError(f"{source}: config describes more than {MAX_WORLD_SIZE} ranks")
    ranks: dict[int, tuple[str, int]] = {}
    try:
        for device in config["devices"]:
            for i in range(per_process):
                ranks[int(device["rank"]) + i] = (str(device["hostname"]), int(device["device"]) + i)
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{source}: config.devices entries need rank, hostname and device ({exc})") from exc
    if sorted(ranks) != list(range(len(ranks))):
        raise ValueError(f"{source}: config.devices does not cover ranks 0..n-1 (got {sorted(ranks)[:8]})")
    state = _RunState(program)
    state.ranks = ranks
    state.rows = [_json_row(result, index, source) for index, result in enumerate(doc["results"])]
    if not state.rows:
        raise ValueError(f"{source}: no nccl-tests result rows found")
    (run,) = state.finish(source)
    return run


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_time_us(value: object) -> bool:
    """A time as nccl-tests prints it: a number (not a boolean), > 0, finite and in range (NaN and
    infinity fail the comparison)."""
    return isinstance(value, int | float) and not isinstance(value, bool) and 0 < value <= MAX_COST_US


def _json_row(result: object, index: int, source: str) -> NcclTestsRow:
    where = f"{source}: results[{index}]"
    size = result.get("size") if isinstance(result, dict) else None
    if not _is_int(size) or not 0 <= size <= MAX_SIZE_BYTES:
        raise ValueError(f"{where}: needs an integer 'size' from 0 to {MAX_SIZE_BYTES} bytes, got {size!r}")
    times = []
    for placement in ("out_of_place", "in_place"):
        entry = result.get(placement)
        if isinstance(entry, dict):
            value = entry.get("time", entry.get("cpu_time"))
            if not _is_time_us(value):
                raise ValueError(
                    f"{where}.{placement}: needs a time > 0 in us, a number up to {MAX_COST_US:g} (not true/false), got {value!r}"
                )
            times.append(float(value))
    if not times:
        raise ValueError(f"{where}: neither out_of_place nor in_place has a time")
    # The row's "line" is its index in the results (JSON has no lines); errors name it.
    return NcclTestsRow(size_bytes=result["size"], time_us=sum(times) / len(times), line_number=index)


def parse_nccl_tests(text: str, *, source: str, op: str | None = None) -> list[NcclTestsRun]:
    """Parse nccl-tests stdout into runs (a file may hold several programs' output in a row).

    Raises:
        ValueError: naming ``source:line`` for a row that does not fit the column titles, a run
            without rank lines, or a program that cannot be told (pass ``op``).
    """
    if op is not None and op not in OPS:
        raise ValueError(f"{source}: op {op!r} is not an nccl-tests program; choose one of {', '.join(OPS)}")
    runs: list[NcclTestsRun] = []
    state = _RunState(op or op_from_name(source))
    for line_number, raw in enumerate(text.splitlines(), start=1):
        line = _TAG.sub("", raw).strip()
        if not line:
            continue
        program = _PROGRAM.match(line)
        if program or (line.startswith("# nThread") and state.rows):
            # A new run starts: the first one's header, or an older log's next program.
            runs += state.finish(source)
            named = op_from_name(program.group(1)) if program else None
            state = _RunState(op or named or state.op)
            if program:
                continue
        state.consume(line, line_number, source)
    runs += state.finish(source)
    if not runs:
        raise ValueError(f"{source}: no nccl-tests result rows found")
    return runs


class _RunState:
    """The run being read: its rank lines, its column titles and its rows so far."""

    def __init__(self, op: str | None):
        self.op = op
        self.ranks: dict[int, tuple[str, int]] = {}
        self.columns: list[str] | None = None
        self.rows: list[NcclTestsRow] = []

    def consume(self, line: str, line_number: int, source: str) -> None:
        rank = _RANK.match(line)
        if rank:
            self.ranks[int(rank.group(1))] = (rank.group(2), int(rank.group(3)))
        elif line.startswith("#"):
            titles = line.lstrip("#").split()
            if titles[:2] == ["size", "count"]:
                self.columns = titles
        elif self.columns is not None and line.split()[0].isdigit():
            self.rows.append(_parse_row(line, self.columns, line_number, source))

    def finish(self, source: str) -> list[NcclTestsRun]:
        if not self.rows:
            return []
        first = self.rows[0].line_number
        if self.op is None:
            raise ValueError(
                f"{source}:{first}: cannot tell which nccl-tests program wrote this; name it in the file "
                f"name or prefix the path with the program, e.g. all_gather:{source}"
            )
        if not self.ranks or sorted(self.ranks) != list(range(len(self.ranks))):
            raise ValueError(
                f"{source}:{first}: the '#  Rank r ... on HOST device d' lines of ranks 0..n-1 are missing"
            )
        hosts: dict[str, int] = {}
        placement = []
        for rank in range(len(self.ranks)):
            host, device = self.ranks[rank]
            placement.append((hosts.setdefault(host, len(hosts)), device))
        rows = tuple(row for row in self.rows if row.size_bytes > 0)
        return [NcclTestsRun(source=source, op=self.op, placement=tuple(placement), rows=rows)]


def _parse_row(line: str, columns: list[str], line_number: int, source: str) -> NcclTestsRow:
    fields = line.split()
    time_columns = [i for i, title in enumerate(columns) if title in ("time", "cputime")]
    if len(fields) < time_columns[0] + 1 or len(fields) > len(columns) + 2:
        raise ValueError(
            f"{source}:{line_number}: a result row needs the {len(columns)} columns "
            f"{' '.join(columns)}, got {len(fields)} fields"
        )
    try:
        size_bytes = int(fields[0])
        times = [float(fields[i]) for i in time_columns if i < len(fields) and fields[i] != "N/A"]
    except ValueError as exc:
        raise ValueError(f"{source}:{line_number}: unreadable result row ({exc})") from exc
    if not times or not all(_is_time_us(t) for t in times):
        raise ValueError(
            f"{source}:{line_number}: a result row needs a time > 0 in us, a number up to {MAX_COST_US:g} "
            f"(not nan or inf), got {' '.join(fields[i] for i in time_columns if i < len(fields))}"
        )
    if not 0 <= size_bytes <= MAX_SIZE_BYTES:
        raise ValueError(
            f"{source}:{line_number}: a result row's size must be 0 to {MAX_SIZE_BYTES} bytes, got {size_bytes}"
        )
    return NcclTestsRow(size_bytes=size_bytes, time_us=sum(times) / len(times), line_number=line_number)


def format_nccl_tests(
    op: str, hosts: list[str], rows: list[tuple[int, float]], *, dtype: str = "float"
) -> str:
    """nccl-tests stdout for ``rows`` of (size in bytes, time in us), rank r on host ``hosts[r]``.

    Devices are numbered per host in rank order; algbw and busbw follow nccl-tests' definitions.
    """
    num_ranks, word_bytes = len(hosts), {"float": 4, "half": 2, "bfloat16": 2, "double": 8}[dtype]
    per_rank_count = op in ("all_gather", "reduce_scatter", "alltoall")
    redop = "none" if op in ("all_gather", "alltoall", "broadcast", "sendrecv") else "sum"
    root = "0" if op in ("broadcast", "reduce") else "-1"
    lines = [
        "# nccl-tests version 2.13.10 (synthetic, written by prism-megatron)",
        f"# Collective test starting: {op}_perf",
        "# nThread 1 nGpus 1 minBytes 8 maxBytes 8589934592 step: 2(factor) warmup iters: 5 iters: 20",
        "#",
        "# Using devices",
    ]
    devices: dict[str, int] = {}
    for rank, host in enumerate(hosts):
        device = devices[host] = devices.get(host, -1) + 1
        lines.append(
            f"#  Rank {rank:2d} Group  0 Pid {1000 + rank:6d} on {host:>10s} device {device:2d} [0x{rank:02x}] GPU"
        )
    lines += ["#", _header("size", "count", "type", "redop", "root", "time", "algbw", "busbw", "#wrong")]
    lines.append(_header("(B)", "(elements)", "", "", "", "(us)", "(GB/s)", "(GB/s)", ""))
    factor = BUS_BANDWIDTH_FACTORS[OPS[op]](num_ranks)
    for size_bytes, time_us in rows:
        count = size_bytes // word_bytes // (num_ranks if per_rank_count else 1)
        algbw = size_bytes / (time_us * 1e3)
        body = f"{_number(time_us, 7)}  {_number(algbw, 6)}  {_number(algbw * factor, 6)}  {0:6d}"
        lines.append(f"{size_bytes:12d}  {count:12d}  {dtype:>8s}  {redop:>6s}  {root:>6s}  {body}  {body}")
    lines += ["# Out of bounds values : 0 OK", "# Avg bus bandwidth    : 0", "#", ""]
    return "\n".join(lines)


def _header(*titles: str) -> str:
    head, body = titles[:5], titles[5:]
    widths = (10, 12, 8, 6, 6)
    text = "# " + "  ".join(f"{t:>{w}s}" for t, w in zip(head, widths, strict=True))
    out = "  ".join(f"{t:>{w}s}" for t, w in zip(body, (7, 6, 6, 6), strict=True))
    return f"{text}  {out}  {out}"


def _number(value: float, width: int) -> str:
    """nccl-tests' number format: 2 decimals, fewer when the value would not fit the width."""
    for text in (f"{value:.2f}", f"{value:.1f}", f"{value:.0f}"):
        if len(text) <= width:
            return f"{text:>{width}s}"
    return f"{value:.1e}"
