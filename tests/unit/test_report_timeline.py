"""timeline.json: iteration spans, memory counters and arrows, checked against the Trace Event Format.

The checker below encodes the rules of the Trace Event Format (the JSON Perfetto and chrome://tracing
read): the events each phase needs, flow arrows paired by id and bound to an enclosing slice, counters
with numeric values.
"""

import json
import math

import pytest

from prism_megatron.graph.world import LayoutWorld
from prism_megatron.replay.events import OpEvent
from prism_megatron.replay.schedule import OpKind
from prism_megatron.report.oplog import ComputeSpan, MemorySample, OpLog, op_log_from_json, op_log_to_json
from prism_megatron.report.timeline import SimulatedTracks, timeline_trace
from prism_megatron.sim import AlphaBetaCost, PipelineSpec, layout_pipeline_graph, simulate
from prism_megatron.topology import Layout

LAYOUT = Layout(world_size=16, tp=1, pp=2)  # DP 8; ranks 0 and 8 are stages 0 and 1 of DP rank 0
T0 = 7_000_000_000
MS = 1_000_000
META_NAMES = {"process_name", "thread_name", "process_sort_index", "thread_sort_index"}


def check_trace_event_format(trace: dict) -> dict[str, int]:
    """Assert `trace` follows the Trace Event Format; return the number of events per phase."""
    json.dumps(trace, allow_nan=False)  # plain JSON: no NaN or infinity
    assert isinstance(trace["traceEvents"], list) and trace.get("displayTimeUnit") in (None, "ms", "ns")
    counts: dict[str, int] = {}
    slices: dict[tuple[int, int], list[tuple[float, float]]] = {}
    flows: dict[int, dict[str, dict]] = {}
    for event in trace["traceEvents"]:
        phase = event["ph"]
        counts[phase] = counts.get(phase, 0) + 1
        assert isinstance(event["name"], str) and isinstance(event["pid"], int), event
        if phase == "M":
            assert event["name"] in META_NAMES and isinstance(event["args"], dict), event
            continue
        assert isinstance(event["tid"], int) and event["ts"] >= 0, event
        if phase == "X":
            assert event["dur"] >= 0 and isinstance(event["cat"], str) and isinstance(event["args"], dict)
            slices.setdefault((event["pid"], event["tid"]), []).append(
                (event["ts"], event["ts"] + event["dur"])
            )
        elif phase == "C":
            assert event["args"] and all(isinstance(v, int | float) for v in event["args"].values()), event
        elif phase in ("s", "f"):
            assert isinstance(event["id"], int) and isinstance(event["cat"], str)
            assert phase not in flows.setdefault(event["id"], {}), f"flow {event['id']} has two '{phase}'"
            flows[event["id"]][phase] = event
            if phase == "f":
                assert event["bp"] == "e"
        else:
            raise AssertionError(f"unexpected phase {phase!r}")
    for flow_id, ends in flows.items():
        assert set(ends) == {"s", "f"}, f"flow {flow_id} lacks an end"
        assert ends["s"]["name"] == ends["f"]["name"] and ends["s"]["cat"] == ends["f"]["cat"]
        assert ends["s"]["ts"] <= ends["f"]["ts"] + 1e-3
        for end in ends.values():  # each end lies inside a slice of its thread (what it binds to)
            spans = slices.get((end["pid"], end["tid"]), [])
            assert any(a - 1e-6 <= end["ts"] <= b + 1e-6 for a, b in spans), f"flow {flow_id} end {end}"
    return counts


def _event(kind, group, peer, seq, issue, start, complete, *, has_virtual=False):
    return OpEvent(kind, group, peer, seq, 4096, "Float", issue, start, complete, False, has_virtual)


