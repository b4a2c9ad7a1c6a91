"""Chakra execution traces: our schema copy decodes Chakra's own files, and our files read back as our graph."""

import dataclasses
import json
import os
import re

import pytest

from prism_megatron.cli import main
from prism_megatron.graph import ExpandedGraph, save_graph
from prism_megatron.graph.chakra import et_def_pb2 as et
from prism_megatron.graph.chakra import export_chakra
from prism_megatron.graph.chakra.export import COMM_TYPES, FEEDER_TYPES, NODE_TYPES, node_ids
from prism_megatron.graph.chakra.stream import attributes, encode_varint, framed, read_trace
from prism_megatron.graph.schema import ExecutionGraph, GraphMetadata, NodeType, Op, RoleGraph
from prism_megatron.graph.world import LayoutWorld
from prism_megatron.network import PRESETS
from prism_megatron.network.astra import astra_network
from prism_megatron.replay.schedule import OpKind
from prism_megatron.sim import PipelineSpec, layout_pipeline_graph
from prism_megatron.sim.cost import AlphaBetaCost
from prism_megatron.topology import Layout

DATA = os.path.join(os.path.dirname(__file__), "data", "chakra")
PROTO = os.path.join(os.path.dirname(et.__file__), "et_def.proto")
ASTRA_SIM_RUNS = {et.ALL_REDUCE, et.ALL_GATHER, et.REDUCE_SCATTER, et.ALL_TO_ALL, et.BROADCAST}
"""ASTRA-sim's Workload::issue_coll_comm: every other type is "Unsupported collective comm type"."""
LAYOUT = Layout(world_size=16, tp=2, pp=4)
SPEC = PipelineSpec(
    num_microbatches=4,
    fwd_ns=1500,
    bwd_ns=2000,
    activation_bytes=64,
    tp_allreduce_bytes=128,
    dp_grad_bytes=4096,
)


@pytest.fixture(scope="module")
def expanded():
    return ExpandedGraph(layout_pipeline_graph(LAYOUT, SPEC), LayoutWorld(LAYOUT))


# ---- the schema ----------------------------------------------------------------------------------


def test_a_published_chakra_trace_decodes_with_our_module_byte_for_byte():
    """ASTRA-sim's all-reduce microbenchmark traces, written by Chakra's tools (see data/chakra/README.md)."""
    for npu in (0, 1):
        path = os.path.join(DATA, f"all_reduce.{npu}.et")
        metadata, nodes = read_trace(path)
        assert metadata.version == "0.0.4"
        (node,) = nodes
        assert (node.id, node.name, node.type) == (npu, "all_reduce_4npus_1MB", et.COMM_COLL_NODE)
        assert attributes(node) == {"is_cpu_op": False, "comm_type": et.ALL_REDUCE, "comm_size": 1 << 20}
        with open(path, "rb") as f:
            assert framed(metadata) + framed(node) == f.read()  # re-encoded: the same bytes


def _proto_fields(text: str) -> dict[str, dict[str, tuple[str, int]]]:
    """message -> field -> (type, number), read from the .proto text."""
    text = re.sub(r"//[^\n]*", "", text)
    out = {}
    for name, body in re.findall(r"message\s+(\w+)\s*\{((?:[^{}]|\{[^{}]*\})*)\}", text):
        fields = re.findall(r"(?:repeated\s+)?([\w.]+)\s+(\w+)\s*=\s*(\d+)\s*;", body)
        out[name] = {field: (kind, int(number)) for kind, field, number in fields}
    return out


def test_the_generated_module_has_every_message_and_field_of_the_proto_file():
    with open(PROTO, encoding="utf-8") as f:
        fields = _proto_fields(f.read())
    assert set(fields) == set(et.DESCRIPTOR.message_types_by_name)
    for message, expected in fields.items():
        descriptor = et.DESCRIPTOR.message_types_by_name[message]
        assert {f.name: f.number for f in descriptor.fields} == {k: n for k, (_, n) in expected.items()}, (
            message
        )
    # Chakra's numbering, spot-checked against the published et_def.proto (release 1.0.0)
    node = et.DESCRIPTOR.message_types_by_name["Node"].fields_by_name
    assert [node[k].number for k in ("id", "name", "type", "ctrl_deps", "data_deps", "duration_micros", "attr")] == [
        1, 2, 3, 4, 5, 7, 10
    ]  # fmt: skip
    assert et.COMM_COLL_NODE == 7 and et.REDUCE_SCATTER == 7 and et.BARRIER == 9


