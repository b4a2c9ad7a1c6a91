"""Our Chakra traces as Chakra's own code reads them: its schema and the types its C++ feeder reads.

Needs a checkout of mlcommons/chakra (CHAKRA_DIR=path; skipped without it) and grpcio-tools (the
test extra) to compile Chakra's schema/protobuf/et_def.proto. Nothing of Chakra's is committed here:
the tests read its files where the checkout is.

- The feeder (src/feeder/et_feeder_node.cpp) reads each attribute it knows from one typed field of
  AttributeProto (`attr.int32_val()` ...); a value written to another field reads as 0 there. The
  table our export follows (FEEDER_TYPES) is compared with the feeder's source itself.
- Every trace of a 16-NPU export decodes with Chakra's generated module, re-encodes byte for byte,
  has no dependency on a node it lacks, and reads back (with the feeder's types) as sends that each
  have their receive and collectives whose members agree on type and size, op by op.
"""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import textwrap

import pytest

from prism_megatron.graph import ExpandedGraph
from prism_megatron.graph.chakra import export_chakra
from prism_megatron.graph.chakra.export import FEEDER_TYPES
from prism_megatron.graph.world import LayoutWorld
from prism_megatron.sim import PipelineSpec, layout_pipeline_graph
from prism_megatron.topology import Layout

CHAKRA_DIR = os.environ.get("CHAKRA_DIR")
pytestmark = pytest.mark.skipif(
    not CHAKRA_DIR, reason="set CHAKRA_DIR to a checkout of mlcommons/chakra to read our traces with it"
)
# 16 NPUs, TP2 PP2 DP4; reduce-scatter and all-gather over DP (the distributed optimizer's)
LAYOUT = Layout(world_size=16, tp=2, pp=2)
SPEC = PipelineSpec(
    num_microbatches=4,
    fwd_ns=1500,
    bwd_ns=2600,
    activation_bytes=1 << 16,
    tp_allreduce_bytes=1 << 16,
    tp_allreduces_per_chunk=2,
    dp_grad_bytes=1 << 20,
)


def feeder_types(chakra_dir: str) -> dict[str, str]:
    """attribute name -> the AttributeProto field et_feeder_node.cpp reads it from."""
    path = os.path.join(chakra_dir, "src", "feeder", "et_feeder_node.cpp")
    with open(path, encoding="utf-8") as f:
        text = f.read()
    found = dict(re.findall(r'attr_name == "(\w+)"\)\s*\{[^}]*?attr\.(\w+)\(\)', text))
    assert found, f"{path}: no attribute reads found; has the feeder changed?"
    return found


def test_we_write_every_attribute_in_the_field_chakras_feeder_reads():
    read = feeder_types(CHAKRA_DIR)
    assert {"comm_src", "comm_dst", "comm_tag", "comm_size", "comm_type", "is_cpu_op"} <= set(read)
    assert {name: read[name] for name in FEEDER_TYPES if name in read} == {
        name: field for name, field in FEEDER_TYPES.items() if name in read
    }
    assert set(FEEDER_TYPES) - set(read) == {"pg_name"} or read.get("pg_name") == "string_val"


READER = textwrap.dedent(
    """
    import json, sys
    sys.path.insert(0, sys.argv[1])
    import et_def_pb2 as chakra  # Chakra's own schema, compiled from its checkout

    def messages(path):
        data, at = open(path, "rb").read(), 0
        while at < len(data):
            length, shift = 0, 0
            while True:
                byte = data[at]; at += 1
                length |= (byte & 0x7F) << shift; shift += 7
                if not byte & 0x80:
                    break
            yield data[at:at + length]
            at += length

    types = json.loads(sys.argv[3])
    out = {"nodes": 0, "identical": True, "dangling": [], "sends": [], "recvs": [], "colls": {}}
    for npu in range(int(sys.argv[4])):
        path = f"{sys.argv[2]}/chakra.{npu}.et"
        framed = list(messages(path))
        meta = chakra.GlobalMetadata.FromString(framed[0])
        nodes = [chakra.Node.FromString(payload) for payload in framed[1:]]
        again = meta.SerializeToString() == framed[0]
        again &= all(n.SerializeToString() == p for n, p in zip(nodes, framed[1:]))
        out["identical"] &= again
        ids = {n.id for n in nodes}
        out["nodes"] += len(nodes)
        for n in nodes:
            out["dangling"] += [[npu, n.id, d] for d in [*n.ctrl_deps, *n.data_deps] if d not in ids]
            a = {x.name: getattr(x, types[x.name]) for x in n.attr if x.name in types}
            if n.type == chakra.COMM_SEND_NODE:
                out["sends"].append([a["comm_src"], a["comm_dst"], a["comm_tag"], a["comm_size"], npu])
            elif n.type == chakra.COMM_RECV_NODE:
                out["recvs"].append([a["comm_src"], a["comm_dst"], a["comm_tag"], a["comm_size"], npu])
            elif n.type == chakra.COMM_COLL_NODE:
                key = f"{a['pg_name']}/{npu}"
                out["colls"].setdefault(key, []).append([a["comm_type"], a["comm_size"]])
    print(json.dumps(out))
    """
)


