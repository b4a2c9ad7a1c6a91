"""Role classes in the graph: a middle stage's capture gives every middle stage its ops and spans.

The oracle below writes a middle stage's iteration the way megatron-core's 1F1B loop runs it
(`forward_backward_pipelining_without_interleaving`: warm-up, steady state, cool-down, each call
through the prism interceptor's `_communicate`) and the way capture turns it into ops: a compute
span before every op, TP all-reduces in every step, an async TP all-reduce waited inside every
backward, and the last backward's data-parallel reduce-scatter waited after the pipeline. It is
written independently of `graph.schedule`, so the derivation is checked against the schedule's
own loop.
"""

from __future__ import annotations

import collections

import pytest

from prism_megatron.graph import COMPUTE_STREAM, Dep, NodeType, Op, RoleGraph
from prism_megatron.graph.capture import compute_durations, structure
from prism_megatron.graph.classes import ClassProgram, class_graphs, spread
from prism_megatron.graph.schema import ExecutionGraph, GraphMetadata
from prism_megatron.replay.schedule import OpKind
from prism_megatron.topology import RoleClass

PP = 8


class Oracle:
    """One middle stage's iteration, written op by op as capture records it."""

    def __init__(self, stage: int, idle_ns: int) -> None:
        self.stage, self.idle_ns = stage, idle_ns
        self.streams: dict[str, list[Op]] = {COMPUTE_STREAM: []}
        self.seq: collections.Counter = collections.Counter()

    def _next(self, key) -> int:
        self.seq[key] += 1
        return self.seq[key] - 1

    def compute(self, duration_ns: int) -> None:
        self.streams[COMPUTE_STREAM].append(
            Op(type=NodeType.COMPUTE, name="compute", duration_ns=duration_ns)
        )

    def _gap(self) -> None:
        ops = self.streams[COMPUTE_STREAM]
        if not ops or ops[-1].type != NodeType.COMPUTE:
            self.compute(self.idle_ns)

    def all_reduce(self, group: str, size: int) -> None:
        self._gap()
        op = Op(type=NodeType.COLLECTIVE, comm=OpKind.ALL_REDUCE, group=group, seq=self._next(group),
                size_bytes=size, dtype="Float")  # fmt: skip
        self.streams[COMPUTE_STREAM].append(op)

    def post(self, group: str, comm: OpKind, size: int) -> Dep:
        self._gap()
        stream = self.streams.setdefault(f"async-{group}", [])
        after = Dep(COMPUTE_STREAM, len(self.streams[COMPUTE_STREAM]) - 1)
        stream.append(Op(type=NodeType.COLLECTIVE, comm=comm, group=group, seq=self._next(group),
                         size_bytes=size, dtype="Float", deps=(after,)))  # fmt: skip
        return Dep(f"async-{group}", len(stream) - 1)

    def wait(self, dep: Dep) -> None:
        self._gap()
        self.streams[COMPUTE_STREAM].append(Op(type=NodeType.WAIT, deps=(dep,)))

    def communicate(self, *, send_next=None, send_prev=None, recv_prev=False, recv_next=False) -> None:
        """prism's `_communicate`: posts recv_prev, recv_next, send_next, send_prev, one batch."""
        self._gap()
        posts = []
        if recv_prev:
            posts.append((NodeType.RECV, -1))
        if recv_next:
            posts.append((NodeType.RECV, +1))
        if send_next is not None:
            posts.append((NodeType.SEND, +1))
        if send_prev is not None:
            posts.append((NodeType.SEND, -1))
        for index, (kind, offset) in enumerate(posts):
            self.streams[COMPUTE_STREAM].append(
                Op(type=kind, group="pp", offset=offset, seq=self._next((kind, offset)), size_bytes=4096,
                   dtype="Float", coalesced=index < len(posts) - 1)
            )  # fmt: skip

    def forward(self, microbatch: int) -> str:
        self.compute(1000 + 10 * microbatch + self.stage)
        self.all_reduce("tp", 512)
        self.compute(2000 + 10 * microbatch)
        self.all_reduce("tp", 512)
        self.compute(3000 + 10 * microbatch)
        return "activation"

    def backward(self, microbatch: int, last: bool) -> str:
        self.compute(5000 + 10 * microbatch)
        handle = self.post("tp", OpKind.ALL_REDUCE, 512)
        self.compute(6000 + 10 * microbatch)
        self.wait(handle)
        if last:
            self.grads = self.post("dp", OpKind.REDUCE_SCATTER, 8192)
        self.compute(7000 + 10 * microbatch)
        return "gradient"

    def iteration(self, num_microbatches: int) -> RoleGraph:
        """megatron-core's non-interleaved 1F1B loop of a middle stage."""
        m = num_microbatches
        warmup = min(PP - self.stage - 1, m)
        remaining = m - warmup
        self.compute(400)
        for i in range(warmup):
            self.communicate(recv_prev=True)
            self.communicate(send_next=self.forward(i))
        if remaining:
            self.communicate(recv_prev=True)
        for j in range(remaining):
            out = self.forward(warmup + j)
            self.communicate(send_next=out, recv_next=True)
            grad = self.backward(j, last=warmup == 0 and j == remaining - 1)
            if j == remaining - 1:
                self.communicate(send_prev=grad)
            else:
                self.communicate(send_prev=grad, recv_prev=True)
        for i in range(warmup):
            self.communicate(recv_next=True)
            self.communicate(send_prev=self.backward(remaining + i, last=i == warmup - 1))
        self.compute(800)
        self.wait(self.grads)
        self.compute(900)
        self.all_reduce("mp", 8)
        self.compute(50)
        return RoleGraph(role=f"pp{self.stage}", streams={k: tuple(v) for k, v in self.streams.items()})