def test_the_committed_module_is_what_the_proto_compiles_to(tmp_path):
    pytest.importorskip("grpc_tools")
    import importlib.util

    from prism_megatron.graph.chakra.regenerate import generate

    path = generate(str(tmp_path))
    spec = importlib.util.spec_from_file_location("regenerated", path)
    with open(path, encoding="utf-8") as f:
        text = f.read()
    committed = et.DESCRIPTOR.serialized_pb
    # The generated module registers the file in protobuf's default pool under the same name as the
    # committed one; compare the serialized descriptor it carries instead of importing it twice.
    match = re.search(r"AddSerializedFile\((b'.*?')\)\n", text, re.S)
    assert spec is not None and match is not None
    assert eval(match.group(1)) == committed  # a bytes literal protoc wrote


# ---- our traces ----------------------------------------------------------------------------------


def test_traces_read_back_with_one_node_per_op_and_the_graphs_dependencies(expanded, tmp_path):
    exported = export_chakra(expanded, str(tmp_path), all_ranks=True)
    names = sorted(os.path.basename(p) for p in exported.paths)
    assert names == sorted([*(f"chakra.{r}.et" for r in range(16)), "comm_groups.json"])
    with open(tmp_path / "comm_groups.json", encoding="utf-8") as f:
        groups = {int(k): tuple(v) for k, v in json.load(f).items()}
    assert min(groups) == 1  # ASTRA-sim reads "0" as "every rank"
    for rank in (2, 5, 14):
        metadata, nodes = read_trace(str(tmp_path / f"chakra.{rank}.et"))
        meta = attributes(metadata)
        assert (metadata.version, meta["rank"], meta["world_size"]) == ("0.0.4", rank, 16)
        streams = expanded.streams(rank)
        ids = node_ids(streams)
        at = {node_id: (name, index, streams[name][index]) for (name, index), node_id in ids.items()}
        assert len(nodes) == len(ids) and [n.id for n in nodes] == list(range(len(ids)))
        for node in nodes:
            stream, index, resolved = at[node.id]
            op, attrs = resolved.op, attributes(node)
            assert node.type == NODE_TYPES[op.type] and attrs["stream"] == stream
            assert attrs["duration_ns"] == op.duration_ns
            stream_order = [ids[(stream, index - 1)]] if index else []
            assert list(node.ctrl_deps) == stream_order
            assert list(node.data_deps) == stream_order + [ids[(d.stream, d.index)] for d in op.deps]
            if op.type == NodeType.COLLECTIVE:
                assert attrs["comm_type"] == COMM_TYPES[op.comm]
                assert groups[int(attrs["pg_name"])] == resolved.members
            elif op.type in (NodeType.SEND, NodeType.RECV):
                peer = attrs["comm_dst"] if op.type == NodeType.SEND else attrs["comm_src"]
                assert peer == resolved.peer and rank in (attrs["comm_src"], attrs["comm_dst"])
                assert attrs["comm_size"] == op.size_bytes
        sends = [n for n in nodes if n.type == et.COMM_SEND_NODE]
        # each send: its stream order (none for the first) and the compute that produced its data
        assert sends and all(len(n.data_deps) == len(n.ctrl_deps) + 1 for n in sends)


