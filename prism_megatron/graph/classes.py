"""Role classes in the graph: one captured program gives every role of its class its ops and spans.

`topology.equivalence` decides before capture which roles run the same program (a `RoleClass`).
Here that decision meets the capture:

* a class whose members issue their ops in one order (one pipeline stage's roles) gives every
  member the representative's streams;
* a class of middle pipeline stages under 1F1B (`RoleClass.warmup`) holds the same forward and
  backward steps in a different order per stage. `ClassProgram` cuts the representative's compute
  stream at its pipeline calls into prologue, F_i, B_i, idle gaps and epilogue, checks the calls
  are the 1F1B order of its own warm-up (`graph.schedule`), and reassembles the steps in each
  member's order: the same ops, renumbered as that member's capture would number them, every side
  stream rebuilt in posting order, every wait pointing at the same posted op.

Every compute span of a member is the representative's span of the same work (its `source`: the
prologue, F_i, B_i, the epilogue), never a span found by position in the member's op order. An idle
gap of the schedule's loop (`IDLE`, two pipeline calls with nothing between) belongs to the step it
follows: the member takes the reference's gap after the same step, adds it to that step's last span
where the member's next call follows at once, and runs a gap the reference has no time for in 0 ns.
So the members of a class run identical compute in total, whatever their warm-up, and a measurement
of one member folds into all (`spread`, the closed loop).

Confirmation (`class_graphs`): every captured member must issue exactly the ops derived for it from
the reference capture; the first difference is an error in the ops' printable form. Spans are
pooled over the captured members: the median of each canonical span.
"""

from __future__ import annotations

import dataclasses
import os
import statistics
from collections.abc import Mapping, Sequence

from prism_megatron import files
from prism_megatron.graph.capture import (
    COMPUTE_NAME,
    PIPELINE_GROUP,
    compute_durations,
    first_difference,
    structure,
    with_span,
)
from prism_megatron.graph.printable import format_op
from prism_megatron.graph.schedule import IDLE, StageOrder, Step, one_f_one_b
from prism_megatron.graph.schema import (
    COMPUTE_STREAM,
    P2P,
    Dep,
    ExecutionGraph,
    NodeType,
    Op,
    RoleGraph,
    derived,
)
from prism_megatron.topology.equivalence import RoleClass

CLASSES_KEY = "role_classes"
"""Key of the role classes (`RoleClass.to_json()` each) in a graph's `metadata.extra`."""


@dataclasses.dataclass(frozen=True)
class _Item:
    """One op of a role in program order, its cross-stream deps as indices of other items."""

    stream: str
    op: Op
    deps: tuple[int, ...]


def _program(streams: Mapping[str, Sequence[Op]]) -> list[_Item]:
    """The streams as one list in program order: each side-stream op right after the compute op it
    was posted behind (its dep on the compute stream), which is the order capture issued them in.

    Raises:
        ValueError: a side-stream op not posted from the compute stream, or posted out of order.
    """
    posted: dict[int, list[tuple[str, int]]] = {}
    for name, ops in streams.items():
        if name == COMPUTE_STREAM:
            continue
        last = -1
        for index, op in enumerate(ops):
            anchors = [dep.index for dep in op.deps if dep.stream == COMPUTE_STREAM]
            if len(op.deps) != 1 or len(anchors) != 1 or anchors[0] < last:
                raise ValueError(
                    f"{name}[{index}] {format_op(op)!r} is not posted in order from the compute stream"
                )
            last = anchors[0]
            posted.setdefault(last, []).append((name, index))
    where: dict[tuple[str, int], int] = {}
    order: list[tuple[str, Op]] = []
    for index, op in enumerate(streams[COMPUTE_STREAM]):
        where[(COMPUTE_STREAM, index)] = len(order)
        order.append((COMPUTE_STREAM, op))
        for name, side_index in posted.get(index, ()):
            where[(name, side_index)] = len(order)
            order.append((name, streams[name][side_index]))
    return [_Item(name, op, tuple(where[(d.stream, d.index)] for d in op.deps)) for name, op in order]


