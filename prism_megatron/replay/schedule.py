"""The replay schedule: what the replay engine needs to speak for virtual peers at run time.

This is the seam between the simulator (which predicts when every virtual rank reaches every op) and
the engine (which makes a real rank's op with virtual members complete at the right time). Both sides
import these types; nothing here knows Megatron, graphs or networks.

Time model (ARCHITECTURE.md, "Time in the emulation"): each real rank marks the start of every
training iteration. For an op with virtual members the schedule gives the latest arrival of those
virtual members, as an offset in ns from that start, and the op's communication cost in ns. The
engine completes the op at ``max(own arrival, start + arrival_offset_ns) + cost_ns``.

Ops are keyed per real rank by what both the simulator and the running program can name without
agreeing on ids: a collective by its group's member list (global virtual ranks, in group order) and
its index among that group's ops within one iteration; a p2p op by the peer's virtual rank, its
direction and its index among the ops to that peer in that direction within one iteration.
"""

from __future__ import annotations

import dataclasses
import enum
import math
from collections.abc import Mapping, Sequence

from prism_megatron import files

SCHEMA_VERSION = 1


class OpKind(enum.IntEnum):
    """Communication op kinds, shared with csrc/ (keep the numbers in step with csrc/replay/engine.h)."""

    ALL_REDUCE = 0
    BROADCAST = 1
    ALL_GATHER = 2
    REDUCE_SCATTER = 3
    ALL_TO_ALL = 4
    BARRIER = 5
    SEND = 6
    RECV = 7
    GATHER = 8
    SCATTER = 9
    REDUCE = 10


@dataclasses.dataclass(frozen=True, slots=True)
class CostLine:
    """One line of a piecewise-linear communication cost: ``latency_ns + ns_per_byte * bytes``.

    A cost model for one (group, op kind) is a tuple of lines and the cost of a message is the
    minimum over them: each line is one algorithm/protocol choice (ring, tree, ...), and taking the
    cheapest approximates the collective library's own choice by size. The engine evaluates this in
    C++ on the hot path.
    """

    latency_ns: float
    ns_per_byte: float

    def __post_init__(self) -> None:
        if not (math.isfinite(self.latency_ns) and self.latency_ns >= 0):
            raise ValueError(f"CostLine.latency_ns must be finite and >= 0, got {self.latency_ns}")
        if not (math.isfinite(self.ns_per_byte) and self.ns_per_byte >= 0):
            raise ValueError(f"CostLine.ns_per_byte must be finite and >= 0, got {self.ns_per_byte}")


def cost_ns(lines: Sequence[CostLine], size_bytes: int) -> float:
    """Python reference of the engine's cost evaluation: the cheapest line at this size."""
    if not lines:
        raise ValueError("a cost model needs at least one CostLine")
    return min(line.latency_ns + line.ns_per_byte * size_bytes for line in lines)


@dataclasses.dataclass(frozen=True, slots=True)
class ScheduledOp:
    """One op of one iteration as the virtual peers see it.

    Attributes:
        kind: the op kind; the engine checks it against the op the program issues.
        size_bytes: the message size the simulator assumed (checked against the issued op's size;
            a mismatch means the program diverged from the captured graph).
        arrival_offset_ns: latest arrival of the op's virtual members, from the iteration start.
        cost_ns: communication cost once everyone has arrived; negative means "ask the cost model".
    """

    kind: OpKind
    size_bytes: int
    arrival_offset_ns: int
    cost_ns: int = -1


@dataclasses.dataclass(frozen=True)
class ReplaySchedule:
    """The schedule of one real rank for one iteration (it repeats every iteration).

    Attributes:
        virtual_rank: the real rank this schedule is for.
        collectives: group members (global virtual ranks, group order) -> that group's ops in
            issue order within one iteration.
        p2p: (peer virtual rank, "send" or "recv") -> those ops in issue order within one iteration.
        iteration_time_ns: the simulated iteration time (for reports and sanity checks).
    """

    virtual_rank: int
    collectives: Mapping[tuple[int, ...], tuple[ScheduledOp, ...]]
    p2p: Mapping[tuple[int, str], tuple[ScheduledOp, ...]]
    iteration_time_ns: int = 0

    def to_json(self) -> dict:
        def ops(seq):
            return [[int(o.kind), o.size_bytes, o.arrival_offset_ns, o.cost_ns] for o in seq]

        return {
            "schema_version": SCHEMA_VERSION,
            "virtual_rank": self.virtual_rank,
            "iteration_time_ns": self.iteration_time_ns,
            "collectives": [{"members": list(k), "ops": ops(v)} for k, v in self.collectives.items()],
            "p2p": [{"peer": k[0], "direction": k[1], "ops": ops(v)} for k, v in self.p2p.items()],
        }

    @classmethod
    def from_json(cls, data: dict, *, source: str = "replay schedule") -> ReplaySchedule:
        version = data.get("schema_version")
        if version != SCHEMA_VERSION:
            raise ValueError(
                f"{source}: schema_version {version!r} is not supported (this prism-megatron reads {SCHEMA_VERSION})"
            )

        def ops(raw):
            return tuple(ScheduledOp(OpKind(k), int(s), int(a), int(c)) for k, s, a, c in raw)

        try:
            return cls(
                virtual_rank=int(data["virtual_rank"]),
                iteration_time_ns=int(data.get("iteration_time_ns", 0)),
                collectives={tuple(int(r) for r in e["members"]): ops(e["ops"]) for e in data["collectives"]},
                p2p={(int(e["peer"]), str(e["direction"])): ops(e["ops"]) for e in data["p2p"]},
            )
        except (KeyError, TypeError, ValueError) as exc:
            raise ValueError(f"{source}: damaged replay schedule ({exc})") from exc

    def save(self, path: str) -> None:
        """Write atomically: a reader never sees half a file."""
        files.write_json(self.to_json(), path)

    @classmethod
    def load(cls, path: str) -> ReplaySchedule:
        return cls.from_json(files.read_json(path, "replay schedule"), source=path)