def test_sends_have_the_lowest_ids_so_astra_sim_issues_them_before_a_collective_ready_with_them(
    expanded, tmp_path
):
    # ASTRA-sim runs one communication node per NPU at a time and issues ready nodes in id order; on
    # the last stage (ranks 8-15) the final backward send and the DP reduce-scatter wait on the same
    # all-reduce, and the reduce-scatter first, then the world all-reduce, held the NPU while the
    # first stage waited for that send: ASTRA-sim ended with every NPU stuck.
    export_chakra(expanded, str(tmp_path), all_ranks=True)
    for rank in range(16):
        _, nodes = read_trace(str(tmp_path / f"chakra.{rank}.et"))
        sends = [n.id for n in nodes if n.type == et.COMM_SEND_NODE]
        collectives = [n.id for n in nodes if n.type == et.COMM_COLL_NODE]
        assert sends and collectives and max(sends) < min(collectives), rank
    by_id = {n.id: n for n in nodes}  # rank 15, last stage
    last_send = by_id[max(sends)]
    grads = next(n for n in nodes if n.name == "COMM_COLL_NODE REDUCE_SCATTER dp grads")
    assert set(last_send.data_deps) - set(last_send.ctrl_deps) == set(grads.ctrl_deps)  # ready together


def test_node_names_start_with_the_type_chakras_timeline_visualizer_looks_for(expanded, tmp_path):
    export_chakra(expanded, str(tmp_path), [0])
    _, nodes = read_trace(str(tmp_path / "chakra.0.et"))
    for node in nodes:
        assert node.name.split(" ")[0] == et.NodeType.Name(node.type), node.name
        assert "," not in node.name and "=" not in node.name  # the visualizer splits its log on these
    assert {n.name for n in nodes} >= {"COMP_NODE fwd", "COMP_NODE bwd", "COMM_COLL_NODE ALL_REDUCE tp"}


def test_every_attribute_the_feeder_knows_has_the_type_it_reads(expanded, tmp_path):
    """comm_src/dst/tag as int32_val, comm_type/comm_size as int64_val (src/feeder/et_feeder_node.cpp):
    the feeder reads a value in another field as 0, every send would go from 0 to 0."""
    export_chakra(expanded, str(tmp_path), all_ranks=True)
    seen = set()
    for rank in range(16):
        _, nodes = read_trace(str(tmp_path / f"chakra.{rank}.et"))
        for node in nodes:
            for attr in node.attr:
                if attr.name in FEEDER_TYPES:
                    assert attr.WhichOneof("value") == FEEDER_TYPES[attr.name], (rank, node.name, attr.name)
                    seen.add(attr.name)
            if node.type in (et.COMM_SEND_NODE, et.COMM_RECV_NODE):
                src, dst = (
                    a.int32_val for name in ("comm_src", "comm_dst") for a in node.attr if a.name == name
                )
                assert src != dst and rank in (src, dst)
    assert seen == set(FEEDER_TYPES)


def test_durations_are_whole_microseconds_that_keep_each_streams_total(tmp_path):
    """ASTRA-sim reads duration_micros only; 0.4 us ops rounded alone would all run as 1 ns."""
    spec = dataclasses.replace(SPEC, fwd_ns=1400, bwd_ns=2600, tp_allreduces_per_chunk=4)
    graph = ExpandedGraph(layout_pipeline_graph(LAYOUT, spec), LayoutWorld(LAYOUT))
    export_chakra(graph, str(tmp_path), [0])
    _, nodes = read_trace(str(tmp_path / "chakra.0.et"))
    compute = [n for n in nodes if attributes(n)["stream"] == "compute" and n.type == et.COMP_NODE]
    exact_us = written_us = 0.0
    for node in compute:
        exact_us += attributes(node)["duration_ns"] / 1000
        written_us += node.duration_micros
        assert abs(written_us - exact_us) <= 0.5 + 1e-9
    assert {attributes(n)["duration_ns"] for n in compute} >= {350, 650}  # pieces shorter than 1 us
    assert any(n.duration_micros == 0 for n in compute) and any(n.duration_micros == 1 for n in compute)


