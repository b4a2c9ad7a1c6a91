"""A graph captured from a small real job predicts the iteration time that job measured.

The job is GPT on W=2 with PP2 (8 micro-batches per iteration), run by two real processes on this
CPU: with --prism-ranks 0,1 every rank is real, so the capture pass *is* a real run of the job
(the prism backend hands all-real groups to gloo; the replay engine has no one to speak for). The
iterations it measured are the ground truth the simulation of its graph is held against. The
pipeline's fill and drain make the prediction depend on every part of the graph: compute spans,
p2p matching, the final reductions. (A later run of the same job is no ground truth on this
machine: other work shifts its compute by tens of per cent from one minute to the next.)

The network model is the transport the job ran on: gloo over loopback, from the processes' own
op logs (one clock on one machine): an op's cost is the time from the last member's issue to a
member's completion, the median per op kind. (The default cluster's GPU links charge microseconds
where gloo and the Python around it take about half a millisecond: 5-15 % of this job's iteration.)

The bounds are asymmetric because the machine is a shared 2-core one: a process that waited on
its peer wakes up when the scheduler lets it, milliseconds late when other work holds both cores,
and that only ever adds time to a measured iteration; the graph's spans are medians, so the
prediction is of an undisturbed iteration. Measured here under load: predictions 2-13 % below the
same iterations. The simulation may undershoot the measured median by 20 % and overshoot it by 10 %.
"""

from __future__ import annotations

import collections
import dataclasses
import json
import statistics

import pytest

from prism_megatron.emulation import Progress, driver, plan_run
from prism_megatron.graph import COMPUTE_STREAM, LayoutWorld
from prism_megatron.graph.capture import RankCapture, build_graph, first_difference
from prism_megatron.replay import OpKind
from prism_megatron.sim import simulate

REAL_JOB = (
    "--num-layers", "4", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
    "--vocab-size", "1000", "--micro-batch-size", "1", "--global-batch-size", "8",
    "--pipeline-model-parallel-size", "2", "--hidden-dropout", "0", "--attention-dropout", "0",
    "--prism-emulate", "--prism-world-size", "2", "--prism-device", "cpu",
)  # fmt: skip


def real_job(out, *, iterations: int) -> list[str]:
    """The job's flags: both ranks real, `iterations` captured and as many emulated."""
    n = str(iterations)
    return [
        *REAL_JOB,
        "--train-iters",
        n,
        "--prism-capture-iters",
        n,
        "--prism-ranks",
        "0,1",
        "--prism-out",
        str(out),
    ]


def read_json(path) -> dict:
    with open(path, encoding="utf-8") as f:
        return json.load(f)


def measured_s(results: dict) -> float:
    """Median iteration time after warm-up, slowest rank per iteration."""
    per_rank = [r["prism_phase"]["iteration_times_s"][r["prism_phase"]["num_warmup"] :] for r in results]
    return statistics.median(max(column) for column in zip(*per_rank, strict=True))


@pytest.mark.slow
def test_the_simulated_graph_of_a_real_job_predicts_its_measured_iteration_time(tmp_path):
    plan = plan_run(real_job(tmp_path, iterations=6))
    driver.prepare_run_dir(plan)
    driver.capture(plan, Progress(quiet=True), {})
    captures = [RankCapture.load(str(tmp_path / "capture" / f"capture-{r:05d}.json")) for r in (0, 1)]
    world = LayoutWorld(plan.layout)
    graph = build_graph(captures, world, plan.layout.kwargs())
    costs = loopback_costs(captures)
    simulated_s = simulate(graph, world, costs).iteration_time_ns / 1e9
    measured = measured_s([read_json(tmp_path / "capture" / f"rank-{r:05d}.json") for r in (0, 1)])
    assert 0.80 * measured <= simulated_s <= 1.10 * measured, (simulated_s, measured, costs.by_kind)
    assert {op.type.name for op in graph.roles["pp0-tp0src"].streams[COMPUTE_STREAM]} >= {"SEND", "RECV"}


class MeasuredCost:
    """A `CostFn` of measured costs per op kind (ns); ops of one member cost nothing."""

    def __init__(self, by_kind: dict[OpKind, float]) -> None:
        self.by_kind = by_kind

    def __call__(self, kind: OpKind, members: tuple[int, ...], size_bytes: int) -> float:
        return self.by_kind.get(kind, 0.0) if len(members) > 1 else 0.0


def loopback_costs(captures: list[RankCapture]) -> MeasuredCost:
    """Each op kind's cost between the two real ranks, from their op logs (see the docstring)."""
    samples: dict[OpKind, list[int]] = collections.defaultdict(list)
    for first, second in zip(captures[0].recorded(), captures[1].recorded(), strict=True):
        pairs = [_shared_collectives(first, second)]
        pairs += [_matched_p2p(first, second, OpKind.SEND), _matched_p2p(second, first, OpKind.SEND)]
        for matched in pairs:
            for a, b in matched:
                last_issue_ns = max(a.issue_ns, b.issue_ns)
                samples[a.kind].append(b.complete_ns - last_issue_ns)
                if a.kind not in (OpKind.SEND, OpKind.RECV):
                    samples[a.kind].append(a.complete_ns - last_issue_ns)
    by_kind = {kind: float(statistics.median(values)) for kind, values in samples.items()}
    by_kind[OpKind.RECV] = by_kind[OpKind.SEND]  # a transfer's cost, from either side
    return MeasuredCost(by_kind)


def _shared_collectives(first, second) -> list:
    """The two ranks' collectives over groups of both, in issue order."""

    def both(it):
        return sorted((e for e in it.events if e.peer < 0 and len(e.group) == 2), key=lambda e: e.issue_ns)

    return list(zip(both(first), both(second), strict=True))


def _matched_p2p(sender, receiver, kind: OpKind) -> list:
    """(send, matching recv): the n-th send of one rank is the n-th receive of the other."""
    sends = sorted((e for e in sender.events if e.kind == kind), key=lambda e: e.issue_ns)
    recvs = sorted((e for e in receiver.events if e.kind == OpKind.RECV), key=lambda e: e.issue_ns)
    recvs = [e for e in recvs if e.peer == (sends[0].group[0] if sends else -1)]
    return list(zip(sends, recvs, strict=True))


@pytest.mark.slow
def test_a_slice_captured_one_rank_at_a_time_gives_the_same_graph(tmp_path):
    """Two passes of one process (each rank alone among virtual peers: its pipeline neighbour is
    virtual) against one pass of two (the neighbours real): the same ops, op for op."""
    graphs = {}
    for nproc in (1, 2):
        out = tmp_path / f"nproc-{nproc}"
        plan = plan_run(real_job(out, iterations=4))
        plan = dataclasses.replace(plan, nproc=nproc)  # the emulation needs both; a capture pass not
        walls: dict[str, float] = {}
        driver.prepare_run_dir(plan)
        driver.capture(plan, Progress(quiet=True), walls)
        assert len(walls) == 2 // nproc, walls  # one launch per pass
        captures = [RankCapture.load(str(out / "capture" / f"capture-{r:05d}.json")) for r in (0, 1)]
        graphs[nproc] = build_graph(captures, LayoutWorld(plan.layout), plan.layout.kwargs())
    assert list(graphs[1].roles) == list(graphs[2].roles)
    for role in graphs[1].roles:
        assert first_difference(graphs[1].roles[role].streams, graphs[2].roles[role].streams) is None, role
    # The durations are measurements: one process alone on the machine computes faster than two
    # sharing it, so only the ops, their order, groups, sizes and dependencies must agree.
