"""The execution-graph schema: printable form, validation, files."""

import json
import os

import pytest

from prism_megatron.graph import (
    SCHEMA_VERSION,
    Dep,
    ExecutionGraph,
    GraphMetadata,
    NodeType,
    Op,
    RoleGraph,
    format_op,
    load_graph,
    parse_op,
    save_graph,
)
from prism_megatron.graph.printable import format_duration, format_size, parse_duration, parse_size
from prism_megatron.replay.schedule import OpKind

EXAMPLES = {
    "c:fwd 1.2ms mb2": Op(type=NodeType.COMPUTE, name="fwd", duration_ns=1_200_000, microbatch=2),
    "AR tp#3 4MiB bf16": Op(
        type=NodeType.COLLECTIVE, comm=OpKind.ALL_REDUCE, group="tp", seq=3, size_bytes=4 << 20, dtype="bf16"
    ),
    "RS:grad dp#0 96MiB fp32 &": Op(
        type=NodeType.COLLECTIVE,
        comm=OpKind.REDUCE_SCATTER,
        name="grad",
        group="dp",
        seq=0,
        size_bytes=96 << 20,
        dtype="fp32",
        coalesced=True,
    ),
    "S→pp+1#4 16MiB bf16 mb2": Op(
        type=NodeType.SEND, group="pp", offset=1, seq=4, size_bytes=16 << 20, dtype="bf16", microbatch=2
    ),
    "R:act-in←pp-1#0 1000B": Op(
        type=NodeType.RECV, name="act-in", group="pp", offset=-1, seq=0, size_bytes=1000
    ),
    "w <comm:3,send:5": Op(type=NodeType.WAIT, deps=(Dep("comm", 3), Dep("send", 5))),
    "c:bwd 17ns": Op(type=NodeType.COMPUTE, name="bwd", duration_ns=17),
}


@pytest.mark.parametrize("text", sorted(EXAMPLES))
def test_printable_form_prints_and_parses_back_exactly(text):
    op = EXAMPLES[text]
    assert format_op(op) == text
    assert parse_op(text) == op


def test_ascii_arrows_parse_like_the_unicode_ones():
    assert parse_op("S->pp+1#0 1B") == parse_op("S→pp+1#0 1B")
    assert parse_op("R<-pp-1#0 1B") == parse_op("R←pp-1#0 1B")


@pytest.mark.parametrize("ns", [0, 1, 999, 1000, 1001, 1_200_000, 123_456_789_012, 10**15])
def test_durations_round_trip_exactly(ns):
    assert parse_duration(format_duration(ns)) == ns


@pytest.mark.parametrize("size", [0, 1, 1000, 1024, 1536, 4 << 20, (3 << 30) + 1])
def test_sizes_round_trip_exactly(size):
    assert parse_size(format_size(size)) == size


def test_units_read_naturally():
    assert format_duration(1_200_000) == "1.2ms"
    assert format_duration(850_000) == "850us"
    assert format_size(1536) == "1536B"
    assert format_size(4 << 20) == "4MiB"


@pytest.mark.parametrize("text", ["", "X tp#0", "AR tp 4MiB", "c:fwd 1.5ns", "S→pp#0 1B", "AR tp#0 1B x y"])
def test_malformed_printable_forms_are_rejected_with_the_text(text):
    with pytest.raises(ValueError, match="cannot parse op"):
        parse_op(text)


def test_ops_reject_fields_that_do_not_fit_their_type():
    with pytest.raises(ValueError, match="needs a group kind"):
        Op(type=NodeType.COLLECTIVE, comm=OpKind.ALL_REDUCE, seq=0)
    with pytest.raises(ValueError, match="non-zero offset"):
        Op(type=NodeType.SEND, group="pp", offset=0, seq=0)
    with pytest.raises(ValueError, match="takes no comm"):
        Op(type=NodeType.COMPUTE, group="tp")
    with pytest.raises(ValueError, match="may use only"):
        Op(type=NodeType.COMPUTE, name="has space")


def test_a_role_rejects_dangling_dependencies_and_sequence_gaps():
    fwd = parse_op("c:fwd 1ms")
    with pytest.raises(ValueError, match="out of range"):
        RoleGraph("r", {"compute": (fwd,), "comm": (parse_op("w <compute:4"),)})
    with pytest.raises(ValueError, match=r"not 0\.\.n-1"):
        RoleGraph("r", {"compute": (parse_op("AR tp#0 1B"), parse_op("AR tp#2 1B"))})
    with pytest.raises(ValueError, match="no 'compute' stream"):
        RoleGraph("r", {"comm": (fwd,)})


def _read(path):
    with open(path, encoding="utf-8") as f:
        return f.read()


def _write(path, text):
    with open(path, "w", encoding="utf-8") as f:
        f.write(text)


def _graph():
    ops = tuple(parse_op(t) for t in ["c:fwd 1ms mb0", "S→pp+1#0 4MiB bf16 mb0", "AR dp#0 1GiB fp32"])
    role = RoleGraph("stage0", {"compute": ops, "comm": (parse_op("w <compute:1"),)})
    meta = GraphMetadata(layout={"world_size": 8, "tp": 1, "pp": 2}, source="test", extra={"note": "x"})
    return ExecutionGraph(metadata=meta, roles={"stage0": role})


def test_a_graph_directory_round_trips(tmp_path):
    graph = _graph()
    save_graph(graph, str(tmp_path / "g"))
    assert load_graph(str(tmp_path / "g")) == graph
    assert [p for p in os.listdir(tmp_path / "g")] == ["graph.json"]  # no temporary files left


def test_a_reader_rejects_another_schema_version(tmp_path):
    path = save_graph(_graph(), str(tmp_path))
    data = json.loads(_read(path))
    data["schema_version"] = SCHEMA_VERSION + 1
    _write(path, json.dumps(data))
    with pytest.raises(ValueError, match=f"schema_version {SCHEMA_VERSION + 1} is not supported"):
        load_graph(str(tmp_path))


def test_a_reader_rejects_a_damaged_file(tmp_path):
    path = save_graph(_graph(), str(tmp_path))
    text = _read(path)
    _write(path, text.replace("1ms", "2ms"))  # still JSON, still parses: the digest catches it
    with pytest.raises(ValueError, match=r"damaged execution graph.*sha256"):
        load_graph(str(tmp_path))
    _write(path, text[: len(text) // 2])
    with pytest.raises(ValueError, match="not JSON"):
        load_graph(str(tmp_path))


def test_a_reader_names_a_directory_without_a_graph(tmp_path):
    with pytest.raises(ValueError, match="no execution graph here"):
        load_graph(str(tmp_path))


def test_derived_is_dataclasses_replace_for_what_it_changes_and_keeps_every_other_field():
    import dataclasses

    from prism_megatron.graph.schema import derived

    op = Op(type=NodeType.SEND, name="act", duration_ns=7, overhead_ns=3, group="pp", offset=1,
            size_bytes=64, dtype="BFloat16", seq=2, microbatch=5, coalesced=True, deps=(Dep("compute", 4),))  # fmt: skip
    changes = {"duration_ns": 9, "overhead_ns": 1, "seq": 0, "deps": (Dep("compute", 1),)}
    for name, value in changes.items():
        assert derived(op, **{name: value}) == dataclasses.replace(op, **{name: value})
    assert derived(op, **changes) == dataclasses.replace(op, **changes)
    assert derived(op) == op and derived(op) is not op
