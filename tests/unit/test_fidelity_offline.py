"""The offline loop: a kept suite run re-simulates every case from its graph, costs and real medians."""

from __future__ import annotations

import json
import os

import pytest

from benchmarks.fidelity import offline
from prism_megatron.graph import save_graph
from prism_megatron.network.measured import MeasuredCost
from prism_megatron.replay import OpKind
from prism_megatron.sim import PipelineSpec, layout_pipeline_graph
from prism_megatron.topology import Layout

LAYOUT = Layout(world_size=4, tp=1, pp=2)
SPEC = PipelineSpec(num_microbatches=4, fwd_ns=10_000_000, bwd_ns=20_000_000, activation_bytes=4096)
COST = MeasuredCost({(OpKind.SEND, 2): ((4, 100_000.0), (4096, 100_000.0))})


@pytest.fixture
def kept(tmp_path):
    """A folder as `keep` leaves it: the base case's graph and a straggler case reusing it."""
    save_graph(layout_pipeline_graph(LAYOUT, SPEC), str(tmp_path / "graphs" / "pp2-dp2"))
    os.makedirs(tmp_path / "costs")
    (tmp_path / "costs" / "job.json").write_text(json.dumps(COST.to_dict()))
    layout = LAYOUT.kwargs() | {"dp": 2}
    cases = [
        {"case": "pp2-dp2", "graph": "graphs/pp2-dp2", "layout": layout, "stragglers": [],
         "costs": {"job": "costs/job.json"}, "real_median_ms": {"0": 155.0}, "real_round_iqr_pct": 0.1},
        {"case": "pp2-dp2-straggler", "graph": "graphs/pp2-dp2", "layout": layout, "stragglers": [[2, 2.0]],
         "costs": {"job": "costs/job.json"}, "real_median_ms": {"0": 300.0}, "real_round_iqr_pct": 0.1},
    ]  # fmt: skip
    (tmp_path / offline.INDEX).write_text(json.dumps({"cases": cases}))
    return str(tmp_path)


def test_every_kept_case_is_simulated_again_beside_its_real_median(kept):
    rows = offline.resimulate(kept)
    assert [(row["case"], row["virtual_rank"]) for row in rows] == [("pp2-dp2", 0), ("pp2-dp2-straggler", 0)]
    # 1F1B over 2 stages: (M + 1) microbatch steps of 30 ms, and 3 pipeline hops of 0.1 ms each way.
    base = rows[0]["simulated_ms"]
    assert base == pytest.approx(150.6, abs=0.5)
    assert rows[0]["error_pct"] == pytest.approx(100 * (base - 155.0) / 155.0)
    assert rows[1]["simulated_ms"] > base, "the straggler what-if is simulated"
    assert "mean |error|" in offline.table(rows)


def test_another_cost_file_and_bad_folders(kept, tmp_path_factory):
    slow = tmp_path_factory.mktemp("slow") / "slow.json"
    slow.write_text(json.dumps(MeasuredCost({(OpKind.SEND, 2): ((4, 5_000_000.0),)}).to_dict()))
    assert (
        offline.resimulate(kept, cost_file=str(slow))[0]["simulated_ms"]
        > offline.resimulate(kept)[0]["simulated_ms"]
    )
    with pytest.raises(ValueError, match=r"no 'alone' costs kept; kept: \['job'\]"):
        offline.resimulate(kept, model="alone")
    with pytest.raises(ValueError, match=r"no cases\.json here"):
        offline.resimulate(str(tmp_path_factory.mktemp("empty")))
