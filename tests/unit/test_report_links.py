"""The timeline's arrows between simulated spans: matched by what the op's text identifies."""

import pytest

from prism_megatron.graph.printable import format_op
from prism_megatron.graph.schema import NodeType, Op
from prism_megatron.graph.world import LayoutWorld
from prism_megatron.replay.schedule import OpKind
from prism_megatron.report.links import flows
from prism_megatron.sim.timeline import Span
from prism_megatron.topology import Layout

WORLD = LayoutWorld(Layout(world_size=4, tp=1, pp=2))  # rank 0 is pp0 dp0, rank 2 pp1 dp0


def _p2p(rank: int, kind: NodeType, offset: int, seq: int, start_ns: int) -> Span:
    op = Op(type=kind, group="pp", offset=offset, seq=seq, size_bytes=4096, dtype="BFloat16")
    return Span(rank, "p2p", kind.name, "p2p", start_ns, start_ns + 10, {"op": format_op(op)})


def _collective(rank: int, seq: int, start_ns: int, ready_ns: int) -> Span:
    op = Op(
        type=NodeType.COLLECTIVE, comm=OpKind.ALL_REDUCE, group="dp", seq=seq, size_bytes=64, dtype="Float"
    )
    return Span(
        rank,
        "dp",
        "ALL_REDUCE",
        "collective",
        start_ns,
        ready_ns + 5,
        {"op": format_op(op), "ready_ns": ready_ns},
    )


def test_sends_meet_the_receive_of_their_own_sequence_number():
    spans = [_p2p(0, NodeType.SEND, 1, seq, 100 * seq) for seq in range(3)]
    spans += [_p2p(2, NodeType.RECV, -1, seq, 100 * seq + 50) for seq in (2, 0, 1)]
    arrows = [f for f in flows([], spans, WORLD) if f.category == "p2p"]
    assert len(arrows) == 3
    for arrow in arrows:
        assert arrow.name == "send 0 -> 2" and (arrow.source.process, arrow.target.process) == (0, 2)
        # the receive of the same seq, just inside its end
        assert arrow.target.time_ns == arrow.source.time_ns + 59


def test_a_collective_links_its_last_arrival_per_sequence_number():
    spans = [
        _collective(0, 0, 10, 30),
        _collective(1, 0, 30, 30),
        _collective(0, 1, 100, 100),
        _collective(1, 1, 70, 100),
    ]
    arrows = [f for f in flows([], spans, WORLD) if f.category == "collective"]
    assert sorted((a.source.process, a.target.process, a.source.time_ns) for a in arrows) == [
        (0, 1, 100),
        (1, 0, 30),
    ]


@pytest.mark.parametrize("text", ["S→pp+1", "S→pp+1#x", "AG dp", "S→pp+1#99999999999999999"])
def test_an_op_text_without_a_valid_sequence_number_is_refused_with_the_text(text):
    with pytest.raises(ValueError, match="cannot parse op"):
        flows([], [Span(0, "p2p", "SEND", "p2p", 0, 1, {"op": text})], WORLD)


@pytest.mark.parametrize(
    "texts",
    [
        ["S→p-p+1#3 4MiB"],  # a group kind no op has: the text itself is quoted
        ["S→pp+1#0 4KiB BFloat16", "S→pp+1#99999999999999 4KiB BFloat16"],  # seq above the largest
        ["c:compute 1ms"],  # a span of a transfer holding a compute op
    ],
)
def test_a_malformed_op_is_refused_quoting_its_own_text_even_after_its_form_was_seen(texts):
    spans = [Span(0, "p2p", "SEND", "p2p", 0, 1, {"op": text}) for text in texts]
    with pytest.raises(ValueError, match="cannot parse op " + repr(texts[-1]).replace("+", r"\+")):
        flows([], spans, WORLD)
