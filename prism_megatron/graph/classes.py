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
  stream rebuilt in posting order, every wait pointing at the same posted op;
* a class of middle stages under the interleaved schedule (`RoleClass.chunks`) runs the same steps
  F_k and B_k per virtual microbatch k in an order set by its warm-up, its pipeline transfers
  waited in the call in warm-up and cool-down and posted and waited later in the steady phase
  (`graph.schedule.interleaved`). The reference's pipeline ops and waits must be that order under
  one of its variants (waits recorded or not; where a forward send is waited); the variant it
  follows is the one its members follow. A member's program is the reference's prologue, its steps
  by identity in the member's order, new pipeline ops and waits where the member's order has them,
  the reference's gap of the schedule's loop between the same two kinds of pipeline op (one compute
  span, as the capture puts one before every op), and the epilogue, whose waits on a pipeline send
  point at the member's post (or go, with their spans joined, where the member waited in the call).
  Two launches depend on the rank and move to the member's step: a chunk's overlapped gradient
  reduce, launched k + rank steps after the chunk's last backward (megatron-core's `grad_sync_func`),
  and an aligned parameter all-gather, launched at the start of forward step k - rank
  (`param_sync_func`).
  A step's span holds the loop's host time next to it in the reference (a few microseconds on a
  modelled GPU: the buffer a posted receive allocates), so a member's total may differ from its own
  capture's by that much.

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
from prism_megatron.graph.schedule import (
    BACKWARD,
    FORWARD,
    IDLE,
    SEND_WAIT_AT_POST,
    SEND_WAIT_NEXT_POST,
    Call,
    StageOrder,
    Step,
    Wait,
    interleaved,
    one_f_one_b,
)
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
from prism_megatron.replay.schedule import OpKind
from prism_megatron.topology.equivalence import RoleClass, grad_sync_points, param_sync_points, schedule_table

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


@dataclasses.dataclass(frozen=True)
class _Piece:
    """One op of a member's program: its stream, the op, and its cross-stream deps as indices of
    earlier pieces."""

    stream: str
    op: Op
    deps: tuple[int, ...] = ()


def _assemble(pieces: Sequence[_Piece]) -> dict[str, tuple[Op, ...]]:
    """Streams from pieces in program order. Side streams appear in the order of their first op,
    collectives and p2p ops are numbered afresh in program order: as a capture of that order makes them.

    Raises:
        ValueError: an op would depend on one that comes after it.
    """
    streams: dict[str, list[Op]] = {COMPUTE_STREAM: []}
    placed: list[Dep] = []
    collective_seq: dict[str, int] = {}
    p2p_seq: dict[tuple[NodeType, str, int], int] = {}
    for number, piece in enumerate(pieces):
        op = piece.op
        if any(d >= number for d in piece.deps):
            raise ValueError(f"{format_op(op)!r} would come before the op it waits for")
        seq = None
        if op.type == NodeType.COLLECTIVE:
            seq = collective_seq.get(op.group, 0)
            collective_seq[op.group] = seq + 1
        elif op.type in P2P:
            key = (op.type, op.group, op.offset)
            seq = p2p_seq.get(key, 0)
            p2p_seq[key] = seq + 1
        ops = streams.setdefault(piece.stream, [])
        placed.append(Dep(piece.stream, len(ops)))
        ops.append(derived(op, seq=seq, deps=tuple(placed[d] for d in piece.deps)))
    return {name: tuple(ops) for name, ops in streams.items()}


def _placed_deps(item: _Item, where: Mapping[int, int]) -> tuple[int, ...]:
    """An item's deps as the pieces its deps were placed as (`where`: item -> piece).

    Raises:
        ValueError: a dep not placed yet.
    """
    if any(d not in where for d in item.deps):
        raise ValueError(f"{format_op(item.op)!r} would come before the op it waits for")
    return tuple(where[d] for d in item.deps)


def _reassemble(items: Sequence[_Item], pieces: Sequence[int | Op]) -> dict[str, tuple[Op, ...]]:
    """Streams from `pieces` in program order: an int is that item of `items`, an Op a new one on
    the compute stream (no deps); see `_assemble`.

    Raises:
        ValueError: an op would depend on one that comes after it.
    """
    out: list[_Piece] = []
    where: dict[int, int] = {}
    for piece in pieces:
        if not isinstance(piece, int):
            out.append(_Piece(COMPUTE_STREAM, piece))
            continue
        item = items[piece]
        deps = _placed_deps(item, where)
        where[piece] = len(out)
        out.append(_Piece(item.stream, item.op, deps))
    return _assemble(out)


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


