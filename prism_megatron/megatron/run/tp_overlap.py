"""`--tp-comm-overlap` on a modelled GPU: Transformer Engine's userbuffers, as the schedule sees them.

On a GPU, Megatron-LM's `--tp-comm-overlap` (with `--sequence-parallel`) makes Transformer Engine
run each sequence-parallel collective of a transformer layer's linear layers chunk by chunk with the
GEMM it feeds or drains (`transformer_engine.pytorch.module.base.initialize_ub`, its default
methods and splits): the compute stream sees about max(GEMM, communication) plus a pipeline fill,
not GEMM + communication. The built-in entry's local layers (megatron-core's `ColumnParallelLinear`
and `RowParallelLinear`) issue the same collectives with the same bytes, blocking, on the compute
stream. On a modelled device this module turns the ones TE overlaps into async ops with the wait
where TE's program waits, so the graph keeps every collective with its full bytes (an op on the
`async-tp` side stream plus a WAIT, the capture's usual async form) and the overlap comes out of the
simulation's schedule and network model:

| TE buffer (method, splits n) | megatron-core's collective | posted | waited |
|---|---|---|---|
| qkv_fprop, fc1_fprop (ring_exchange, n = TP) | all-gather of the input in the column-parallel forward | before the GEMM | before the GEMM's last chunk, (n-1)/n of it: that chunk is the pipeline fill |
| proj_dgrad, fc2_dgrad (ring_exchange, n = TP) | all-gather of the output gradient (backward of the reduce-scatter after the row-parallel layer) | before the dgrad GEMM | before the GEMM's last chunk |
| proj_fprop, fc2_fprop (pipeline, n = 4) | reduce-scatter after the row-parallel forward GEMM | after the GEMM's first chunk (the fill: chunk 1 must exist before its reduce-scatter starts) | when the GEMM ends |
| qkv/fc1 dgrad and wgrad (bulk) | the all-gather of the input for the weight gradient and the reduce-scatter of the input gradient in the column-parallel backward | megatron-core already issues both async around the dgrad and wgrad GEMMs (`LinearWithGradAccumulationAndAsyncCommunication.backward`): unchanged, with or without the flag | |

The streaming multiprocessors TE's communication kernels take from the GEMM (1 for ring exchange,
16 for pipeline and bulk, of an H100's 132) are charged by the simulation's contention term as any
communication kernel's are (`sim/contention.py`: the GPU model's measured average slowdown, not these
SM counts). Not modelled: the last reduce-scatter chunk of a pipelined overlap, exposed after the GEMM when the GEMM is the
longer (at most a quarter of the reduce-scatter); the output layer's all-gather (Megatron-LM builds
it as megatron-core's own `ColumnParallelLinear`, without userbuffers: it stays blocking).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import TYPE_CHECKING, Any

import torch
from torch._C._distributed_c10d import _create_work_from_future

if TYPE_CHECKING:
    from prism_megatron.megatron.run.modelled_device import ModelledDevice

PIPELINE_SPLITS = 4
"""Chunks of TE's "pipeline" method (proj_fprop, fc2_fprop): `num_splits` 4 in `initialize_ub`'s
default config (TransformerEngine `transformer_engine/pytorch/module/base.py`); ring exchange uses
one chunk per TP rank."""

COLUMN_LAYERS = ("linear_qkv", "linear_fc1")
"""megatron-core's names of the column-parallel layers TE gives an all-gather userbuffer (qkv, fc1)."""
ROW_LAYERS = ("linear_proj", "linear_fc2")
"""...and the row-parallel ones with a reduce-scatter userbuffer (proj, fc2)."""

ALL_GATHER = "_allgather_base_"
REDUCE_SCATTER = "_reduce_scatter_base_"
_RS_BACKWARD = "_ReduceScatterToSequenceParallelRegionBackward"


def _completed_work(result: Any):
    """A Work that is already done: what the program's own `wait()` gets while the real one waits
    for the GEMM it overlaps.

    torch's own way to make a Work of a future (`_create_work_from_future`, private but what
    `torch.distributed`'s functional and fake backends use, present since torch 2.0; verified on
    2.13), boxed as the c10d op's schema returns it (`Work.boxed`): a dispatch layer must return
    the scripted class, not the Python binding."""
    future = torch.futures.Future()
    future.set_result([result])
    return _create_work_from_future(future).boxed()


