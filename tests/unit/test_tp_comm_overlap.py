"""--tp-comm-overlap on a modelled GPU: TE's userbuffers overlap, as the graph and the simulation see it.

One process is rank 0 of a TP4 world (its peers virtual). A stand-in of a transformer layer's
sequence-parallel linear layers issues megatron-core's collectives (all-gather before the
column-parallel GEMM, reduce-scatter after the row-parallel one, and that reduce-scatter's backward
all-gather before the dgrad GEMM) on fake tensors timed by the GPU model; the recorded iteration
becomes the role's streams and is simulated, with and without the overlap.
"""

from __future__ import annotations

import collections
import warnings

import pytest
import torch
import torch.distributed as dist

from prism_megatron import backend, gpu_model, replay
from prism_megatron.graph.capture import CapturedIteration, GroupNames, iteration_streams
from prism_megatron.graph.schema import (
    COMPUTE_STREAM,
    ExecutionGraph,
    GraphMetadata,
    NodeType,
    RoleGraph,
)
from prism_megatron.graph.world import ExplicitWorld
from prism_megatron.megatron.entry import arguments as pretrain_args
from prism_megatron.megatron.run.modelled_device import ModelledDevice
from prism_megatron.megatron.run.tp_overlap import PIPELINE_SPLITS, TpCommOverlap
from prism_megatron.replay import timeline
from prism_megatron.sim import AlphaBetaCost, simulate

TP = 4
TOKENS, HIDDEN = 8192, 4096
WORLD = ExplicitWorld(["tp-rank"] * TP, {"tp": [list(range(TP))]})
COST = AlphaBetaCost(latency_ns=5_000.0, ns_per_byte=1 / 150.0)  # 150 GB/s a link: NVLink-like


@pytest.fixture
def tp_group():
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's renamed collectives
    backend.activate(world_size=TP, virtual_rank=0, real_ranks=[0])
    yield dist.group.WORLD
    backend.deactivate()