# --- the interleaved schedule ------------------------------------------------------------------

_VARIANTS = ((True, SEND_WAIT_NEXT_POST), (True, SEND_WAIT_AT_POST), (False, SEND_WAIT_NEXT_POST))
"""(waits recorded, send-wait variant) of `interleaved`, in the order a reference is tried against."""


@dataclasses.dataclass(frozen=True)
class _Atom:
    """One pipeline op or wait of a program: "call" (waited in its call), "post" or "wait"."""

    kind: str
    key: tuple[NodeType, int, int]
    joined: bool = False
    """A call's op after its first: posted with the one before, no compute between them."""
    step: Step | None = None
    """The step that runs just before it (None: the glue of the schedule's loop, or nothing)."""

    @property
    def shape(self) -> tuple[str, NodeType, int]:
        return self.kind, self.key[0], self.key[1]


def _atoms(tokens: Sequence[Call | Wait | Step]) -> list[_Atom]:
    atoms: list[_Atom] = []
    step = None
    for token in tokens:
        if isinstance(token, Step):
            step = token
        elif isinstance(token, Call):
            kind = "call" if token.blocking else "post"
            for i, key in enumerate(token.ops):
                atoms.append(_Atom(kind, key, joined=token.blocking and i > 0, step=step if i == 0 else None))
                step = None
        else:
            atoms.append(_Atom("wait", token.key, step=step))
            step = None
    return atoms


def _waited_transfer(items: Sequence[_Item], item: _Item) -> Op | None:
    """The pipeline transfer a WAIT item waits on; None for any other item."""
    if item.op.type != NodeType.WAIT or len(item.deps) != 1:
        return None
    target = items[item.deps[0]].op
    return target if target.type in P2P and target.group == PIPELINE_GROUP else None


def _found_atoms(items: Sequence[_Item]) -> list[tuple[int, _Atom]]:
    """The program's pipeline ops and waits on them, by item index."""
    found = []
    previous_coalesced = False
    for index, item in enumerate(items):
        op = item.op
        if op.type in P2P and op.group == PIPELINE_GROUP:
            blocking = item.stream == COMPUTE_STREAM
            found.append(
                (
                    index,
                    _Atom("call" if blocking else "post", _key(op), joined=blocking and previous_coalesced),
                )
            )
            previous_coalesced = blocking and op.coalesced
            continue
        previous_coalesced = False
        target = _waited_transfer(items, item)
        if target is not None:
            found.append((index, _Atom("wait", _key(target))))
    return found


@dataclasses.dataclass
class _Interleaved:
    """The reference's program cut by the interleaved schedule (`graph.schedule.interleaved`)."""

    waits: bool
    send_wait: str
    total: int
    prologue: range
    epilogue: range
    steps: dict[Step, range]
    glue: dict[tuple, list[int]]
    """The compute item of each gap of the schedule's loop between two pipeline atoms, by the atoms'
    shapes, in program order."""
    templates: dict[tuple[str, NodeType, int], _Item]
    """A pipeline op of the reference per (call or post, type, offset): what a member's op copies."""
    tails: dict[int, range] = dataclasses.field(default_factory=dict)
    """Per gradient-reduce point k (`grad_sync_points`) the reference launched inside the loop, the
    items of that launch at the end of its backward step k + its rank (empty without one)."""
    heads: dict[int, range] = dataclasses.field(default_factory=dict)
    """Per parameter-gather point k (`param_sync_points`), the items of the reference's launch at the
    start of its forward step k - its rank (empty without one: gathers not aligned)."""


def _tail(items: Sequence[_Item], content: range) -> range:
    """The launch at the end of a backward step: from the compute span before the first op posted on
    a side stream that nothing on the compute stream follows (the launch's own work, as the
    gradients' scaling, ends that span) to the step's end; empty where there is none."""
    start = content.stop
    for index in reversed(content):
        item = items[index]
        if item.stream != COMPUTE_STREAM:
            start = index
        elif item.op.type != NodeType.COMPUTE:
            break
    if start == content.stop or start - 1 < content.start or items[start - 1].op.type != NodeType.COMPUTE:
        return range(0)
    return range(start - 1, content.stop)