def _reassemble(items: Sequence[_Item], pieces: Sequence[int | Op]) -> dict[str, tuple[Op, ...]]:
    """Streams from `pieces` in program order: an int is that item of `items`, an Op a new one on
    the compute stream (no deps). Side streams appear in the order of their first op, collectives
    and p2p ops are numbered afresh in program order: as a capture of that order makes them.

    Raises:
        ValueError: an op would depend on one that comes after it.
    """
    streams: dict[str, list[Op]] = {COMPUTE_STREAM: []}
    placed: dict[int, Dep] = {}
    collective_seq: dict[str, int] = {}
    p2p_seq: dict[tuple[NodeType, str, int], int] = {}
    for piece in pieces:
        item = piece if isinstance(piece, int) else None
        stream, op = (items[piece].stream, items[piece].op) if item is not None else (COMPUTE_STREAM, piece)
        deps = ()
        if item is not None:
            if any(d not in placed for d in items[item].deps):
                raise ValueError(f"{format_op(op)!r} would come before the op it waits for")
            deps = tuple(placed[d] for d in items[item].deps)
        seq = None
        if op.type == NodeType.COLLECTIVE:
            seq = collective_seq.get(op.group, 0)
            collective_seq[op.group] = seq + 1
        elif op.type in P2P:
            key = (op.type, op.group, op.offset)
            seq = p2p_seq.get(key, 0)
            p2p_seq[key] = seq + 1
        op = derived(op, seq=seq, deps=deps)
        if item is not None:
            placed[item] = Dep(stream, len(streams.setdefault(stream, [])))
        streams[stream].append(op)
    return {name: tuple(ops) for name, ops in streams.items()}


def _calls(items: Sequence[_Item]) -> list[range]:
    """Item ranges of the pipeline calls: runs of blocking p2p ops in the "pp" group on the compute
    stream, a run ending at its op that is not coalesced with the next."""
    calls, start = [], None
    for index, item in enumerate(items):
        is_p2p = item.stream == COMPUTE_STREAM and item.op.type in P2P and item.op.group == PIPELINE_GROUP
        if is_p2p and start is None:
            start = index
        if start is not None and (not is_p2p or not item.op.coalesced):
            calls.append(range(start, index + 1 if is_p2p else index))
            start = None
    return calls


def _key(op: Op) -> tuple[NodeType, int, int]:
    return op.type, op.offset, op.seq


@dataclasses.dataclass
class _Steps:
    """The reference's program cut at its pipeline calls (see the module docstring)."""

    prologue: range
    epilogue: range
    steps: dict[Step, range]
    p2p: dict[tuple[NodeType, int, int], Op]
    idle_after: dict[Step, int]
    """The item of each idle gap, by the step it follows (the schedule loop's time after that work)."""


def _head(key: tuple[NodeType, int, int]) -> str:
    kind, offset, seq = key
    return f"{'S→' if kind == NodeType.SEND else 'R←'}{PIPELINE_GROUP}{offset:+d}#{seq}"


def _cut(items: Sequence[_Item], order: StageOrder, role: str, what: str) -> _Steps:
    """Cut the reference's items by the 1F1B order of its own warm-up; ValueError if it is not that."""
    calls = _calls(items)
    captured = [tuple(_key(items[i].op) for i in call) for call in calls]
    for number, (got, expected) in enumerate(zip(captured, order.calls, strict=False)):
        if got != expected:
            shown = " & ".join(format_op(items[i].op) for i in calls[number])
            wanted = " & ".join(_head(key) for key in expected)
            raise ValueError(
                f"role {role}: pipeline call {number} is {shown!r}, not {wanted!r} as {what} has it"
            )
    if len(captured) != len(order.calls):
        raise ValueError(f"role {role}: {len(captured)} pipeline calls, {what} has {len(order.calls)}")
    steps: dict[Step, range] = {}
    idle_after: dict[Step, int] = {}
    last_step: Step | None = None
    for step, before, after in zip(order.steps, calls, calls[1:], strict=False):
        between = range(before.stop, after.start)
        if step.kind != IDLE:
            steps[step], last_step = between, step
            continue
        gap = [items[i].op for i in between]
        if len(gap) != 1 or gap[0].type != NodeType.COMPUTE or last_step is None:
            raise ValueError(
                f"role {role}: an idle gap of the 1F1B loop holds {[format_op(op) for op in gap]}"
            )
        idle_after[last_step] = between.start
    p2p = {_key(items[i].op): dataclasses.replace(items[i].op, coalesced=False) for c in calls for i in c}
    return _Steps(range(0, calls[0].start), range(calls[-1].stop, len(items)), steps, p2p, idle_after)


@dataclasses.dataclass(frozen=True)
class _MemberLayout:
    """One member's streams (durations not yet set) and where each of its compute spans comes from."""

    streams: dict[str, tuple[Op, ...]]
    source: tuple[int, ...]


