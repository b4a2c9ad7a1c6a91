"""Calibration recovers the parameters that generated synthetic nccl-tests logs, and the command
writes a cluster file that the emulator can load."""

from __future__ import annotations

import dataclasses
import os

import numpy as np
import pytest

from prism_megatron import cli
from prism_megatron.network import PRESETS, CostModel, load_cluster
from prism_megatron.network.calibration import calibrate
from prism_megatron.network.nccl_tests import OPS, format_nccl_tests, parse_nccl_tests
from prism_megatron.network.parameters import FITTED_PARAMETERS, parameters_of

BASE = PRESETS["dgx-h100"]
# The "measured" cluster: every fitted parameter differs from the base by 15-50 %.
TRUTH = BASE.replace(
    name="truth",
    base_latency_us=9.0,
    intra_node=dataclasses.replace(
        BASE.intra_node, nvlink_efficiency=0.7, step_latency_us=2.5, nvls_efficiency=0.6, nvls_latency_us=30.0
    ),
    network=dataclasses.replace(BASE.network, nic_efficiency=0.8, step_latency_us=10.0),
)
SIZES = [2**k for k in range(3, 34)]  # 8 B .. 8 GiB, as all_reduce_perf -b 8 -e 8G -f 2
LAYOUTS = ((1, 8), (1, 4), (2, 8), (4, 8), (2, 1))  # (nodes, GPUs per node)


def synthetic_logs(truth, ops=("all_reduce", "all_gather", "sendrecv"), noise=0.0, seed=0) -> dict[str, str]:
    """nccl-tests stdout that ``truth`` predicts, optionally with multiplicative noise."""
    model, rng = CostModel(truth), np.random.default_rng(seed)
    logs = {}
    for op in ops:
        for nodes, per_node in LAYOUTS:
            n = nodes * per_node
            rows = []
            for size in SIZES:
                time_us = model.nccl_tests_time_ns(OPS[op], n, size, per_node) / 1e3
                rows.append((size, time_us * (1 + noise * rng.standard_normal())))
            hosts = [f"node{rank // per_node:03d}" for rank in range(n)]
            logs[f"{op}_{nodes}x{per_node}.log"] = format_nccl_tests(op, hosts, rows)
    return logs


def parsed(logs: dict[str, str]):
    return [run for name, text in logs.items() for run in parse_nccl_tests(text, source=name)]


def test_calibration_recovers_the_parameters_of_noise_free_logs():
    result = calibrate(BASE, parsed(synthetic_logs(TRUTH)), name="fit")
    truth, fitted = parameters_of(TRUTH), parameters_of(result.spec)
    assert set(result.fitted) == set(FITTED_PARAMETERS)
    for key in FITTED_PARAMETERS:
        assert fitted[key] == pytest.approx(truth[key], rel=0.01), key
    assert result.rms_relative_error < 0.002
    # the physical numbers, as a reader of the YAML sees them
    assert result.spec.network.nic_efficiency == pytest.approx(0.8, rel=0.01)
    assert result.spec.intra_node.nvlink_efficiency == pytest.approx(0.7, rel=0.01)


def test_calibration_tolerates_measurement_noise():
    result = calibrate(BASE, parsed(synthetic_logs(TRUTH, noise=0.02, seed=1)), name="fit")
    truth, fitted = parameters_of(TRUTH), parameters_of(result.spec)
    for key in ("nvlink_ns_per_byte", "nic_ns_per_byte", "nvls_ns_per_byte", "base_ns"):
        assert fitted[key] == pytest.approx(truth[key], rel=0.03), key


def test_parameters_that_no_log_measures_keep_the_base_values():
    single_node = {
        name: text for name, text in synthetic_logs(TRUTH, ops=("all_gather",)).items() if "_1x" in name
    }
    result = calibrate(BASE, parsed(single_node), name="fit")
    assert "nic_ns_per_byte" not in result.fitted and "inter_step_ns" not in result.fitted
    assert result.spec.network == BASE.network
    assert result.spec.intra_node.nvlink_efficiency == pytest.approx(0.7, rel=0.01)