def _launch_head(items: Sequence[_Item], content: range) -> range:
    """The launch at the start of a forward step: its first compute span (the launch's own work) and
    the all-gathers posted on side streams after it, one per bucket group, each after a span of its
    own; empty where the step starts otherwise."""
    start = content.start
    if not content or items[start].op.type != NodeType.COMPUTE:
        return range(0)

    def gather(i: int) -> bool:
        return (
            i < content.stop and items[i].stream != COMPUTE_STREAM and items[i].op.comm == OpKind.ALL_GATHER
        )

    end = start + 1
    if not gather(end):
        return range(0)
    while gather(end) or (items[end].op.type == NodeType.COMPUTE and gather(end + 1)):
        end += 1
    if end < content.stop and items[end].stream != COMPUTE_STREAM:
        return range(0)  # something else posted with it: not a parameter gather's launch
    return range(start, end)


def _cut_interleaved(items: Sequence[_Item], role_class: RoleClass, reference: str) -> _Interleaved:
    """Cut the reference by the interleaved order of its own warm-up, under the first variant it
    follows; ValueError naming the first difference from the closest variant if it follows none."""
    total, warmup = role_class.num_microbatches * role_class.chunks, role_class.warmup[reference]
    found = _found_atoms(items)
    errors = []
    for waits, send_wait in _VARIANTS:
        expected = _atoms(interleaved(total, warmup, waits=waits, send_wait=send_wait))
        problem = _match(items, found, expected)
        if problem is None:
            cut = _split(items, found, expected, waits, send_wait, total)
            rank = role_class.stages[reference]
            for point in grad_sync_points(
                role_class.num_microbatches, role_class.chunks, role_class.microbatch_group
            ):
                if point + rank < total:
                    cut.tails[point] = _tail(items, cut.steps[Step(BACKWARD, point + rank)])
            for point in param_sync_points(
                role_class.num_microbatches, role_class.chunks, role_class.microbatch_group
            ):
                cut.heads[point] = _launch_head(items, cut.steps[Step(FORWARD, point - rank)])
            return cut
        errors.append(problem)
    what = f"the interleaved schedule with {warmup} warm-up of {total} virtual microbatches"
    closest = errors[0] if any(a.kind == "wait" for _, a in found) else errors[-1]
    raise ValueError(f"role {reference}: {closest}, not as {what} has it")


def _match(
    items: Sequence[_Item], found: Sequence[tuple[int, _Atom]], expected: Sequence[_Atom]
) -> str | None:
    """None when the program's atoms are the expected ones (then only waits, put at the iteration's
    end, may follow); else the first difference."""
    for number, (want, (index, got)) in enumerate(zip(expected, found, strict=False)):
        if (got.kind, got.key, got.joined) != (want.kind, want.key, want.joined):
            return f"pipeline op {number} is {got.kind} {format_op(items[index].op)!r}, expected {want.kind} {_head(want.key)}"
    if len(found) < len(expected) or any(a.kind != "wait" for _, a in found[len(expected) :]):
        return f"{len(found)} pipeline ops and waits, expected {len(expected)}"
    return None