def middle_class(num_microbatches: int) -> RoleClass:
    stages = range(1, PP - 1)
    return RoleClass(
        "pp1",
        tuple(f"pp{s}" for s in stages),
        {f"pp{s}": min(PP - s - 1, num_microbatches) for s in stages},
        num_microbatches,
    )


@pytest.mark.parametrize("num_microbatches", [1, 4, 12])
def test_every_middle_stage_is_derived_from_one_capture_op_for_op(num_microbatches):
    reference = Oracle(1, idle_ns=40).iteration(num_microbatches)
    program = ClassProgram(middle_class(num_microbatches), "pp1", reference.streams)
    for stage in range(1, PP - 1):
        captured = Oracle(stage, idle_ns=40).iteration(num_microbatches)
        assert program.structure(f"pp{stage}") == structure(captured.streams), f"stage {stage}"


def test_a_derived_stage_runs_the_captured_steps_spans_in_its_own_order():
    reference = Oracle(1, idle_ns=0).iteration(12)
    program = ClassProgram(middle_class(12), "pp1", reference.streams)
    canonical = program.pooled({"pp1": compute_durations(reference.streams)})
    assert canonical == compute_durations(reference.streams)
    derived = program.streams("pp6", canonical)
    truth = Oracle(6, idle_ns=0).iteration(12)  # stage 6's forward spans are 5 ns longer
    shift = [5 if 1000 <= d < 2000 else 0 for d in compute_durations(truth.streams)]
    assert [d + s for d, s in zip(compute_durations(derived), shift, strict=True)] == compute_durations(
        truth.streams
    )


@pytest.mark.parametrize("num_microbatches", [4, 12])
@pytest.mark.parametrize("reference_stage", [1, 6])
def test_every_member_gets_each_span_of_the_reference_once_so_equal_compute(
    num_microbatches, reference_stage
):
    """The schedule loop's idle gaps follow the work they come after: a stage with fewer warm-up
    microbatches has fewer gaps, and takes the reference's time for the others in the step before."""
    reference = Oracle(reference_stage, idle_ns=40).iteration(num_microbatches)
    program = ClassProgram(middle_class(num_microbatches), f"pp{reference_stage}", reference.streams)
    canonical = program.pooled({f"pp{reference_stage}": compute_durations(reference.streams)})
    totals = set()
    for stage in range(1, PP - 1):
        source = program.source(f"pp{stage}")
        assert sorted(p for positions in source for p in positions) == list(range(program.num_canonical))
        totals.add(sum(compute_durations(program.streams(f"pp{stage}", canonical))))
    assert totals == {sum(compute_durations(reference.streams))}


def test_captured_members_confirm_the_class_and_their_spans_are_pooled():
    captured = {f"pp{s}": Oracle(s, idle_ns=30 + s).iteration(12) for s in (1, 6)}
    graphs = class_graphs(middle_class(12), captured)
    assert set(graphs) == {f"pp{s}" for s in range(1, PP - 1)}
    forward_spans = {
        role: sorted(d for d in compute_durations(g.streams) if 1000 <= d < 2000)
        for role, g in graphs.items()
    }
    assert forward_spans["pp3"] == forward_spans["pp1"] == forward_spans["pp6"]
    assert forward_spans["pp3"][0] == round((1001 + 1006) / 2), "the median of the two captures"
    assert structure(graphs["pp4"].streams) == structure(Oracle(4, 0).iteration(12).streams)