class ClassProgram:
    """A class's program: the reference member's ops, and each member's order of them.

    Raises (at construction):
        ValueError: the reference's pipeline calls are not the 1F1B order of its warm-up, or an
            idle gap of that order holds ops (the class cannot be derived from it).
    """

    def __init__(self, role_class: RoleClass, reference: str, streams: Mapping[str, Sequence[Op]]) -> None:
        if reference not in role_class.members:
            raise ValueError(
                f"role {reference!r} is not a member of the class of {role_class.representative!r}"
            )
        self.role_class = role_class
        self.reference = reference
        self._items = _program(streams)
        self._compute = {}
        for index, item in enumerate(self._items):
            if item.op.type == NodeType.COMPUTE:
                if item.stream != COMPUTE_STREAM:
                    raise ValueError(f"role {reference}: compute op on side stream {item.stream!r}")
                self._compute[index] = len(self._compute)
        self.num_canonical = len(self._compute)
        self._reference_ns = [self._items[i].op.duration_ns for i in self._compute]
        self._steps = None
        if role_class.warmup is not None:
            num, warmup = role_class.num_microbatches, role_class.warmup[reference]
            what = f"1F1B with {warmup} warm-up of {num} microbatches"
            self._steps = _cut(self._items, one_f_one_b(num, warmup), reference, what)
        self._layouts: dict[int | None, _MemberLayout] = {}

    def order_of(self, member: str) -> int | None:
        """What sets the member's op order: its warm-up count (None: the reference's order)."""
        if member not in self.role_class.members:
            raise ValueError(
                f"role {member!r} is not a member of the class of {self.role_class.representative!r}"
            )
        return None if self._steps is None else self.role_class.warmup[member]

    def _layout(self, member: str) -> _MemberLayout:
        warmup = self.order_of(member)
        if warmup not in self._layouts:
            pieces, extra = self._pieces(warmup)
            source = []
            for number, piece in enumerate(pieces):
                if isinstance(piece, int) and piece in self._compute:
                    source.append((self._compute[piece], *extra.get(number, ())))
                elif not isinstance(piece, int) and piece.type == NodeType.COMPUTE:
                    source.append(())
            self._layouts[warmup] = _MemberLayout(_reassemble(self._items, pieces), tuple(source))
        return self._layouts[warmup]

    def _pieces(self, warmup: int | None) -> tuple[list[int | Op], dict[int, tuple[int, ...]]]:
        """The member's pieces in program order, and the canonical idle gaps a piece takes on top of
        its own span: the schedule loop's time after a step, where the reference has a gap after
        that step and the member has none (the member's next call follows at once)."""
        if warmup is None:
            return list(range(len(self._items))), {}
        steps = self._steps
        order = one_f_one_b(self.role_class.num_microbatches, warmup)
        pieces: list[int | Op] = list(steps.prologue)
        extra: dict[int, tuple[int, ...]] = {}
        for number, call in enumerate(order.calls):
            pieces += [
                dataclasses.replace(steps.p2p[key], coalesced=i < len(call) - 1) for i, key in enumerate(call)
            ]
            if number >= len(order.steps):
                continue
            step = order.steps[number]
            if step.kind == IDLE:
                after = order.steps[number - 1]  # an idle gap always follows a step
                gap = steps.idle_after.get(after)
                pieces.append(gap if gap is not None else Op(type=NodeType.COMPUTE, name=COMPUTE_NAME))
                continue
            pieces += list(steps.steps[step])
            followed_by_idle = number + 1 < len(order.steps) and order.steps[number + 1].kind == IDLE
            gap = steps.idle_after.get(step)
            last = next((i for i in reversed(steps.steps[step]) if i in self._compute), None)
            if gap is not None and not followed_by_idle and last is not None:
                extra[len(pieces) - len(steps.steps[step]) + list(steps.steps[step]).index(last)] = (
                    self._compute[gap],
                )
        return pieces + list(steps.epilogue), extra

    def structure(self, member: str) -> dict[str, tuple[Op, ...]]:
        """The member's ops, every duration 0 (what its capture must match)."""
        return structure(self._layout(member).streams)

    def source(self, member: str) -> tuple[tuple[int, ...], ...]:
        """Per compute span of the member (flat order): the canonical spans (the reference's spans
        of the same work) it sums; () for an idle gap of the loop the reference has no time for."""
        return self._layout(member).source

    def pooled(self, measured: Mapping[str, Sequence[int]]) -> list[int]:
        """Canonical spans from members' measured compute durations: medians over them.

        A member's span that sums several canonical spans (a step and the idle gap the reference
        has after it) is split between them as the reference's own spans are; a gap the reference
        has no time for is left out.

        Raises:
            ValueError: a member's durations do not match its compute spans in number.
        """
        columns: list[list[float]] = [[] for _ in range(self.num_canonical)]
        for member, values in measured.items():
            source = self.source(member)
            if len(values) != len(source):
                raise ValueError(f"role {member}: {len(values)} durations for {len(source)} compute spans")
            for positions, value in zip(source, values, strict=True):
                weights = [self._reference_ns[p] for p in positions]
                total = sum(weights)
                for p, weight in zip(positions, weights, strict=True):
                    columns[p].append(value * weight / total if total else value / len(positions))
        return [
            round(statistics.median(column)) if column else self._reference_ns[p]
            for p, column in enumerate(columns)
        ]

    def durations(self, member: str, canonical: Sequence[int]) -> list[int]:
        return [sum(canonical[p] for p in positions) for positions in self.source(member)]

    def streams(self, member: str, canonical: Sequence[int]) -> dict[str, tuple[Op, ...]]:
        """The member's streams with the given canonical spans."""
        values = iter(self.durations(member, canonical))
        return {
            name: tuple(with_span(op, next(values)) if op.type == NodeType.COMPUTE else op for op in ops)
            for name, ops in self._layout(member).streams.items()
        }