def _split(items, found, expected, waits, send_wait, total) -> _Interleaved:
    steps: dict[Step, range] = {}
    glue: dict[tuple, list[int]] = {}
    templates: dict[tuple[str, NodeType, int], _Item] = {}
    for number, want in enumerate(expected):
        index = found[number][0]
        if want.kind != "wait":
            templates.setdefault(want.shape, items[index])
        if number == 0:
            continue
        between = range(found[number - 1][0] + 1, index)
        if want.step is not None:
            steps[want.step] = between
        elif want.joined:
            if between:
                raise ValueError(f"ops {format_op(items[between.start].op)!r} inside a pipeline call")
        else:
            if len(between) != 1 or items[between.start].op.type != NodeType.COMPUTE:
                held = [format_op(items[i].op) for i in between]
                raise ValueError(f"the interleaved schedule's loop holds {held} between two pipeline ops")
            glue.setdefault((expected[number - 1].shape, want.shape), []).append(between.start)
    first, last = found[0][0], found[len(expected) - 1][0]
    return _Interleaved(
        waits, send_wait, total, range(0, first), range(last + 1, len(items)), steps, glue, templates
    )


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
        self._interleaved = None
        if role_class.warmup is not None:
            num, warmup = role_class.num_microbatches, role_class.warmup[reference]
            if role_class.chunks is not None:
                self._interleaved = _cut_interleaved(self._items, role_class, reference)
            else:
                what = f"1F1B with {warmup} warm-up of {num} microbatches"
                self._steps = _cut(self._items, one_f_one_b(num, warmup), reference, what)
        self._layouts: dict[int | tuple[int, int] | None, _MemberLayout] = {}

    def order_of(self, member: str) -> int | tuple[int, int] | None:
        """What sets the member's op order: its warm-up count, and under the interleaved schedule its
        pipeline rank too (None: the reference's order)."""
        if member not in self.role_class.members:
            raise ValueError(
                f"role {member!r} is not a member of the class of {self.role_class.representative!r}"
            )
        if self._steps is None and self._interleaved is None:
            return None
        if self._interleaved is not None:  # members all in warm-up share a count, not a rank
            return self.role_class.warmup[member], self.role_class.stages[member]
        return self.role_class.warmup[member]

    def _layout(self, member: str) -> _MemberLayout:
        order = self.order_of(member)
        if order not in self._layouts:
            if self._interleaved is not None:
                self._layouts[order] = self._interleaved_layout(*order)
            else:
                self._layouts[order] = self._one_order_layout(order)
        return self._layouts[order]

    def _one_order_layout(self, warmup: int | None) -> _MemberLayout:
        """A member's program as the reference's (None) or in the 1F1B order of its warm-up."""
        pieces, extra = self._pieces(warmup)
        source = []
        for number, piece in enumerate(pieces):
            if isinstance(piece, int) and piece in self._compute:
                source.append((self._compute[piece], *extra.get(number, ())))
            elif not isinstance(piece, int) and piece.type == NodeType.COMPUTE:
                source.append(())
        return _MemberLayout(_reassemble(self._items, pieces), tuple(source))

    def _interleaved_layout(self, warmup: int, rank: int) -> _MemberLayout:
        """A member's program under the interleaved schedule: the reference's prologue, its steps by
        identity (F_k, B_k) in the member's order, the reference's gap of the loop between the same
        two kinds of pipeline op (the n-th such gap its n-th, else its last; one of 0 ns where it
        has none), new pipeline ops and waits as the member's order has them, and the epilogue, its
        waits on pipeline sends retargeted to the member's posts (or left out, their spans joined,
        where the member waited in the call). A gradient reduce launched inside the loop moves with
        the rank (`grad_sync_points`): out of the backward step that launched it in the reference
        (that step ends with the last span of one of its chunk's steps that launch nothing) into the
        one that launches it in the member (its last span replaced by the launch's). An aligned
        parameter all-gather launched inside the loop (`param_sync_points`) moves the same way, at the
        start of forward steps: its launch (a span and the posts after it) out of the reference's
        step that launched it, ahead of the member's that launches it."""
        cut, items = self._interleaved, self._items
        atoms = _atoms(interleaved(cut.total, warmup, waits=cut.waits, send_wait=cut.send_wait))
        pieces: list[_Piece] = []
        source: list[tuple[int, ...]] = []
        where: dict[int, int] = {}
        posted: dict[tuple[NodeType, int, int], int] = {}
        last_on_compute = -1

        def place(stream: str, op: Op, deps: tuple[int, ...] = (), spans: tuple[int, ...] = ()) -> int:
            nonlocal last_on_compute
            pieces.append(_Piece(stream, op, deps))
            if stream == COMPUTE_STREAM:
                last_on_compute = len(pieces) - 1
            if op.type == NodeType.COMPUTE:
                source.append(spans)
            return len(pieces) - 1

        def take(index: int) -> None:
            item = items[index]
            # a side-stream op is posted behind the compute-stream op before it, as captured
            deps = (last_on_compute,) if item.stream != COMPUTE_STREAM else _placed_deps(item, where)
            spans = (self._compute[index],) if index in self._compute else ()
            where[index] = place(item.stream, item.op, deps, spans)

        def template(atom: _Atom) -> _Item:
            found = cut.templates.get(atom.shape)
            if found is None:
                raise ValueError(
                    f"role {self.reference} has no {atom.kind} {_head(atom.key)} to derive a member's from"
                )
            return found

        own_rank = self.role_class.stages[self.reference]
        launched = {point + own_rank: tail for point, tail in cut.tails.items()}
        launches = {point + rank: tail for point, tail in cut.tails.items()}
        gathered = {point - own_rank: head for point, head in cut.heads.items() if head}
        gathers = {point - rank: head for point, head in cut.heads.items() if head}
        chunk_of = [
            chunk
            for _, chunk in schedule_table(
                self.role_class.num_microbatches, self.role_class.chunks, self.role_class.microbatch_group
            )
        ]

        def plain_end(work: Step) -> int:
            """The last span of a backward step of the same chunk that launches nothing."""
            chunk = chunk_of[work.microbatch]
            for other, same in enumerate(chunk_of):
                if same == chunk and other not in launched:
                    return cut.steps[Step(BACKWARD, other)][-1]
            raise ValueError(f"role {self.reference}: every backward step of chunk {chunk} launches a reduce")

        def step(work: Step) -> None:
            content = list(cut.steps[work])
            drop = add = range(0)
            if work.kind == BACKWARD:
                drop, add = launched.get(work.microbatch, range(0)), launches.get(work.microbatch, range(0))
            if drop == add:
                drop = add = range(0)
            if drop:
                content = [i for i in content if i not in drop] + [plain_end(work)]
            if add:
                content = content[:-1] + list(add)
            if work.kind == FORWARD:
                head_out, head_in = gathered.get(work.microbatch), gathers.get(work.microbatch)
                if head_out != head_in:
                    if head_out:
                        content = [i for i in content if i not in head_out]
                    if head_in:
                        content = list(head_in) + content
            for index in content:
                take(index)

        for index in cut.prologue:
            take(index)
        seen: dict[tuple, int] = {}
        for number, atom in enumerate(atoms):
            if number and atom.step is None and not atom.joined:
                context = (atoms[number - 1].shape, atom.shape)
                gaps, nth = cut.glue.get(context), seen.get(context, 0)
                seen[context] = nth + 1
                if gaps:
                    take(gaps[min(nth, len(gaps) - 1)])
                else:
                    place(COMPUTE_STREAM, Op(type=NodeType.COMPUTE, name=COMPUTE_NAME))
            if atom.step is not None:
                step(atom.step)
            if atom.kind == "call":
                joined = number + 1 < len(atoms) and atoms[number + 1].joined
                place(COMPUTE_STREAM, dataclasses.replace(template(atom).op, coalesced=joined))
            elif atom.kind == "post":
                found = template(atom)
                posted[atom.key] = place(found.stream, found.op, (last_on_compute,))
            else:
                place(COMPUTE_STREAM, Op(type=NodeType.WAIT), (posted[atom.key],))
        join_next = False
        for index in cut.epilogue:
            item = items[index]
            if join_next and index in self._compute:
                source[-1] += (self._compute[index],)
                join_next = False
                continue
            target = _waited_transfer(items, item)
            if target is not None:
                key = _key(target)
                if key in posted:
                    place(COMPUTE_STREAM, item.op, (posted[key],))
                else:
                    join_next = pieces[-1].op.type == NodeType.COMPUTE
                continue
            take(index)
        return _MemberLayout(_assemble(pieces), tuple(source))

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
    try:
        program = ClassProgram(role_class, reference, captured[reference].streams)
    except ValueError as exc:
        schedule = (
            "overlaps its pipeline p2p under the interleaved schedule as Megatron-LM does unless "
            "--no-overlap-p2p-communication says otherwise"
            if role_class.chunks is not None
            else "runs the 1F1B schedule"
        )
        raise ValueError(
            f"{exc}. The roles {', '.join(role_class.members[:4])}{' ...' if len(role_class.members) > 4 else ''} "
            f"were taken to run one program, as a program that {schedule} would; pass "
            "--prism-capture-all-roles to give every role its own capture"
        ) from None
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
        by_order: dict[object, list[int]] = {}  # members in one order share one list (1024 roles)
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