def _logs():
    """Rank 0 sends to rank 8 each iteration; both join an all-real all-reduce that rank 8 reaches last."""
    logs = {}
    for rank in (0, 8):
        events, compute, starts, memory = [], [], [], []
        for i in range(2):
            t = T0 + i * 100 * MS
            starts.append(t)
            compute.append(ComputeSpan("compute", t, t + 20 * MS))
            if rank == 0:
                events.append(_event(OpKind.SEND, (0, 8), 8, i, t + 20 * MS, t + 20 * MS, t + 21 * MS))
            else:
                events.append(_event(OpKind.RECV, (8, 0), 0, i, t + 5 * MS, t + 5 * MS, t + 22 * MS))
            arrive = t + (40 if rank == 0 else 60) * MS
            events.append(_event(OpKind.ALL_REDUCE, (0, 8), -1, i, arrive, t + 60 * MS, t + 61 * MS))
            memory += [
                MemorySample(t + k * MS, {"parameters": 1 << 20, "activations": k << 18}) for k in (1, 30)
            ]
        memory.insert(
            0, MemorySample(T0 - 3 * MS, {"parameters": 1 << 20, "activations": 0})
        )  # before training
        logs[rank] = OpLog(
            virtual_rank=rank,
            events=tuple(events),
            compute=tuple(compute),
            iteration_starts_ns=tuple(starts),
            memory=tuple(memory),
        )
    return logs


@pytest.fixture(scope="module")
def trace():
    spec = PipelineSpec(
        num_microbatches=2, fwd_ns=MS, bwd_ns=2 * MS, activation_bytes=1 << 16, dp_grad_bytes=1 << 20
    )
    result = simulate(
        layout_pipeline_graph(LAYOUT, spec), LayoutWorld(LAYOUT), AlphaBetaCost(latency_ns=1000)
    )
    simulated = SimulatedTracks.from_result(result, [1, 9, 2, 10])
    return timeline_trace((0, 8), _logs(), simulated, LAYOUT)


def test_the_timeline_follows_the_trace_event_format(trace):
    counts = check_trace_event_format(trace)
    assert counts["X"] > 0 and counts["C"] == 10 and counts["s"] == counts["f"] > 0


def test_each_real_rank_has_an_iterations_track(trace):
    events = trace["traceEvents"]
    threads = {(e["pid"], e["tid"]): e["args"]["name"] for e in events if e["name"] == "thread_name"}
    iterations = [e for e in events if e["ph"] == "X" and threads[(e["pid"], e["tid"])] == "iterations"]
    assert sorted((e["pid"], e["name"]) for e in iterations) == [
        (0, "iteration 0"), (0, "iteration 1"), (8, "iteration 0"), (8, "iteration 1")
    ]  # fmt: skip
    first = next(e for e in iterations if e["pid"] == 0 and e["name"] == "iteration 0")
    # µs from the run start: the first memory sample, 3 ms before the first iteration
    assert (first["ts"], first["dur"]) == (3 * MS / 1000, 100 * MS / 1000)


def test_memory_counter_tracks_carry_mib_by_category(trace):
    counters = [e for e in trace["traceEvents"] if e["ph"] == "C"]
    assert {e["pid"] for e in counters} == {0, 8} and {e["name"] for e in counters} == {"memory (MiB)"}
    assert counters[0]["ts"] == 0 and counters[2]["args"] == {"parameters": 1.0, "activations": 30 / 4}


def test_arrows_go_from_a_send_to_its_receive_and_from_the_last_arrival(trace):
    events = trace["traceEvents"]
    starts = {e["id"]: e for e in events if e["ph"] == "s"}
    ends = {e["id"]: e for e in events if e["ph"] == "f"}
    measured_p2p = [i for i, e in starts.items() if e["name"] == "send 0 -> 8" and e["pid"] == 0]
    assert len(measured_p2p) == 2  # one per iteration, matched by sequence number
    assert all(ends[i]["pid"] == 8 and ends[i]["ts"] == pytest.approx((3 + 22 + 100 * k) * 1000, abs=0.01)
               for k, i in enumerate(sorted(measured_p2p)))  # fmt: skip
    last = [i for i, e in starts.items() if e["cat"] == "collective" and e["pid"] in (0, 8)]
    assert len(last) == 2 and all(starts[i]["pid"] == 8 and ends[i]["pid"] == 0 for i in last)
    simulated = [i for i, e in starts.items() if e["pid"] not in (0, 8)]
    assert simulated  # the replayed ranks' sends and receives are linked too
    assert all(math.isfinite(starts[i]["ts"]) for i in simulated)


def test_memory_samples_round_trip_through_the_op_log_file():
    log = _logs()[0]
    assert op_log_from_json(json.loads(json.dumps(op_log_to_json(log))), "x") == log