def test_an_all_gathers_size_is_each_ranks_input(expanded, tmp_path):
    """ASTRA-sim's Ring.cc and Chakra's PyTorch converter: an all-gather's comm_size is one rank's part."""
    export_chakra(expanded, str(tmp_path), [0])
    _, nodes = read_trace(str(tmp_path / "chakra.0.et"))
    streams = expanded.streams(0)
    resolved = {node_id: streams[name][index] for (name, index), node_id in node_ids(streams).items()}
    sizes = {}
    for node in nodes:
        r = resolved[node.id]
        if r.op.type == NodeType.COLLECTIVE:
            sizes[r.op.comm] = (attributes(node)["comm_size"], r.op.size_bytes, len(r.members))
    assert sizes[OpKind.ALL_GATHER] == (SPEC.dp_grad_bytes // 2, SPEC.dp_grad_bytes, 2)
    assert sizes[OpKind.REDUCE_SCATTER] == (SPEC.dp_grad_bytes, SPEC.dp_grad_bytes, 2)  # the full input
    assert sizes[OpKind.ALL_REDUCE][0] == sizes[OpKind.ALL_REDUCE][1]


def test_collectives_astra_sim_refuses_are_exported_as_ones_it_runs(tmp_path):
    kinds = [OpKind.BARRIER, OpKind.REDUCE, OpKind.GATHER, OpKind.SCATTER, OpKind.BROADCAST]
    ops = tuple(
        Op(type=NodeType.COLLECTIVE, comm=kind, group="world", seq=seq, size_bytes=4096)
        for seq, kind in enumerate(kinds)
    )
    world = LayoutWorld(Layout(world_size=4))
    roles = {name: RoleGraph(role=name, streams={"compute": ops}) for name in world.roles()}
    graph = ExpandedGraph(ExecutionGraph(GraphMetadata(layout={}), roles), world)
    export_chakra(graph, str(tmp_path), [0], cost_fn=AlphaBetaCost(latency_ns=1000, ns_per_byte=1.0))
    _, nodes = read_trace(str(tmp_path / "chakra.0.et"))
    got = [
        (attributes(n)["comm_type"], attributes(n)["comm_size"], attributes(n).get("prism_comm_type"))
        for n in nodes
    ]
    assert got == [
        (et.ALL_REDUCE, 4, "BARRIER"),
        (et.REDUCE_SCATTER, 4096, "REDUCE"),
        (et.ALL_GATHER, 1024, "GATHER"),
        (et.REDUCE_SCATTER, 4096, "SCATTER"),
        (et.BROADCAST, 4096, None),
    ]
    assert {t for t, _, _ in got} <= ASTRA_SIM_RUNS
    assert [n.duration_micros for n in nodes] == [0, 0, 0, 0, 5]  # the broadcast: 1 us + 4096 B x 1 ns/B


def test_by_default_one_trace_per_role_and_the_role_map(expanded, tmp_path):
    exported = export_chakra(expanded, str(tmp_path))
    traces = [p for p in exported.paths if p.endswith(".et")]
    assert len(traces) == len(expanded.world.roles())
    with open(tmp_path / "roles.json", encoding="utf-8") as f:
        roles = json.load(f)["roles"]
    assert sum(r["num_ranks"] for r in roles.values()) == 16
    for name, role in roles.items():
        assert os.path.isfile(tmp_path / role["file"])
        assert expanded.role_of(role["representative"]) == name


def test_all_ranks_beyond_the_size_limit_is_refused_with_the_estimate(expanded, tmp_path):
    with pytest.raises(ValueError, match=r"--all-ranks would write about .* for 16 NPUs, above the limit"):
        export_chakra(expanded, str(tmp_path), all_ranks=True, max_bytes=1000)
    assert not os.listdir(tmp_path)


def test_framing_is_a_varint_length_before_each_message():
    assert encode_varint(0) == b"\x00" and encode_varint(300) == b"\xac\x02"
    node = et.Node(id=1, name="x")
    assert framed(node) == bytes([len(node.SerializeToString())]) + node.SerializeToString()
    with pytest.raises(ValueError, match="empty Node"):
        framed(et.Node())


def test_a_damaged_trace_is_refused_naming_the_file(tmp_path):
    path = tmp_path / "cut.et"
    path.write_bytes(framed(et.GlobalMetadata(version="0.0.4")) + b"\x20abc")
    with pytest.raises(ValueError, match=r"cut\.et: the file ends inside a message"):
        read_trace(str(path))


def test_the_export_command_reads_a_run_folder(expanded, tmp_path, capsys):
    save_graph(expanded.graph, str(tmp_path / "run" / "graph"))
    assert (
        main(["export", "chakra", str(tmp_path / "run"), "--out", str(tmp_path / "et"), "--all-ranks"]) == 0
    )
    assert "wrote 16 Chakra traces (every NPU of 16" in capsys.readouterr().out
    assert main(["export", "chakra", str(tmp_path / "nothing"), "--out", str(tmp_path / "x")]) == 2
    assert "holds neither graph.json nor graph/graph.json" in capsys.readouterr().err
    status = main(
        ["export", "chakra", str(tmp_path / "run"), "--out", str(tmp_path / "y"), "--max-size", "lots"]
    )
    assert status == 2 and "--max-size 'lots'" in capsys.readouterr().err
    out = ["--out", str(tmp_path / "z")]
    assert main(["export", "chakra", str(tmp_path / "run"), *out, "--cluster", "dgx-h100"]) == 0
    assert main(["export", "chakra", str(tmp_path / "run"), *out, "--cluster", "nowhere-9"]) == 2
    assert "nowhere-9" in capsys.readouterr().err


# ---- ASTRA-sim's network -------------------------------------------------------------------------


def test_a_preset_as_astra_sims_analytical_network(tmp_path, capsys):
    config = astra_network(PRESETS["dgx-h100"], 8192)
    assert config["topology"] == ["Switch", "Switch", "Switch"]
    assert config["npus_count"] == [8, 32, 32]  # GPUs per node, nodes per leaf group, leaf groups
    # ASTRA-sim's GB/s are 2**30 bytes/s (bw_GBps_to_Bpns); ours 10**9
    gib = 1e9 / 2**30
    assert config["bandwidth"][0] == pytest.approx(
        450 * 20.6 / 25 * gib, abs=1e-3
    )  # NVLink as NCCL reaches it
    assert config["bandwidth"][1] == pytest.approx(50 * 0.94 * gib, abs=1e-3)  # one NDR NIC per GPU
    # a 32 MiB message over one NIC's share: the same seconds in ASTRA-sim's units as in ours
    assert (32 << 20) / (config["bandwidth"][1] * 2**30) == pytest.approx(
        (32 << 20) / (50 * 0.94 * 1e9), rel=1e-5
    )
    # per link: ASTRA-sim's Switch route is two links, so each carries half the step latency
    assert config["latency"][:2] == [1700.0, 7000.0]
    spine = PRESETS["dgx-h100"].topology.spine_latency_us * 1000
    assert config["latency"][2] == pytest.approx((14000.0 + spine) / 2, abs=0.1)
    assert astra_network(PRESETS["dgx-h100"], 64)["npus_count"] == [8, 8]
    out = tmp_path / "net.yml"
    assert main(["export", "astra-network", "dgx-h100", "--world-size", "64", "--out", str(out)]) == 0
    text = out.read_text()
    assert "npus_count: [ 8, 8 ]" in text and "topology: [ Switch, Switch ]" in text
    assert main(["export", "astra-network", "dgx-h100", "--world-size", "12", "--out", str(out)]) == 2
    assert "--world-size 12 must fill whole nodes of 8 GPUs" in capsys.readouterr().err


def test_an_export_that_fails_half_way_leaves_no_folder_and_a_prefix_cannot_leave_out(tmp_path, monkeypatch):
    from prism_megatron.graph import chakra

    graph = layout_pipeline_graph(
        Layout(world_size=16, tp=2, pp=2),
        PipelineSpec(num_microbatches=2, fwd_ns=1_000_000, bwd_ns=2_000_000, activation_bytes=1 << 16),
    )
    save_graph(graph, str(tmp_path / "graph"))

    def half_way(expanded, directory, **kwargs):
        os.makedirs(directory)
        (open(os.path.join(directory, "chakra.0.et"), "wb")).close()
        raise OverflowError("a duration does not fit the trace's integer")

    monkeypatch.setattr(chakra, "export_chakra", half_way)
    assert main(["export", "chakra", str(tmp_path / "graph"), "--out", str(tmp_path / "et")]) == 1
    assert not (tmp_path / "et").exists()
    for prefix in ("../../escape", "a/b", "..", "x\ny"):
        assert main(["export", "chakra", str(tmp_path / "graph"), "--out", str(tmp_path / "et"),
                     "--prefix", prefix]) == 2  # fmt: skip
    assert sorted(os.listdir(tmp_path)) == ["graph"]