@pytest.fixture(scope="module")
def read_back(tmp_path_factory):
    pytest.importorskip("grpc_tools")
    from grpc_tools import protoc

    schema = os.path.join(CHAKRA_DIR, "schema", "protobuf")
    generated = tmp_path_factory.mktemp("chakra_schema")
    assert protoc.main(["protoc", f"-I{schema}", f"--python_out={generated}", "et_def.proto"]) == 0
    traces = tmp_path_factory.mktemp("traces")
    expanded = ExpandedGraph(layout_pipeline_graph(LAYOUT, SPEC), LayoutWorld(LAYOUT))
    export_chakra(expanded, str(traces), all_ranks=True)
    with open(traces / "comm_groups.json", encoding="utf-8") as f:
        groups = json.load(f)
    done = subprocess.run(
        [
            sys.executable,
            "-c",
            READER,
            str(generated),
            str(traces),
            json.dumps(feeder_types(CHAKRA_DIR)),
            "16",
        ],
        capture_output=True,
        text=True,
        timeout=300,
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return json.loads(done.stdout), groups, expanded


def test_every_trace_decodes_with_chakras_schema_byte_for_byte(read_back):
    out, _, expanded = read_back
    assert out["nodes"] == sum(len(ops) for r in range(16) for ops in expanded.streams(r).values())
    assert out["identical"] and out["dangling"] == []


def test_as_the_feeder_reads_them_every_send_has_its_receive(read_back):
    out, _, _ = read_back
    sends = sorted(tuple(s[:4]) for s in out["sends"])
    assert sends and sends == sorted(tuple(r[:4]) for r in out["recvs"])
    assert all(src == npu for src, _, _, _, npu in out["sends"])
    assert all(dst == npu for _, dst, _, _, npu in out["recvs"])
    assert len({(src, dst) for src, dst, _, _ in sends}) > 1  # not every send read as 0 -> 0


def test_as_the_feeder_reads_them_each_groups_members_run_the_same_collectives(read_back):
    out, groups, _ = read_back
    for group_id, members in groups.items():
        sequences = [out["colls"].get(f"{group_id}/{npu}") for npu in members]
        assert sequences[0] and all(s == sequences[0] for s in sequences), group_id
    # the distributed optimizer's all-gather: each rank's quarter of the DP buffer
    all_gathers = {size for seq in out["colls"].values() for kind, size in seq if kind == 2}
    assert all_gathers == {SPEC.dp_grad_bytes // 4}


# ---- Chakra's C++ feeder itself ------------------------------------------------------------------

BUILD_FEEDER = os.path.join(
    os.path.dirname(__file__), "..", "..", "benchmarks", "astra", "build_feeder_dump.sh"
)


@pytest.fixture(scope="module")
def feeder_dump(tmp_path_factory):
    """benchmarks/astra/feeder_dump built against the checkout's feeder (CHAKRA_FEEDER_DUMP: a built one)."""
    built = os.environ.get("CHAKRA_FEEDER_DUMP")
    if built:
        return built
    import shutil

    if not (shutil.which("protoc") and shutil.which("g++")):
        pytest.skip("building Chakra's feeder needs protoc, libprotobuf and g++ (or set CHAKRA_FEEDER_DUMP)")
    out = tmp_path_factory.mktemp("feeder")
    done = subprocess.run(
        ["sh", BUILD_FEEDER, CHAKRA_DIR, str(out)], capture_output=True, text=True, timeout=1800
    )
    assert done.returncode == 0, done.stderr[-3000:]
    return str(out / "feeder_dump")


@pytest.mark.slow
def test_chakras_feeder_issues_every_node_and_reads_our_attributes(feeder_dump, tmp_path):
    """The feeder runs each trace to its end (every dependency resolves) and reads what we meant:
    p2p ranks and tags, per-rank all-gather sizes, durations, and only collectives ASTRA-sim runs."""
    from prism_megatron.graph.chakra.stream import read_trace

    expanded = ExpandedGraph(layout_pipeline_graph(LAYOUT, SPEC), LayoutWorld(LAYOUT))
    export_chakra(expanded, str(tmp_path), all_ranks=True)
    sends, recvs, kinds = [], [], set()
    for npu in range(16):
        path = str(tmp_path / f"chakra.{npu}.et")
        done = subprocess.run([feeder_dump, path], capture_output=True, text=True, timeout=300)
        assert done.returncode == 0, done.stderr[-2000:]
        seen = [json.loads(line) for line in done.stdout.splitlines()]
        _, nodes = read_trace(path)
        assert sorted(n["id"] for n in seen) == [n.id for n in nodes]  # every node issued, once
        written = {n.id: n for n in nodes}
        for node in seen:
            assert node["runtime_us"] == written[node["id"]].duration_micros and node["is_cpu_op"] == 0
            if node["type"] == 5:
                sends.append((node["comm_src"], node["comm_dst"], node["comm_tag"], node["comm_size"]))
                assert node["comm_src"] == npu
            elif node["type"] == 6:
                recvs.append((node["comm_src"], node["comm_dst"], node["comm_tag"], node["comm_size"]))
                assert node["comm_dst"] == npu
            elif node["type"] == 7:
                kinds.add(node["comm_type"])
                if node["comm_type"] == 2:  # ALL_GATHER over DP4: one rank's quarter
                    assert node["comm_size"] == SPEC.dp_grad_bytes // 4
    assert sends and sorted(sends) == sorted(recvs)
    assert kinds == {0, 2, 7}  # ALL_REDUCE, ALL_GATHER, REDUCE_SCATTER