class TpCommOverlap:
    """The userbuffers overlap of one modelled device (see the module docstring).

    States: `armed` "ag" (the next all-gather is a ring exchange with the next GEMM) or "rs" (the next
    GEMM is pipelined with the reduce-scatter after it); `pending` the posted all-gather's real Work,
    waited inside the next GEMM; `rs_split` the row GEMM was logged at its first chunk's end and the
    reduce-scatter may be posted there.
    """

    def __init__(self, device: ModelledDevice, tp_size: int) -> None:
        if tp_size < 2:
            raise ValueError(f"--tp-comm-overlap needs --tensor-model-parallel-size > 1, got {tp_size}")
        self.device = device
        self.tp_size = tp_size
        self.armed: str | None = None
        self.pending = None
        self.rs_split = False
        self.num_overlapped: dict[str, int] = {"all_gather": 0, "reduce_scatter": 0}
        """Collectives posted and waited inside their GEMM, by kind."""
        self.num_unpaired = 0
        """Posted all-gathers whose next charged op was no GEMM (waited before that op: no overlap)."""

    # --- from the dispatch layer ----------------------------------------------------------------

    def collective(self, func, run) -> Any | None:
        """A c10d op: its result when this module serves it (posted async), else None (served as
        usual, after anything pending is settled). `run(async_op)` issues it to the backend."""
        name = func.overloadpacket.__name__
        if self.armed == "ag" and name != ALL_GATHER:
            self.armed = None  # not the layer's all-gather: nothing of this layer to overlap
        if self.armed == "ag":
            self.armed = None
            self.device.tick()
            tensor, self.pending = run(True)
            return (tensor, _completed_work(tensor))
        if self.rs_split and name == REDUCE_SCATTER:
            # Issued where the map reads the GEMM's first chunk's end; waited at the GEMM's end.
            self.rs_split = False
            tensor, work = run(True)
            self.device.tick()
            work.wait()
            self.num_overlapped["reduce_scatter"] += 1
            return (tensor, _completed_work(tensor))
        self.settle()
        return None

    def charged(self, time_ns: int, kind: str) -> bool:
        """An op was charged `time_ns` of `kind` (the clock is past it). True when this module logged
        the modelled time itself (the caller must not log it)."""
        if not time_ns:
            return self.rs_split  # a view of the GEMM's output: the map stays at the first chunk
        device, now_ns = self.device, self.device.clock.now_ns
        if self.pending is not None:
            # Ring exchange: the last of tp_size chunks runs after the last exchange. A GEMM that
            # did not follow its all-gather at once gets no overlap: the wait comes before it.
            if kind == "gemm":
                device.log_at(now_ns - time_ns // self.tp_size)
                self.num_overlapped["all_gather"] += 1
            else:
                device.log_at(now_ns - time_ns)
                self.num_unpaired += 1
            work, self.pending = self.pending, None
            work.wait()
            return False
        self.rs_split = False
        if self.armed == "rs" and kind == "gemm":
            self.armed = None
            device.log_at(now_ns - time_ns + time_ns // PIPELINE_SPLITS)
            self.rs_split = True
            return True
        return False

    def settle(self) -> None:
        """Before a mark or any other collective: a pending all-gather is waited here."""
        self.rs_split = False
        if self.pending is not None:
            self.device.log_time()
            work, self.pending = self.pending, None
            self.num_unpaired += 1
            work.wait()

    def summary(self) -> dict[str, Any]:
        return {"overlapped": dict(self.num_overlapped), "unpaired": self.num_unpaired}

    # --- from the model ---------------------------------------------------------------------------

    @contextlib.contextmanager
    def _armed(self, state: str) -> Iterator[None]:
        self.armed = state
        try:
            yield
        finally:
            self.armed = None

    def install(self, model_chunks) -> int:
        """Hook the transformer layers' column- and row-parallel linear layers of every chunk; returns
        how many were hooked."""
        count = 0
        for chunk in model_chunks:
            for name, module in chunk.named_modules():
                leaf = name.rsplit(".", 1)[-1]
                if leaf in COLUMN_LAYERS or leaf in ROW_LAYERS:
                    self._hook(module, "ag" if leaf in COLUMN_LAYERS else "rs")
                    count += 1
        return count

    def _hook(self, module: torch.nn.Module, state: str) -> None:
        def forward_pre(mod, args):
            self.armed = state

        def forward_post(mod, args, output):
            self.armed = None
            out = output[0] if isinstance(output, tuple) else output
            grad_fn = getattr(out, "grad_fn", None)
            if state == "rs" and grad_fn is not None and type(grad_fn).__name__ == _RS_BACKWARD:
                grad_fn.register_prehook(self._arm_backward_gather)

        module.register_forward_pre_hook(forward_pre)
        module.register_forward_hook(forward_post)

    def _arm_backward_gather(self, grad_outputs):
        """Before the backward of a row layer's reduce-scatter: its all-gather feeds the dgrad GEMM."""
        self.settle()
        self.armed = "ag"
