"""Reading nccl-tests stdout: current and older layouts, mpirun tags, and errors that name file:line."""

from __future__ import annotations

import os

import pytest

from prism_megatron.network import PRESETS, CostModel
from prism_megatron.network.nccl_tests import (
    format_nccl_tests,
    op_from_name,
    parse_nccl_tests,
    read_nccl_tests,
)
from prism_megatron.replay.schedule import OpKind

DATA = os.path.join(os.path.dirname(__file__), "data", "nccl_tests")


def fixture(name: str) -> str:
    return os.path.join(DATA, name)


def test_a_two_node_all_reduce_log_gives_ranks_hosts_and_mean_times():
    (run,) = read_nccl_tests(fixture("all_reduce_2nodes.log"))
    assert run.op == "all_reduce" and run.kind == OpKind.ALL_REDUCE
    assert run.placement == ((0, 0), (0, 1), (1, 0), (1, 1))
    assert (run.num_ranks, run.num_nodes) == (4, 2)
    assert [row.size_bytes for row in run.rows] == [1024, 32768, 1048576]
    # the mean of the out-of-place and in-place times
    assert [row.time_us for row in run.rows] == [21.0, 30.0, 101.0]
    assert run.rows[0].line_number == 14


def test_an_older_log_without_group_root_or_program_line_parses_when_the_op_is_named():
    with pytest.raises(ValueError, match=r"gather_old_format.txt:10: cannot tell which nccl-tests program"):
        read_nccl_tests(fixture("gather_old_format.txt"))
    (run,) = read_nccl_tests(fixture("gather_old_format.txt"), op="all_gather")
    assert run.placement == ((0, 0), (0, 1))
    assert [(row.size_bytes, row.time_us) for row in run.rows] == [(8, 11.0), (128, 11.0)]


def test_mpirun_tags_are_stripped_and_missing_wrong_counts_are_fine():
    (run,) = read_nccl_tests(fixture("mpirun_tagged.log"))
    assert run.op == "sendrecv"
    assert run.placement == ((0, 3), (1, 3))  # device 3 on two hosts
    assert [row.time_us for row in run.rows] == [25.0, 26.0]


def test_a_damaged_row_names_the_file_and_the_line():
    with pytest.raises(ValueError, match=r"broken_row.log:6: unreadable result row"):
        read_nccl_tests(fixture("broken_row.log"))


def test_rank_lines_are_required():
    text = "# Collective test starting: all_reduce_perf\n#  size count type redop root time\n 8 2 float sum -1 5.0\n"
    with pytest.raises(ValueError, match=r"x.log:3: the '#  Rank r .* lines of ranks 0..n-1 are missing"):
        parse_nccl_tests(text, source="x.log")


def test_op_names_come_from_programs_and_file_names():
    assert op_from_name("all_reduce_perf_mpi") == "all_reduce"
    assert op_from_name("/logs/64n-reduce_scatter.txt") == "reduce_scatter"
    assert op_from_name("reduce_perf") == "reduce"
    assert op_from_name("run3.log") is None
    with pytest.raises(ValueError, match="op 'allreduce' is not an nccl-tests program"):
        parse_nccl_tests("", source="x", op="allreduce")


def test_written_logs_read_back_and_carry_nccl_tests_bandwidths():
    model = CostModel(PRESETS["dgx-h100"])
    sizes = [8, 1 << 20, 1 << 30]
    rows = [(size, model.nccl_tests_time_ns(OpKind.ALL_GATHER, 16, size) / 1e3) for size in sizes]
    text = format_nccl_tests("all_gather", [f"n{r // 8}" for r in range(16)], rows)
    (run,) = parse_nccl_tests(text, source="synthetic.log")
    assert run.op == "all_gather" and run.num_nodes == 2
    for (size, time_us), row in zip(rows, run.rows, strict=True):
        assert row.size_bytes == size
        assert row.time_us == pytest.approx(time_us, rel=1e-3)  # printed with nccl-tests' 2 decimals
    busbw = float(text.splitlines()[-4].split()[7])  # the busbw column of the last row
    assert busbw == pytest.approx(model.bus_bandwidth_gb_per_s(OpKind.ALL_GATHER, 16, 1 << 30), rel=1e-3)


def test_several_runs_in_one_file_are_kept_apart():
    model = CostModel(PRESETS["dgx-a100"])
    hosts = ["h0"] * 8
    text = "".join(
        format_nccl_tests(op, hosts, [(1 << 20, model.nccl_tests_time_ns(kind, 8, 1 << 20) / 1e3)])
        for op, kind in (("all_reduce", OpKind.ALL_REDUCE), ("alltoall", OpKind.ALL_TO_ALL))
    )
    runs = parse_nccl_tests(text, source="both.log")
    assert [run.op for run in runs] == ["all_reduce", "alltoall"]


def test_the_json_of_dash_j_reads_as_the_same_run_as_its_stdout():
    """all_reduce_2nodes.json is the -J document of all_reduce_2nodes.log, laid out as nccl-tests'
    src/util.cu writes it (JSON file version 3: args, config.devices, results[].out_of_place ...)."""
    (text_run,) = read_nccl_tests(fixture("all_reduce_2nodes.log"))
    (json_run,) = read_nccl_tests(fixture("all_reduce_2nodes.json"))
    assert json_run.op == "all_reduce"  # from args[0], ./build/all_reduce_perf
    assert json_run.placement == text_run.placement
    assert [(r.size_bytes, r.time_us) for r in json_run.rows] == [
        (r.size_bytes, r.time_us) for r in text_run.rows
    ]


def test_json_with_several_gpus_per_process_and_bad_documents(tmp_path):
    import json

    with open(fixture("all_reduce_2nodes.json"), encoding="utf-8") as f:
        doc = json.load(f)
    # -g 2: one device entry per process, its first rank; the process's ranks follow on its next GPUs
    doc["config"]["ngpus"] = 2
    doc["config"]["devices"] = [
        {"rank": 0, "hostname": "a", "device": 0},
        {"rank": 2, "hostname": "b", "device": 0},
    ]
    path = tmp_path / "ag.json"
    path.write_text(json.dumps(doc))
    (run,) = read_nccl_tests(str(path))
    assert run.placement == ((0, 0), (0, 1), (1, 0), (1, 1))
    doc["results"][1]["out_of_place"] = None
    doc["results"][1]["in_place"]["time"] = -1
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match=r"ag.json: results\[1\].in_place: needs a time > 0"):
        read_nccl_tests(str(path))
    doc["args"] = ["./mystery"]
    path.write_text(json.dumps(doc))
    with pytest.raises(ValueError, match="cannot tell which nccl-tests program"):
        read_nccl_tests(str(path))
    path.write_text("{not json")
    with pytest.raises(ValueError, match=r"looks like nccl-tests JSON \(-J\) but is not JSON"):
        read_nccl_tests(str(path))