def test_a_member_that_issues_other_ops_is_an_error_naming_the_first_difference():
    captured = {f"pp{s}": Oracle(s, idle_ns=30).iteration(4) for s in (1, 5)}
    ops = list(captured["pp5"].streams[COMPUTE_STREAM])
    index = next(i for i, op in enumerate(ops) if op.type == NodeType.COLLECTIVE)
    ops[index] = Op(type=NodeType.COLLECTIVE, comm=OpKind.ALL_REDUCE, group="tp", seq=ops[index].seq,
                    size_bytes=1024, dtype="Float")  # fmt: skip
    captured["pp5"] = RoleGraph("pp5", {**captured["pp5"].streams, COMPUTE_STREAM: tuple(ops)})
    with pytest.raises(
        ValueError,
        match=r"roles pp1 and pp5 .* at compute\[\d+\]: 'AR tp#0 512B Float' vs 'AR tp#0 1KiB Float'",
    ):
        class_graphs(middle_class(4), captured)


def test_a_reference_that_is_not_1f1b_with_its_warm_up_cannot_be_derived_from():
    reference = Oracle(1, idle_ns=40).iteration(4)
    wrong = RoleClass("pp1", ("pp1", "pp2"), {"pp1": 6, "pp2": 5}, 8)
    with pytest.raises(
        ValueError,
        match="pipeline call 8 is 'R←pp\\+1#0 4KiB Float', not 'R←pp-1#4' as 1F1B with 6 warm-up of 8",
    ):
        ClassProgram(wrong, "pp1", reference.streams)


def test_an_interleaved_class_whose_reference_does_not_overlap_its_p2p_names_the_flags_that_fix_it():
    reference = Oracle(1, idle_ns=40).iteration(4)  # a 1F1B stage: not the interleaved order
    interleaved = RoleClass("pp2", ("pp2", "pp1"), {"pp2": 6, "pp1": 8}, 4, 2, 4, {"pp2": 2, "pp1": 1})
    with pytest.raises(ValueError) as caught:
        class_graphs(interleaved, {"pp2": RoleGraph("pp2", reference.streams)})
    message = str(caught.value)
    assert message.startswith("role pp2: pipeline op ")
    assert "not as the interleaved schedule with 6 warm-up of 8 virtual microbatches has it" in message
    assert "--no-overlap-p2p-communication" in message and "--prism-capture-all-roles" in message


def test_a_class_of_one_stage_gives_every_member_the_captured_ops_and_spans():
    captured = {"pp0-tp0src": Oracle(1, 40).iteration(4)}
    role_class = RoleClass("pp0-tp0src", ("pp0-tp0src", "pp0"))
    graphs = class_graphs(role_class, {"pp0-tp0src": RoleGraph("pp0-tp0src", captured["pp0-tp0src"].streams)})
    assert graphs["pp0"].streams == graphs["pp0-tp0src"].streams == captured["pp0-tp0src"].streams


def test_one_real_ranks_measurement_folds_into_every_stage_of_its_class():
    graphs = class_graphs(middle_class(12), {"pp1": Oracle(1, idle_ns=40).iteration(12)})
    graph = ExecutionGraph(
        GraphMetadata(layout={}, extra={"role_classes": [middle_class(12).to_json()]}), graphs
    )
    from prism_megatron.graph.classes import class_programs

    programs = class_programs(graph)
    measured = [2 * d for d in compute_durations(graphs["pp3"].streams)]
    folded = spread(programs, {"pp3": measured})
    assert folded["pp3"] == measured
    for stage in (1, 2, 4, 5, 6):
        doubled = [2 * d for d in compute_durations(graphs[f"pp{stage}"].streams)]
        assert folded[f"pp{stage}"] == doubled, stage


def test_a_parameter_gather_launch_is_its_spans_and_all_gathers_one_per_bucket_group():
    from prism_megatron.graph.classes import _Item, _launch_head
    from prism_megatron.graph.schema import COMPUTE_STREAM, NodeType, Op
    from prism_megatron.replay.schedule import OpKind

    span = _Item(COMPUTE_STREAM, Op(type=NodeType.COMPUTE), ())
    gather = _Item("async-dp", Op(type=NodeType.COLLECTIVE, comm=OpKind.ALL_GATHER, group="dp", seq=0), ())
    reduce = _Item(
        "async-dp", Op(type=NodeType.COLLECTIVE, comm=OpKind.REDUCE_SCATTER, group="dp", seq=0), ()
    )
    tp = _Item(COMPUTE_STREAM, Op(type=NodeType.COLLECTIVE, comm=OpKind.ALL_GATHER, group="tp", seq=0), ())
    # a dense and an expert bucket group: span, gather, span, gather, then the step's own first span
    items = [span, gather, span, gather, span, tp, span]
    assert _launch_head(items, range(len(items))) == range(0, 4)
    assert _launch_head([span, gather, span, tp], range(4)) == range(0, 2)
    assert _launch_head([span, tp, span], range(3)) == range(0)  # a step without a launch
    assert _launch_head([span, reduce, span], range(3)) == range(0)  # not an all-gather
    assert _launch_head([span, gather, reduce, span], range(4)) == range(0)
