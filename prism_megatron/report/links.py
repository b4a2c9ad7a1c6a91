"""Arrows between the timeline's spans: a send to its receive, a collective's last arrival to its completion.

Why: a trace of many ranks shows that rank 7 waited; the arrows show for whom. Two kinds:

* p2p: from a send (at its start) to the matching receive (at its end). A send and a receive match
  when they name each other and carry the same sequence number (sends to one peer counted in issue
  order, receives from it likewise; the graph and the backend number them the same way).
* collective: from the member that arrived last (at the start of its op) to every other drawn
  member's op (at its end): the completion waited for that arrival. Drawn only when the last
  arrival is known to be on a drawn track: for measured ops, groups whose members are all real;
  for simulated ops, when a drawn member's start equals the op's `ready_ns`.

Measured spans (real ranks, `oplog.measured_spans`) are matched with measured spans, simulated with
simulated: their sequence numbers count from different origins (the run's activation, the
iteration's start), so a real rank's send to a virtual peer gets no arrow.
"""

from __future__ import annotations

from collections.abc import Iterable, Iterator
from typing import NamedTuple

from prism_megatron.graph.printable import parse_op, split_seq
from prism_megatron.graph.schema import NodeType, Op
from prism_megatron.graph.world import World, peer_of
from prism_megatron.report.trace import Flow, FlowEnd
from prism_megatron.sim.timeline import Span


def _start(span: Span) -> FlowEnd:
    return FlowEnd(span.process, span.thread, span.start_ns)


def _end(span: Span) -> FlowEnd:
    # Just inside the span, so the arrow binds to it and not to the next one on the track.
    return FlowEnd(span.process, span.thread, max(span.start_ns, span.end_ns - 1))


def flows(measured: Iterable[Span], simulated: Iterable[Span], world: World | None) -> list[Flow]:
    """Every arrow between the given spans (see the module docstring)."""
    out = list(_p2p_flows(_measured_p2p(measured)))
    out += _collective_flows(_measured_collectives(measured))
    if world is not None:
        simulated = list(simulated)
        out += _p2p_flows(_simulated_p2p(simulated, world))
        out += _collective_flows(_simulated_collectives(simulated, world))
    return out


def _p2p_flows(ends: Iterable[tuple[str, tuple[int, int, int], Span]]) -> Iterator[Flow]:
    """`ends`: ("send" | "recv", (sender, receiver, seq), span)."""
    sends: dict[tuple[int, int, int], Span] = {}
    recvs: dict[tuple[int, int, int], Span] = {}
    for kind, key, span in ends:
        (sends if kind == "send" else recvs)[key] = span
    for key, send in sends.items():
        recv = recvs.get(key)
        if recv is not None:
            yield Flow(f"send {key[0]} -> {key[1]}", "p2p", _start(send), _end(recv))


def _collective_flows(instances: dict[tuple, list[tuple[Span, int]]]) -> list[Flow]:
    """`instances`: key -> [(span, arrival ns of the last member, or -1 when unknown)]."""
    out = []
    for members in instances.values():
        if len(members) < 2:
            continue
        last = max(members, key=lambda m: m[0].start_ns)[0]
        ready_ns = members[0][1]
        if ready_ns >= 0 and last.start_ns != ready_ns:
            continue  # the last arrival is on a track that is not drawn
        for span, _ in members:
            if span is not last:
                out.append(Flow(f"last arrival: {last.name}", "collective", _start(last), _end(span)))
    return out


def _measured_p2p(spans: Iterable[Span]) -> Iterator[tuple[str, tuple[int, int, int], Span]]:
    for span in spans:
        if span.category != "p2p" or "seq" not in span.args:
            continue
        word, _, peer = span.name.partition(" ")
        peer_rank = int(peer.split()[-1])
        if word == "send":
            yield "send", (span.process, peer_rank, span.args["seq"]), span
        elif word == "recv":
            yield "recv", (peer_rank, span.process, span.args["seq"]), span


def _measured_collectives(spans: Iterable[Span]) -> dict[tuple, list[tuple[Span, int]]]:
    instances: dict[tuple, list[tuple[Span, int]]] = {}
    for span in spans:
        if span.category == "collective" and not span.args.get("virtual_peers", True):
            key = (span.name, span.args["group"], span.args["seq"])
            instances.setdefault(key, []).append((span, -1))
    return instances


def _simulated_p2p(spans: list[Span], world: World) -> Iterator[tuple[str, tuple[int, int, int], Span]]:
    parsed: dict[str, Op] = {}
    for span in spans:
        if span.category != "p2p" or "op" not in span.args:
            continue
        op = _parsed(parsed, span.args["op"])
        peer = peer_of(world, op.group, span.process, op.offset)
        if op.type == NodeType.SEND:
            yield "send", (span.process, peer, op.seq), span
        else:
            yield "recv", (peer, span.process, op.seq), span


def _simulated_collectives(spans: list[Span], world: World) -> dict[tuple, list[tuple[Span, int]]]:
    instances: dict[tuple, list[tuple[Span, int]]] = {}
    parsed: dict[str, Op] = {}
    for span in spans:
        if span.category != "collective" or "op" not in span.args:
            continue
        op = _parsed(parsed, span.args["op"])
        members = world.group(op.group, span.process)
        instances.setdefault((op.group, members, op.seq), []).append((span, int(span.args["ready_ns"])))
    return instances


class _Identity(NamedTuple):
    type: NodeType
    group: str
    offset: int
    seq: int


def _parsed(cache: dict[str, Op], text: str) -> _Identity:
    """What the arrows match an op by (type, group, offset, sequence number), from its printable
    text. A modelled job's timeline has 10^5 communication spans whose texts differ mostly in the
    sequence number (each microbatch's transfer, each bucket's collective): the first text of each
    form (`split_seq`) is parsed whole, so a malformed one is refused quoting it, and a later text of
    that form only for its sequence number (its size, dtype and dependencies make no arrow). Parsing
    every text whole was most of the timeline's time."""
    cut = split_seq(text)
    if cut is None:  # a compute or wait op: parse_op says what is wrong with it, if anything
        parse_op(text)
        raise ValueError(f"cannot parse op {text!r}: a span of a transfer or collective holds another op")
    form, seq = cut
    op = cache.get(form)
    if op is None:
        op = cache[form] = parse_op(text)
    return _Identity(op.type, op.group, op.offset, seq)