def test_a_base_slower_than_the_measurements_is_flagged():
    logs = synthetic_logs(PRESETS["dgx-h100"], ops=("all_gather",))
    result = calibrate(PRESETS["dgx-a100"], parsed(logs), name="x")
    assert any("nvlink runs at the base cluster's full line rate (300.0 GB/s)" in w for w in result.warnings)
    assert result.spec.intra_node.nvlink_efficiency == 1.0
    assert calibrate(BASE, parsed(logs), name="x").warnings == ()


def test_the_calibrate_command_writes_a_cluster_the_emulator_can_load(tmp_path, capsys):
    paths = []
    for name, text in synthetic_logs(TRUTH, ops=("all_reduce", "sendrecv")).items():
        path = tmp_path / name
        path.write_text(text)
        paths.append(str(path))
    out = tmp_path / "cluster.yaml"
    assert cli.main(["calibrate", *paths, "--out", str(out)]) == 0
    report = capsys.readouterr().out
    assert "wrote" in report and "nic_ns_per_byte" in report
    spec = load_cluster(out)
    assert spec.name == "cluster"
    assert spec.network.nic_efficiency == pytest.approx(0.8, rel=0.01)
    assert out.read_text().startswith("# Calibrated by prism-megatron calibrate from 10 nccl-tests run(s)")


def test_the_calibrate_command_reports_user_mistakes_in_one_line(tmp_path, capsys):
    log = tmp_path / "run3.log"
    log.write_text(
        synthetic_logs(TRUTH, ops=("all_gather",))["all_gather_1x8.log"].replace("# Collective", "#")
    )
    assert cli.main(["calibrate", str(log), "--out", str(tmp_path / "c.yaml")]) == 2
    assert "prefix the path with the program, e.g. all_gather:" in capsys.readouterr().err
    assert cli.main(["calibrate", f"all_gather:{log}", "--out", str(tmp_path / "c.yaml")]) == 0
    assert cli.main(["calibrate", str(tmp_path / "missing.log"), "--out", "c.yaml"]) == 2
    assert "is not a file" in capsys.readouterr().err


def test_the_calibrate_command_reads_nccl_tests_json_output(tmp_path, capsys):
    data = os.path.join(os.path.dirname(__file__), "data", "nccl_tests")
    out = tmp_path / "from_json.yaml"
    assert cli.main(["calibrate", os.path.join(data, "all_reduce_2nodes.json"), "--out", str(out)]) == 0
    assert "1 run(s), 3 rows" in capsys.readouterr().out
    assert load_cluster(out).name == "from_json"


def test_the_calibrate_command_prints_each_rows_residual_and_warns_of_too_few_rows(tmp_path, capsys):
    data = os.path.join(os.path.dirname(__file__), "data", "nccl_tests")
    out = tmp_path / "c.yaml"
    assert cli.main(["calibrate", os.path.join(data, "all_reduce_2nodes.log"), "--out", str(out)]) == 0
    text = capsys.readouterr().out
    rows = [line for line in text.splitlines() if line.startswith("all_reduce_2nodes.log:")]
    assert [row.split()[1] for row in rows] == ["1024", "32768", "1048576"], "one line per measured row"
    assert all(row.rstrip().endswith("%") for row in rows), "each with its residual"
    assert "warning: 3 row(s) for 4 fitted parameters" in text
    assert out.exists()


def test_the_calibrate_command_refuses_a_fit_beyond_its_error_bound_and_writes_nothing(tmp_path, capsys):
    logs = synthetic_logs(TRUTH, ops=("all_reduce",))
    path = tmp_path / "all_reduce_2x8.log"
    rows = logs["all_reduce_2x8.log"].splitlines()
    sized = [i for i, line in enumerate(rows) if line.strip() and line.split()[0].isdigit()]
    for i, j in zip(sized, reversed(sized), strict=True):  # times that fall as sizes grow
        if i < j:
            a, b = rows[i].split(), rows[j].split()
            a[5], b[5] = b[5], a[5]
            rows[i], rows[j] = " ".join(a), " ".join(b)
    path.write_text("\n".join(rows) + "\n")
    out = tmp_path / "c.yaml"
    assert cli.main(["calibrate", str(path), "--out", str(out)]) == 2
    captured = capsys.readouterr()
    assert "exceeds the bound 25% (--max-error); no cluster written" in captured.err
    assert "residual" in captured.out, "the rows that disagree are shown"
    assert not out.exists()
    assert cli.main(["calibrate", str(path), "--out", str(out), "--max-error", "1e6"]) == 0, "a looser bound"