class _ReduceScatterToSequenceParallelRegion(torch.autograd.Function):
    """megatron-core's mapping of that name (tensor_parallel/mappings.py): reduce-scatter forward,
    all-gather backward, both blocking."""

    @staticmethod
    def forward(ctx, x):
        out = x.new_empty(x.shape[0] // TP, *x.shape[1:])
        dist.reduce_scatter_tensor(out, x)
        return out

    @staticmethod
    def backward(ctx, grad):
        out = grad.new_empty(grad.shape[0] * TP, *grad.shape[1:])
        dist.all_gather_into_tensor(out, grad.contiguous())
        return out


class _Column(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(3 * HIDDEN // TP, HIDDEN, dtype=torch.bfloat16))

    def forward(self, x):
        total = x.new_empty(x.shape[0] * TP, *x.shape[1:])
        dist.all_gather_into_tensor(total, x.detach())
        return total @ self.weight.t()


class _Row(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.weight = torch.nn.Parameter(torch.empty(HIDDEN, 3 * HIDDEN // TP, dtype=torch.bfloat16))

    def forward(self, x):
        return _ReduceScatterToSequenceParallelRegion.apply(x @ self.weight.t())


class _Layer(torch.nn.Module):
    def __init__(self) -> None:
        super().__init__()
        self.linear_qkv, self.linear_proj = _Column(), _Row()

    def forward(self, x):
        return self.linear_proj(self.linear_qkv(x))


def _iteration(overlap: bool) -> tuple[RoleGraph, ModelledDevice]:
    device = ModelledDevice("h100")
    with device.active():
        layer = _Layer()
        if overlap:
            device.tp_overlap = TpCommOverlap(device, TP)
            assert device.tp_overlap.install([layer]) == 2
        x = torch.empty(TOKENS // TP, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
        replay.start_recording()
        start = timeline.mark()
        layer(x).sum().backward()
        end = timeline.mark()
        events = tuple(replay.stop_recording())
        start_ns, end_ns = timeline.resolve([start, end])
    iteration = CapturedIteration(start_ns, end_ns, events)
    streams = iteration_streams(iteration, GroupNames(WORLD, 0, ("tp",)))
    return RoleGraph(role="tp-rank", streams=streams), device


def _simulated_ns(role: RoleGraph) -> int:
    graph = ExecutionGraph(metadata=GraphMetadata(layout={"world_size": TP}), roles={role.role: role})
    return simulate(graph, WORLD, COST).iteration_time_ns


def _collectives(role: RoleGraph) -> collections.Counter:
    return collections.Counter(
        (op.comm.name, op.size_bytes, op.seq)
        for ops in role.streams.values()
        for op in ops
        if op.type == NodeType.COLLECTIVE
    )


def test_without_the_flag_every_tp_collective_blocks_the_compute_stream(tp_group):
    role, device = _iteration(overlap=False)
    assert list(role.streams) == [COMPUTE_STREAM]
    assert "tp_comm_overlap" not in device.summary()


def test_with_the_flag_the_collectives_move_to_a_side_stream_with_their_bytes_and_wait_in_their_gemm(
    tp_group,
):
    plain, _ = _iteration(overlap=False)
    overlapped, device = _iteration(overlap=True)
    # Every collective stays in the graph, with its full bytes and its sequence number.
    assert _collectives(overlapped) == _collectives(plain)
    gathered = TOKENS * HIDDEN * 2
    assert {size for _, size, _ in _collectives(plain)} == {gathered}
    # ... now posted on the TP side stream: the forward all-gather, the reduce-scatter, and the
    # reduce-scatter's backward all-gather.
    side = [op.comm.name for op in overlapped.streams["async-world"]]  # the TP group is the world
    assert side == ["ALL_GATHER", "REDUCE_SCATTER", "ALL_GATHER"]
    assert device.summary()["tp_comm_overlap"] == {
        "overlapped": {"all_gather": 2, "reduce_scatter": 1},
        "unpaired": 0,
    }
    compute = overlapped.streams[COMPUTE_STREAM]
    waits = [i for i, op in enumerate(compute) if op.type == NodeType.WAIT]
    assert len(waits) == 3
    gpu = gpu_model.gpu_spec("h100")
    column_ns = gpu_model.gemm_time(gpu, TOKENS, 3 * HIDDEN // TP, HIDDEN, torch.bfloat16)
    row_ns = gpu_model.gemm_time(gpu, TOKENS, HIDDEN, 3 * HIDDEN // TP, torch.bfloat16)
    grad, weight, saved = (torch.empty(n, k, dtype=torch.bfloat16, device="meta") for n, k in
                           ((TOKENS, HIDDEN), (HIDDEN, 3 * HIDDEN // TP), (TOKENS, 3 * HIDDEN // TP)))  # fmt: skip
    mm = torch.ops.aten.mm.default
    # Autograd's mm backward runs the weight's and the input's gradient GEMMs in its own order.
    backward_ns = {gpu_model.op_time(gpu, mm, (a, b), {}, mm(a, b)).time_ns for a, b in
                   ((grad, weight), (grad.t(), saved))}  # fmt: skip
    # Ring exchange: the all-gather is waited before the GEMM's last of TP chunks.
    assert compute[waits[0] - 1].duration_ns == column_ns - column_ns // TP
    # After the wait: that last chunk, then the row GEMM's first chunk before its reduce-scatter.
    assert compute[waits[0] + 1].duration_ns == column_ns // TP + row_ns // PIPELINE_SPLITS
    # Pipeline: the reduce-scatter is waited when the row GEMM ends (a nanosecond for its issue).
    assert compute[waits[1] - 1].duration_ns == row_ns - row_ns // PIPELINE_SPLITS + 1
    # Backward: the gathered output gradient feeds the dgrad GEMM the same way.
    assert compute[waits[2] - 1].duration_ns in {ns - ns // TP for ns in backward_ns}


def test_the_overlapped_iteration_is_shorter_and_no_shorter_than_its_compute(tp_group):
    plain, _ = _iteration(overlap=False)
    overlapped, _ = _iteration(overlap=True)
    plain_ns, overlapped_ns = _simulated_ns(plain), _simulated_ns(overlapped)
    compute_ns = sum(op.duration_ns for op in plain.streams[COMPUTE_STREAM])
    assert overlapped_ns < plain_ns
    assert overlapped_ns >= compute_ns  # the overlap hides communication, never compute


@pytest.mark.parametrize(
    ("flags", "why"),
    [
        (("--tensor-model-parallel-size", "4"), "it is not set"),
        (("--sequence-parallel",), "--tensor-model-parallel-size 1 turns sequence parallelism off"),
    ],
)
def test_the_flag_needs_sequence_parallelism_and_tp_above_one_as_megatron_lm_says(flags, why):
    base = ("--num-layers", "2", "--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32",
            "--micro-batch-size", "1", "--train-iters", "1")  # fmt: skip
    with pytest.raises(ValueError, match=r"--tp-comm-overlap needs --sequence-parallel and "
                       r"--tensor-model-parallel-size > 1 .*" + why.replace("-", r"\-")):  # fmt: skip
        pretrain_args.parse([*base, *flags, "--tp-comm-overlap"])
    args = pretrain_args.parse([*base, "--tensor-model-parallel-size", "4", "--sequence-parallel",
                                "--tp-comm-overlap"])  # fmt: skip
    assert args.tp_comm_overlap


def test_the_overlap_model_refuses_tp_one():
    with pytest.raises(ValueError, match="--tp-comm-overlap needs --tensor-model-parallel-size > 1"):
        TpCommOverlap(ModelledDevice("h100"), 1)


def _entry_state(*, flag: bool, device: ModelledDevice | None, capsys) -> str:
    from types import SimpleNamespace

    from prism_megatron.megatron.entry import pretrain
    from prism_megatron.megatron.run import modelled_fusions

    args = SimpleNamespace(tp_comm_overlap=flag, tensor_model_parallel_size=TP)
    emulation = SimpleNamespace(emulate=False, device="cpu")
    rt = SimpleNamespace(config=SimpleNamespace(emulation=emulation), virtual_rank=0)
    capsys.readouterr()  # what importing the entry warned
    if device is not None:  # the entry's modelled path (`charge_as_a_gpu_runs`), its TP-overlap step
        modelled_fusions.overlap_tp_comm(device, [_Layer()], args)
    else:
        pretrain._tp_comm_overlap_note(args, rt)
    return capsys.readouterr().err


def test_the_entry_models_the_overlap_only_with_the_flag_and_notes_it_elsewhere(capsys):
    device = ModelledDevice("h100")
    with device.fake_mode:
        assert _entry_state(flag=False, device=device, capsys=capsys) == ""
        assert device.tp_overlap is None
        assert _entry_state(flag=True, device=device, capsys=capsys) == ""
        assert isinstance(device.tp_overlap, TpCommOverlap)
    note = _entry_state(flag=True, device=None, capsys=capsys)
    assert "--tp-comm-overlap is modelled only on --prism-device model:<gpu>; on a cpu or cuda" in note
    assert _entry_state(flag=False, device=None, capsys=capsys) == ""