def class_graphs(role_class: RoleClass, captured: Mapping[str, RoleGraph]) -> dict[str, RoleGraph]:
    """Every member's role graph from the captured members (at least one), confirmed and pooled.

    Raises:
        ValueError: no member captured, or a captured member's ops differ from the ops the class
            gives it (naming the first differing op).
    """
    reference = next((m for m in role_class.members if m in captured), None)
    if reference is None:
        raise ValueError(f"no role of the class of {role_class.representative!r} was captured")
    if len(role_class.members) == 1:
        return {reference: captured[reference]}
    program = ClassProgram(role_class, reference, captured[reference].streams)
    for role, graph in captured.items():
        difference = first_difference(program.structure(role), structure(graph.streams))
        if difference is not None:
            raise ValueError(
                f"roles {reference} and {role} were taken to run one program, but {role}'s capture "
                f"differs from the ops derived for it at {difference}; pass --prism-capture-all-roles "
                "to give every role its own capture"
            )
    canonical = program.pooled({role: compute_durations(g.streams) for role, g in captured.items()})
    return {m: RoleGraph(m, program.streams(m, canonical)) for m in role_class.members}


def graph_classes(graph: ExecutionGraph) -> tuple[RoleClass, ...]:
    """The role classes a graph was built with (singletons when it records none)."""
    stored = graph.metadata.extra.get(CLASSES_KEY)
    if not stored:
        return tuple(RoleClass(name, (name,)) for name in graph.roles)
    return tuple(RoleClass.from_json(data) for data in stored)


def class_programs(graph: ExecutionGraph) -> dict[str, ClassProgram]:
    """Role name -> its class's program, from the graph's own ops (members of one class share it)."""
    programs: dict[str, ClassProgram] = {}
    for role_class in graph_classes(graph):
        if len(role_class.members) > 1:
            rep = role_class.representative
            program = ClassProgram(role_class, rep, graph.roles[rep].streams)
            programs.update({member: program for member in role_class.members})
    return programs


def spread(
    programs: Mapping[str, ClassProgram], measured: Mapping[str, Sequence[int]]
) -> dict[str, list[int]]:
    """Measured compute durations of some roles, folded into every role of their classes.

    A measured role keeps its own; every other member of a class with a measured member gets the
    median of the measured members' spans, each at its own position (`ClassProgram.source`).

    Args:
        programs: `class_programs(graph)`, built once per graph.
    """
    out = {role: list(values) for role, values in measured.items()}
    done: set[int] = set()
    for role in measured:
        program = programs.get(role)
        if program is None or id(program) in done:
            continue
        done.add(id(program))
        canonical = program.pooled({r: v for r, v in measured.items() if programs.get(r) is program})
        by_order: dict[int | None, list[int]] = {}  # members in one order share one list (1024 roles)
        for member in program.role_class.members:
            if member not in measured:
                order = program.order_of(member)
                if order not in by_order:
                    by_order[order] = program.durations(member, canonical)
                out[member] = by_order[order]
    return out


def save_classes(classes: Sequence[RoleClass], directory: str) -> str:
    """Write the role classes into a capture folder (atomically), so the folder builds the same graph."""
    return files.write_json(
        {"role_classes": [c.to_json() for c in classes]}, files.role_classes_path(directory)
    )


def load_classes(directory: str) -> tuple[RoleClass, ...] | None:
    """The role classes saved in a capture folder; None when it has none (every role its own class).

    Raises:
        ValueError: the file is there but is not a list of role classes.
    """
    path = files.role_classes_path(directory)
    if not os.path.isfile(path):
        return None
    doc = files.read_json(path, "role classes")
    try:
        return tuple(RoleClass.from_json(data) for data in doc["role_classes"])
    except (KeyError, TypeError, ValueError) as exc:
        raise ValueError(f"{path}: damaged role classes ({exc})") from None
