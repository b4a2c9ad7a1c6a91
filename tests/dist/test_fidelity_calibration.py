"""The fidelity suite's calibration: every table the cases read, each pattern repeated, its spread kept.

It runs in a fresh interpreter (the calibration forks its gloo processes, which a test process that
already ran torch's thread pool must not do) with one repetition per point: this checks what is
measured and how it is combined, not how much it costs.
"""

from __future__ import annotations

import json
import os
import statistics
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest

from benchmarks.fidelity.calibrate import LARGE_SIZES_BYTES, SIZES_BYTES
from prism_megatron.network.measured import load_measured
from prism_megatron.replay import OpKind

REPO = Path(__file__).resolve().parents[2]
SCRIPT = textwrap.dedent(
    """
    import json, sys
    from benchmarks.fidelity.calibrate import calibrate
    out = {}
    for pattern, lead_in, sizes in (("job", "busy", [2]), ("job", "sleep", [2]), ("alone", "sleep", [2, 4])):
        calibration = calibrate(sizes, pattern=pattern, world_size=4, lead_in=lead_in, repetitions=1, repeats=2)
        out[calibration.name] = {"cost": calibration.cost.to_dict(), "spread": calibration.spread(),
                                 "draws": [draw.to_dict() for draw in calibration.draws]}
    json.dump(out, sys.stdout)
    """
)


@pytest.fixture(scope="module")
def calibrations() -> dict:
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONWARNINGS": "ignore"}
    done = subprocess.run([sys.executable, "-c", SCRIPT], cwd=REPO, env=env, capture_output=True, text=True,
                          timeout=180)  # fmt: skip
    assert done.returncode == 0, done.stderr[-4000:]
    return json.loads(done.stdout)


def test_each_pattern_measures_every_table_the_cases_read(calibrations):
    assert set(calibrations) == {"loopback-job-busy-w4", "loopback-job-sleep-w4", "loopback-alone-sleep-w4"}
    pairs = sorted(SIZES_BYTES + LARGE_SIZES_BYTES)
    for name, calibration in calibrations.items():
        tables = calibration["cost"]["costs_us"]
        expected = {"ALL_REDUCE/2", "SEND/2"} | ({"ALL_REDUCE/4"} if "alone" in name else set())
        assert set(tables) == expected, name
        for key, rows in tables.items():
            sizes, costs = [s for s, _ in rows], [c for _, c in rows]
            assert sizes == (pairs if key.endswith("/2") else list(SIZES_BYTES)), (name, key)
            assert all(c > 0 for c in costs) and costs == sorted(costs), (name, key, costs)


def test_the_model_is_each_points_median_over_independent_draws_and_their_spread_is_kept(
    calibrations, tmp_path
):
    for name, calibration in calibrations.items():
        assert len(calibration["draws"]) == 2
        for key, sizes in calibration["spread"].items():
            assert all(len(draws) == 2 for draws in sizes.values()), (name, key)
        for key, rows in calibration["cost"]["costs_us"].items():
            first = [draw["costs_us"][key][0][1] for draw in calibration["draws"]]
            assert rows[0][1] == pytest.approx(statistics.median(first), abs=0.002), (name, key)
        path = tmp_path / f"{name}.json"
        path.write_text(json.dumps(calibration["cost"]))
        cost = load_measured(str(path))
        assert cost(OpKind.SEND, (0, 1), 4) == pytest.approx(
            calibration["cost"]["costs_us"]["SEND/2"][0][1] * 1e3
        )
