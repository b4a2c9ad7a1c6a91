"""Every command refuses a bad input before it does any work: one line naming the flag or file and
what would be valid, exit status 2 (1 where `report --check` finds a report invalid or a run
unfinished), and nothing created on disk.

One table, one row per mistake, run in this process (`prism_megatron.cli.main`), so no row starts a
real process and the whole table takes seconds. Grow it with every new flag. The emulate rows use
the job of test_emulation.py; they need megatron-core, hence this tier.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil

import pytest

from prism_megatron import cli, launch
from prism_megatron.graph import save_graph
from prism_megatron.graph.schema import GraphMetadata
from prism_megatron.report import Failure, RunReport, TargetJob, write_report
from prism_megatron.sim import PipelineSpec, layout_pipeline_graph
from prism_megatron.topology import Layout

DATA = os.path.join(os.path.dirname(__file__), "..", "unit", "data", "nccl_tests")
JOB = (
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
    "--vocab-size", "1000", "--micro-batch-size", "1", "--global-batch-size", "16", "--train-iters", "2",
    "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
    "--prism-emulate", "--prism-world-size", "16", "--prism-device", "cpu", "--prism-ranks", "pp=0,1;tp=0;dp=0",
)  # fmt: skip
JOB_LAYOUT = Layout(world_size=16, tp=2, pp=2)
SPEC = PipelineSpec(num_microbatches=2, fwd_ns=1_000_000, bwd_ns=2_000_000, activation_bytes=1 << 16)
TOPOLOGY = ("topology", "--world-size", "64", "--tensor-model-parallel-size", "8")
CONFIG = os.path.join(os.path.dirname(__file__), "..", "..", "launch", "configs", "gpt-1.7b-48gpus.args")


def emulate(*flags: str, before: tuple[str, ...] = ()) -> tuple[str, ...]:
    """An emulate command line: the job, then `flags`; the run folder {w}/run unless flags name one."""
    out = () if "--prism-out" in flags else ("--prism-out", "{w}/run")
    return ("emulate", *before, "--", *JOB, *out, *flags)


# (id, argv with {d} = the data folder and {w} = the case's own folder, exit status, key words)
CASES = [
    # topology
    ("topology-not-divisible", ("topology", "--world-size", "7", "--tensor-model-parallel-size", "2"), 2,
     ["--world-size 7", "not divisible"]),
    ("topology-rank-outside", (*TOPOLOGY, "--ranks", "99"), 2, ["99", "outside"]),
    ("topology-no-such-stage", (*TOPOLOGY, "--ranks", "pp=3"), 2, ["pp=3"]),
    ("topology-size-not-a-number", ("topology", "--world-size", "x"), 2, ["--world-size", "invalid int"]),
    ("topology-no-world-size", ("topology",), 2, ["--world-size"]),
    ("topology-vpp-without-pp", (*TOPOLOGY, "--virtual-pipeline-model-parallel-size", "2"), 2,
     ["--pipeline-model-parallel-size > 1"]),
    ("topology-json-too-large", ("topology", "--world-size", "131072", "--tensor-model-parallel-size", "8",
                                 "--pipeline-model-parallel-size", "16", "--ranks", "all", "--json"), 2,
     ["--json would list", "Select fewer ranks", "drop --json"]),
    ("topology-unknown-kind-of-filter", (*TOPOLOGY, "--ranks", "xx=1"), 2, ["xx"]),
    # simulate
    ("simulate-no-graph", ("simulate", "{w}/nothing"), 2, ["no execution graph"]),
    ("simulate-damaged-graph", ("simulate", "{d}/damaged_graph"), 2, ["sha256"]),
    ("simulate-graph-not-json", ("simulate", "{d}/notjson_graph"), 2, ["not JSON"]),
    ("simulate-out-is-a-file", ("simulate", "{d}/graph", "--out", "{d}/afile"), 2, ["--out", "is a file"]),
    ("simulate-default-out-under-a-file", ("simulate", "{d}/graph", "--out", "{d}/afile/sim"), 2,
     ["--out", "afile is a file"]),
    ("simulate-straggler-twice", ("simulate", "{d}/graph", "--straggler", "5:1.5", "--straggler", "5:2"), 2,
     ["--straggler", "rank 5 is already given"]),
    ("simulate-straggler-form", ("simulate", "{d}/graph", "--straggler", "x"), 2, ["RANK:FACTOR"]),
    ("simulate-straggler-outside", ("simulate", "{d}/graph", "--straggler", "999:2"), 2,
     ["--straggler rank 999", "outside"]),
    ("simulate-slow-nic-zero", ("simulate", "{d}/graph", "--slow-nic", "1:0"), 2,
     ["--slow-nic", "from 0.001 to 1000"]),
    ("simulate-slow-nic-twice", ("simulate", "{d}/graph", "--slow-nic", "1:2", "--slow-nic", "1:3"), 2,
     ["--slow-nic", "already given"]),
    ("simulate-expert-outside", ("simulate", "{d}/graph", "--expert-imbalance", "9:2"), 2,
     ["--expert-imbalance EP rank 9"]),
    ("simulate-unknown-cluster", ("simulate", "{d}/graph", "--cluster", "dgx-h900"), 2,
     ["dgx-h900", "neither a preset"]),
    ("simulate-string-boolean", ("simulate", "{d}/graph", "--cluster", "{d}/nvls_string.yaml"), 2,
     ["intra_node.nvls", "true or false"]),
    ("simulate-real-ranks-outside", ("simulate", "{d}/graph", "--real-ranks", "99999"), 2, ["99999"]),
    # calibrate
    ("calibrate-no-log", ("calibrate", "{w}/missing.log", "--out", "{w}/c.yaml"), 2, ["is not a file"]),
    ("calibrate-out-folder-missing", ("calibrate", f"{DATA}/all_reduce_2nodes.log", "--out", "{w}/no/c.yaml"),
     2, ["--out", "does not exist"]),
    ("calibrate-out-is-a-folder", ("calibrate", f"{DATA}/all_reduce_2nodes.log", "--out", "{d}"), 2,
     ["--out", "is a directory"]),
    ("calibrate-unknown-base", ("calibrate", f"{DATA}/all_reduce_2nodes.log", "--out", "{w}/c.yaml",
                                "--base", "dgx-h900"), 2, ["dgx-h900"]),
    ("calibrate-fit-too-poor", ("calibrate", "{d}/falling.log", "--out", "{w}/c.yaml"), 2,
     ["exceeds the bound 25%", "--max-error", "no cluster written"]),
    ("calibrate-bound-not-positive", ("calibrate", f"{DATA}/all_reduce_2nodes.log", "--out", "{w}/c.yaml",
                                      "--max-error", "0"), 2, ["--max-error", "positive"]),
    ("calibrate-unknown-program", ("calibrate", f"{DATA}/gather_old_format.txt", "--out", "{w}/c.yaml"), 2,
     ["prefix the path with the program"]),
    # report
    ("report-no-folder", ("report", "{w}/nothing"), 2, ["is not a directory"]),
    ("report-no-report", ("report", "{d}"), 2, ["no run report"]),
    ("report-check-no-report", ("report", "{d}", "--check"), 2, ["no run report"]),
    ("report-check-damaged", ("report", "{d}/damaged_report", "--check"), 2, ["damaged run report"]),
    ("report-check-running", ("report", "{d}/running", "--check"), 1, ["not finished", "status running"]),
    ("report-check-interrupted", ("report", "{d}/interrupted", "--check"), 1,
     ["not finished", "status interrupted", "SIGTERM"]),
    ("report-check-invalid", ("report", "{d}/invalid", "--check"), 1, ["invalid"]),
    # plan (its strictness about unknown flags comes with the shared flag parser)
    ("plan-nothing", ("plan",), 2, ["give a configuration file"]),
    ("plan-no-such-config", ("plan", "{w}/nothing.args"), 2, ["is not a file"]),
    ("plan-json-folder-missing", ("plan", CONFIG, "--json", "/nonexistent/x.json"), 2,
     ["--json /nonexistent/x.json", "does not exist"]),
    ("plan-json-is-a-folder", ("plan", CONFIG, "--json", "{d}"), 2, ["--json", "is a directory"]),
    ("plan-rank-outside", ("plan", CONFIG, "--ranks", "999999"), 2, ["999999"]),
    ("plan-not-a-number", ("plan", CONFIG, "--num-layers", "abc"), 2, ["--num-layers", "invalid int value"]),
    ("plan-unknown-flag-typo", ("plan", CONFIG, "--tensor-model-parallel-sise", "4"), 2,
     ["--tensor-model-parallel-sise", "did you mean --tensor-model-parallel-size"]),
    ("plan-unknown-flag", ("plan", CONFIG, "--no-such-flag", "3"), 2, ["--no-such-flag"]),
    ("plan-query-groups", ("plan", CONFIG, "--num-attention-heads", "16", "--group-query-attention",
                           "--num-query-groups", "5"), 2, ["--num-query-groups"]),
    # compare
    ("compare-no-run", ("compare", "{w}/a", "{w}/b"), 2, ["is not a directory"]),
    ("compare-unfinished", ("compare", "{d}/running", "{d}/interrupted", "--out", "{w}/cmp"), 2,
     ["compare needs finished runs"]),
    ("compare-out-is-a-file", ("compare", "{d}/running", "{d}/interrupted", "--out", "{d}/afile"), 2,
     ["--out", "is a file"]),
    # export
    ("export-chakra-no-graph", ("export", "chakra", "{d}/empty", "--out", "{w}/et"), 2, ["holds neither"]),
    ("export-chakra-out-is-a-file", ("export", "chakra", "{d}/graph", "--out", "{d}/afile"), 2,
     ["--out", "is a file"]),
    ("export-chakra-bad-size", ("export", "chakra", "{d}/graph", "--out", "{w}/et", "--max-size", "big"), 2,
     ["--max-size", "500MB"]),
    ("export-network-unknown-cluster", ("export", "astra-network", "dgx-h900", "--world-size", "16",
                                        "--out", "{w}/n.yaml"), 2, ["dgx-h900"]),
    ("export-network-folder-missing", ("export", "astra-network", "dgx-h100", "--world-size", "16",
                                       "--out", "{w}/no/n.yaml"), 2, ["--out", "does not exist"]),
    ("export-network-unknown-key", ("export", "astra-network", "{d}/unknown_key.yaml", "--world-size", "16",
                                    "--out", "{w}/n.yaml"), 2, ["unknown key", "nvlnk_efficiency"]),
    # demo
    ("demo-out-is-a-file", ("demo", "--out", "{d}/afile"), 2, ["--prism-out", "is a file"]),
    # emulate: the command line
    ("emulate-no-flags", ("emulate",), 2, ["give the Megatron flags after --"]),
    ("emulate-nproc-zero", emulate(before=("--nproc-per-node", "0")), 2, ["--nproc-per-node must be >= 1"]),
    ("emulate-nproc-too-few", emulate(before=("--nproc-per-node", "1")), 2, ["--nproc-per-node 1", "fewer"]),
    ("emulate-no-such-stage", emulate("--prism-ranks", "pp=5"), 2, ["pp=5"]),
    ("emulate-moe-pattern-length", emulate("--num-experts", "4", "--moe-layer-freq", "([1]*3)"), 2,
     ["--moe-layer-freq lists 3 layers", "--num-layers is 4"]),
    ("emulate-global-batch", emulate("--global-batch-size", "6"), 2, ["--global-batch-size 6"]),
    ("emulate-layers-not-divisible", emulate("--num-layers", "3"), 2, ["--num-layers 3 must be divisible"]),
    ("emulate-layers-not-a-number", emulate("--num-layers", "abc"), 2, ["--num-layers", "invalid int value"]),
    ("emulate-unsupported-flag", emulate("--no-such-flag", "3"), 2, ["does not support --no-such-flag 3"]),
    ("emulate-megatron-refuses", emulate("--recompute-granularity", "full"), 2,
     ["megatron-core refuses these flags"]),
    ("emulate-no-world-size", ("emulate", "--", "--num-layers", "4", "--prism-emulate"), 2,
     ["--prism-emulate needs --prism-world-size"]),
    ("emulate-world-size-zero", emulate("--prism-world-size", "0"), 2, ["--prism-world-size must be >= 1"]),
    ("emulate-timeout-zero", emulate("--prism-timeout", "0"), 2, ["--prism-timeout", "positive"]),
    ("emulate-timeout-not-a-number", emulate("--prism-timeout", "abc"), 2, ["--prism-timeout", "invalid float"]),
    ("emulate-unknown-device", emulate("--prism-device", "tpu"), 2, ["--prism-device", "invalid choice"]),
    ("emulate-capture-iters-zero", emulate("--prism-capture-iters", "0"), 2, ["--prism-capture-iters must be >= 2"]),
    ("emulate-phase-without-graph", emulate("--prism-phase", "emulate"), 2, ["needs --prism-graph"]),
    ("emulate-report-only-without-out", ("emulate", "--report-only", "--", *JOB), 2,
     ["--report-only needs --prism-out"]),
    ("emulate-straggler-outside", emulate("--prism-straggler", "99:2"), 2, ["--prism-straggler rank 99"]),
    ("emulate-straggler-twice", emulate("--prism-straggler", "5:1.5", "--prism-straggler", "5:2"), 2,
     ["--prism-straggler rank 5 is given twice"]),
    ("emulate-straggler-twice-in-one", emulate("--prism-straggler", "5:1.5,5:2"), 2, ["rank 5 is given twice"]),
    ("emulate-straggler-form", emulate("--prism-straggler", "5"), 2, ["RANK:FACTOR"]),
    # emulate: what is checked before the first process
    ("emulate-unknown-cluster", emulate("--prism-cluster", "dgx-h900"), 2,
     ["--prism-cluster dgx-h900", "neither a preset"]),
    ("emulate-cluster-string-boolean", emulate("--prism-cluster", "{d}/nvls_string.yaml"), 2,
     ["--prism-cluster", "intra_node.nvls must be true or false"]),
    ("emulate-cluster-unknown-key", emulate("--prism-cluster", "{d}/unknown_key.yaml"), 2,
     ["--prism-cluster", "unknown key intra_node.nvlnk_efficiency"]),
    ("emulate-no-such-graph", emulate("--prism-graph", "{w}/no-such-graph"), 2, ["--prism-graph", "no such graph"]),
    ("emulate-damaged-graph", emulate("--prism-graph", "{d}/damaged_graph"), 2,
     ["--prism-graph", "does not match its sha256"]),
    ("emulate-foreign-graph", emulate("--prism-graph", "{d}/graph"), 2,
     ["captured for another job", "world_size 256 in the graph, 16 here", "tp 8 in the graph, 2 here"]),
    ("emulate-graph-of-another-model", emulate("--prism-graph", "{d}/other_model_graph"), 2,
     ["captured for another job", "num_layers 8 in the graph, 4 here"]),
    ("emulate-graph-folder-empty", emulate("--prism-graph", "{d}/empty"), 2, ["neither graph.json nor capture"]),
    ("emulate-no-such-script", emulate(before=("--script", "{w}/pretrain_gpt.py")), 2,
     ["--script", "is not a file"]),
    ("emulate-script-outside-megatron-lm", emulate(before=("--script", "{d}/train.py")), 2,
     ["--script", "megatron.training is not importable", "Megatron-LM checkout"]),
    ("emulate-out-is-a-file", emulate("--prism-out", "{d}/afile"), 2, ["--prism-out", "is a file"]),
    ("emulate-out-under-a-file", emulate("--prism-out", "{d}/afile/run"), 2, ["--prism-out", "is a file, so"]),
    ("emulate-out-holds-a-run", emulate("--prism-out", "{d}/running"), 2, ["--prism-overwrite"]),
    # issue 30: numbers checked for type, finiteness and range; paths kept where they are told
    ("topology-world-size-huge", ("topology", "--world-size", "2147483648"), 2,
     ["--world-size 2147483648", "largest supported world, 1048576"]),
    ("simulate-graph-world-huge", ("simulate", "{d}/graph_w31"), 2,
     ["graph.json: metadata.layout.world_size", "from 1 to 1048576", "2147483648"]),
    ("simulate-graph-tp-nan", ("simulate", "{d}/graph_tp_nan"), 2, ["metadata.layout.tp", "got nan"]),
    ("simulate-graph-tp-boolean", ("simulate", "{d}/graph_tp_bool"), 2, ["metadata.layout.tp", "got True"]),
    ("simulate-graph-duration-huge", ("simulate", "{d}/graph_long_op"), 2, ["longer than any op"]),
    ("simulate-graph-offset-huge", ("simulate", "{d}/graph_far_peer"), 2, ["offset +9999999999999999999", "out of range"]),
    ("simulate-straggler-huge", ("simulate", "{d}/graph", "--straggler", "1:1e308"), 2,
     ["--straggler '1:1e308'", "from 0.001 to 1000"]),
    ("simulate-slow-nic-huge", ("simulate", "{d}/graph", "--slow-nic", "1:1e308"), 2,
     ["--slow-nic '1:1e308'", "from 0.001 to 1000"]),
    ("simulate-slow-nic-int64", ("simulate", "{d}/graph", "--slow-nic", "1:1e12"), 2, ["--slow-nic '1:1e12'"]),
    ("simulate-cluster-infinite-oversubscription", ("simulate", "{d}/graph", "--cluster", "{d}/inf_oversub.yaml"),
     2, ["inf_oversub.yaml: topology.oversubscription", "got inf"]),
    ("simulate-cluster-infinite-latency", ("simulate", "{d}/graph", "--cluster", "{d}/inf_spine.yaml"), 2,
     ["inf_spine.yaml: topology.spine_latency_us", "got inf"]),
    ("simulate-cluster-huge-integer", ("simulate", "{d}/graph", "--cluster", "{d}/huge_int.yaml"), 2,
     ["huge_int.yaml: cluster.base_latency_us", "..."]),
    ("simulate-cluster-boolean", ("simulate", "{d}/graph", "--cluster", "{d}/bool_count.yaml"), 2,
     ["bool_count.yaml: network.nics_per_node", "got True"]),
    ("simulate-cluster-not-utf8", ("simulate", "{d}/graph", "--cluster", "{d}/latin1.yaml"), 2,
     ["latin1.yaml: not a readable cluster file", "not UTF-8"]),
    ("simulate-cluster-nested-deep", ("simulate", "{d}/graph", "--cluster", "{d}/deep.yaml"), 2,
     ["deep.yaml: not a readable cluster file", "nested too deeply"]),
    ("simulate-costs-boolean", ("simulate", "{d}/graph", "--cluster", "{d}/costs_bool.json"), 2,
     ["costs_bool.json: costs_us.SEND/2", "not true/false", "[True, 5]"]),
    ("simulate-costs-huge", ("simulate", "{d}/graph", "--cluster", "{d}/costs_huge.json"), 2,
     ["costs_huge.json: costs_us.SEND/2", "bytes 0..1125899906842624"]),
    ("calibrate-nan-time", ("calibrate", "{d}/nan_row.log", "--out", "{w}/c.yaml"), 2,
     ["nan_row.log:14", "time > 0", "nan"]),
    ("calibrate-json-boolean-size", ("calibrate", "{d}/bool_size.json", "--out", "{w}/c.yaml"), 2,
     ["bool_size.json: results[0]", "integer 'size'", "got True"]),
    ("report-check-world-huge", ("report", "{d}/report_w31", "--check"), 1,
     ["report_w31/report.json: invalid (1 problem(s))"]),
    ("report-check-nested-deep", ("report", "{d}/report_deep", "--check"), 2,
     ["damaged run report", "nested too deeply"]),
    ("report-check-artefact-missing", ("report", "{d}/report_without_md", "--check"), 1,
     ["not finished", "report.md missing"]),
    ("export-network-infinite-cluster", ("export", "astra-network", "{d}/inf_oversub.yaml", "--world-size", "16",
                                         "--out", "{w}/n.yaml"), 2, ["topology.oversubscription", "got inf"]),
    ("export-network-world-huge", ("export", "astra-network", "dgx-h100", "--world-size", "2147483648",
                                   "--out", "{w}/n.yaml"), 2, ["--world-size must be from 1 to 1048576"]),
    ("export-chakra-prefix-escapes", ("export", "chakra", "{d}/graph", "--out", "{w}/et", "--prefix",
                                      "../../escape"), 2, ["--prefix '../../escape'", "inside --out"]),
    ("export-chakra-max-size-infinite", ("export", "chakra", "{d}/graph", "--out", "{w}/et", "--max-size",
                                         "1e400"), 2, ["--max-size '1e400'"]),
    ("export-chakra-duration-huge", ("export", "chakra", "{d}/graph_long_op", "--out", "{w}/et"), 2,
     ["longer than any op"]),
    ("emulate-world-size-huge", emulate("--prism-world-size", "2147483648"), 2,
     ["--prism-world-size 2147483648", "largest supported world"]),
    ("emulate-cpu-threads-huge", emulate("--prism-cpu-threads-per-rank", "100000"), 2,
     ["--prism-cpu-threads-per-rank must be from 1 to 1024, got 100000"]),
    ("emulate-straggler-zero", emulate("--prism-straggler", "1:0"), 2,
     ["--prism-straggler '1:0'", "the factor must be a number from 0.001 to 1000", "got 0"]),
    ("emulate-straggler-huge", emulate("--prism-straggler", "1:1e308"), 2, ["--prism-straggler '1:1e308'"]),
    ("emulate-train-iters-one", emulate("--train-iters", "1"), 2,
     ["--train-iters 1 leaves no iteration to measure", "at least 2"]),
    ("emulate-capture-iters-one", emulate("--prism-capture-iters", "1"), 2,
     ["--prism-capture-iters must be >= 2", "warm-up"]),
    ("emulate-cluster-infinite", emulate("--prism-cluster", "{d}/inf_oversub.yaml"), 2,
     ["--prism-cluster", "topology.oversubscription", "got inf"]),
    ("emulate-graph-world-huge", emulate("--prism-graph", "{d}/graph_w31"), 2,
     ["--prism-graph", "metadata.layout.world_size", "1048576"]),
    ("emulate-overwrite-user-files", emulate("--prism-out", "{d}/user_files", "--prism-overwrite"), 2,
     ["--prism-out", "no run of ours", "--prism-overwrite replaces only a prism run folder"]),
    ("emulate-overwrite-linked-folder", emulate("--prism-out", "{d}/linked_run", "--prism-overwrite"), 2,
     ["--prism-out", "is a symbolic link"]),
    # the entry every real process runs
    ("launch-no-such-script", ("launch", "{w}/pretrain_gpt.py", "--num-layers", "2"), 2, ["is not a file"]),
    ("launch-script-outside-megatron-lm", ("launch", "{d}/train.py", "--num-layers", "2"), 2,
     ["SCRIPT", "megatron.training is not importable"]),
]  # fmt: skip


MULTI_LINE = {"report-check-invalid", "report-check-world-huge"}
"""Rows whose refusal goes on to list each problem on a line of its own (the first line says it)."""


def _report(out: str, status: str, failure: Failure | None = None) -> None:
    write_report(
        RunReport(
            target=TargetJob.from_layout(JOB_LAYOUT, micro_batch_size=1, global_batch_size=16, seq_length=32),
            real_ranks=(0, 8),
            status=status,
            failure=failure,
            prism={"cluster": {"cluster": "default"}},
        ),
        out,
    )


@pytest.fixture(scope="module")
def data(tmp_path_factory) -> str:
    """The inputs the rows refer to ({d}): graphs, cluster files, logs, run folders, a plain file."""
    d = str(tmp_path_factory.mktemp("bad-inputs"))
    graph = layout_pipeline_graph(Layout(world_size=256, tp=8, pp=4), SPEC)
    save_graph(graph, os.path.join(d, "graph"))
    shutil.copytree(os.path.join(d, "graph"), os.path.join(d, "damaged_graph"))
    path = os.path.join(d, "damaged_graph", "graph.json")
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    doc["metadata"]["source"] = "edited by hand"
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)
    os.makedirs(os.path.join(d, "notjson_graph"))
    with open(os.path.join(d, "notjson_graph", "graph.json"), "w", encoding="utf-8") as f:
        f.write("{")
    job_graph = layout_pipeline_graph(JOB_LAYOUT, SPEC)
    metadata = GraphMetadata(layout=JOB_LAYOUT.kwargs(), source="capture", extra={"num_layers": 8})
    save_graph(dataclasses.replace(job_graph, metadata=metadata), os.path.join(d, "other_model_graph"))
    os.makedirs(os.path.join(d, "empty"))
    for name, change in (("graph_w31", {"world_size": 2**31}), ("graph_tp_nan", {"tp": float("nan")}),
                         ("graph_tp_bool", {"tp": True})):  # fmt: skip
        metadata = GraphMetadata(layout={**JOB_LAYOUT.kwargs(), **change}, source="edited")
        save_graph(dataclasses.replace(job_graph, metadata=metadata), os.path.join(d, name))
    # an op of 10^9 s (past the 10^6 s any op may); a pipeline offset past any world
    _edited_op_graph(
        job_graph, os.path.join(d, "graph_long_op"), "c:", lambda w: [w[0], "1000000000s", *w[2:]]
    )
    _edited_op_graph(job_graph, os.path.join(d, "graph_far_peer"), "R",
                     lambda w: [w[0].replace("+1#", "+99999999999999999999#"), *w[1:]])  # fmt: skip
    files = {
        "afile": "not a folder\n",
        "nvls_string.yaml": 'base: dgx-h100\nintra_node:\n  nvls: "false"\n',
        "unknown_key.yaml": "base: dgx-h100\nintra_node:\n  nvlnk_efficiency: 0.8\n",
        "train.py": "print('a training script outside any Megatron-LM checkout')\n",
        "falling.log": _falling_log(),
        "inf_oversub.yaml": "base: dgx-h100\ntopology:\n  oversubscription: .inf\n",
        "inf_spine.yaml": "base: dgx-h100\ntopology:\n  spine_latency_us: .inf\n",
        "huge_int.yaml": "base: dgx-h100\nbase_latency_us: 1" + "0" * 400 + "\n",
        "bool_count.yaml": "base: dgx-h100\nnetwork:\n  nics_per_node: true\n",
        "deep.yaml": "base: " + "[" * 100_000 + "\n",
        "costs_bool.json": json.dumps(
            {"kind": "measured", "schema_version": 1, "costs_us": {"SEND/2": [[True, 5]]}}
        ),
        "costs_huge.json": '{"kind": "measured", "schema_version": 1, "costs_us": {"SEND/2": [[1'
        + "0" * 400
        + ", 1]]}}",
        "nan_row.log": _nan_log(),
        "bool_size.json": _bool_size_json(),
    }
    for name, text in files.items():
        with open(os.path.join(d, name), "w", encoding="utf-8") as f:
            f.write(text)
    with open(os.path.join(d, "latin1.yaml"), "wb") as f:
        f.write("base: dgx-h100\nname: Grüße\n".encode("latin-1"))
    os.makedirs(os.path.join(d, "user_files", "logs"))  # a user's folder, named as a run's entries are
    for name in ("logs/train.log", "notes.md"):
        with open(os.path.join(d, "user_files", name), "w", encoding="utf-8") as f:
            f.write("mine\n")
    _report(os.path.join(d, "running"), "running")
    _report(
        os.path.join(d, "interrupted"),
        "interrupted",
        Failure(message="interrupted by SIGTERM during emulate"),
    )
    os.makedirs(os.path.join(d, "damaged_report"))
    with open(os.path.join(d, "damaged_report", "report.json"), "w", encoding="utf-8") as f:
        f.write("{")
    shutil.copytree(os.path.join(d, "running"), os.path.join(d, "invalid"))
    _report(os.path.join(d, "finished"), "failed", Failure(message="a rank died"))
    os.symlink(os.path.join(d, "finished"), os.path.join(d, "linked_run"))
    shutil.copytree(os.path.join(d, "finished"), os.path.join(d, "report_without_md"))
    os.remove(os.path.join(d, "report_without_md", "report.md"))
    shutil.copytree(os.path.join(d, "finished"), os.path.join(d, "report_w31"))
    _edit_json(
        os.path.join(d, "report_w31", "report.json"), lambda doc: doc["target"].update(world_size=2**31)
    )
    os.makedirs(os.path.join(d, "report_deep"))
    with open(os.path.join(d, "report_deep", "report.json"), "w", encoding="utf-8") as f:
        f.write("[" * 100_000)
    with open(os.path.join(d, "invalid", "report.json"), "w", encoding="utf-8") as f:
        json.dump({"schema_version": 1, "status": "ok"}, f)
    return d


def _edit_json(path: str, edit) -> None:
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    edit(doc)
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)


def _edited_op_graph(graph, directory: str, kind: str, edit) -> None:
    """A graph whose first op starting with `kind` is `edit`ed (its words), its sha256 made right."""
    from prism_megatron.graph.io import _digest

    save_graph(graph, directory)
    path = os.path.join(directory, "graph.json")
    with open(path, encoding="utf-8") as f:
        doc = json.load(f)
    ops = doc["roles"][0]["streams"][0][1]
    first = next(i for i, op in enumerate(ops) if op.startswith(kind))
    ops[first] = " ".join(edit(ops[first].split()))
    doc["sha256"] = _digest({"metadata": doc["metadata"], "roles": doc["roles"]})
    with open(path, "w", encoding="utf-8") as f:
        json.dump(doc, f)


def _nan_log() -> str:
    """all_reduce_2nodes.log with one time (line 14, the first row's out-of-place time) nan."""
    with open(os.path.join(DATA, "all_reduce_2nodes.log"), encoding="utf-8") as f:
        text = f.read()
    assert "    20.00    0.05" in text
    return text.replace("    20.00    0.05", "      nan    0.05")


def _bool_size_json() -> str:
    """all_reduce_2nodes.json with its first result's size `true`."""
    with open(os.path.join(DATA, "all_reduce_2nodes.json"), encoding="utf-8") as f:
        doc = json.load(f)
    doc["results"][0]["size"] = True
    return json.dumps(doc)


def _falling_log() -> str:
    """all_reduce_2nodes.log with times that fall as sizes grow (no cost model fits that)."""
    with open(os.path.join(DATA, "all_reduce_2nodes.log"), encoding="utf-8") as f:
        text = f.read()
    for slow, fast in (("    20.00    0.05", "  9000.00    0.05"), ("    22.00    0.05", "  9000.00    0.05"),
                       ("   100.00   10.49", "     1.00   10.49"), ("   102.00   10.28", "     1.00   10.28")):  # fmt: skip
        assert slow in text
        text = text.replace(slow, fast)
    return text


def _tree(root: str) -> set[str]:
    return {
        os.path.relpath(os.path.join(top, name), root)
        for top, dirs, names in os.walk(root)
        for name in dirs + names
    }


def _run(argv: list[str]) -> int:
    if argv[0] == "launch":
        return launch.main(argv[1:])
    try:
        return cli.main(argv)
    except SystemExit as exc:  # argparse's own errors
        return exc.code


def test_the_table_covers_every_command_and_has_at_least_60_rows():
    commands = {argv[0] for _, argv, _, _ in CASES}
    assert commands >= {"topology", "simulate", "calibrate", "report", "plan", "compare", "export", "demo",
                        "emulate", "launch"}  # fmt: skip
    assert len(CASES) >= 60 and len({name for name, *_ in CASES}) == len(CASES)


@pytest.mark.parametrize("name, argv, status, words", CASES, ids=[case[0] for case in CASES])
def test_a_bad_input_is_one_line_naming_it_and_nothing_is_created(
    name, argv, status, words, data, tmp_path, monkeypatch, capsys
):
    work = tmp_path / "work"
    work.mkdir()
    monkeypatch.chdir(work)  # a default output folder (prism-out/, ...) would appear here
    monkeypatch.setenv("PYTHONWARNINGS", "ignore")
    before = (_tree(data), _tree(str(work)))
    argv = [word.replace("{d}", data).replace("{w}", str(work)) for word in argv]
    assert _run(argv) == status
    err = capsys.readouterr().err.strip()
    lines = [line for line in err.splitlines() if "warn" not in line.lower()]
    assert len(lines) == 1 or (name in MULTI_LINE and len(lines) > 1), (
        f"{name}: one line expected, got:\n{err}"
    )
    for word in words:
        assert word in lines[0], f"{name}: {word!r} not in {lines[0]!r}"
    assert (_tree(data), _tree(str(work))) == before, f"{name}: something was created"
