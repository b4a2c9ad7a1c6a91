"""The full-size memory plan: what each selected rank of a production job holds, without a GPU.

For each selected virtual rank, `plan_ranks` becomes that rank in a one-process virtual world of the
job's size (build.py), builds its real megatron-core model chunks on the meta device, wraps them
in megatron-core's DDP and asks the distributed optimizer which shard the rank owns. It reports:

* parameters: the DDP parameter buffer as allocated (distributed optimizer), or the parameters
  themselves (their dtype x count) without it;
* gradients: the DDP gradient buffer as allocated, with Megatron's bucket padding;
* optimizer state: fp32 main parameters of the owned shard (for 16-bit training), fp32 gradient copies
  when gradients are reduced in 16-bit (made at the step, freed at the next zero_grad), and the
  optimizer's moments (Adam: two, SGD with momentum: one) in fp32;
* activations: an estimate for the configured recompute (activations.py);
and, beside it, Megatron-LM's own theoretical estimate for the rank and where the two differ
(theory.py). Every number carries its source.

Not counted: the per-parameter `step` scalars of torch's Adam fallback (absent with fused Adam),
buffers that are not parameters (rotary tables, MoE expert bias), CUDA context and allocator overheads.
"""

from __future__ import annotations

import dataclasses
import time

import torch
from megatron.core import parallel_state
from megatron.core.transformer.moe.moe_layer import MoELayer

from prism_megatron.megatron.job.job import Job, transformer_config
from prism_megatron.megatron.plan import activations, theory
from prism_megatron.megatron.plan import build as plan_build
from prism_megatron.topology import Layout

_FP32_BYTES = 4


@dataclasses.dataclass(frozen=True, kw_only=True)
class Quantity:
    bytes: int
    source: str


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankPlan:
    """What one virtual rank of the job holds, by category, each number with its source."""

    virtual_rank: int
    coords: dict[str, int]
    num_params: int
    parameters: Quantity
    gradients: Quantity
    optimizer_main_params: Quantity
    optimizer_grad_copies: Quantity
    optimizer_moments: Quantity
    activations: Quantity
    buffers: list[plan_build.BufferPlan]
    chunks: list[activations.ChunkShape]
    megatron: theory.MegatronEstimate
    differences: list[str]
    seconds: float
    built_as: int
    """The rank of the same stage whose build this plan uses (itself when it was built as itself)."""

    @property
    def optimizer_bytes(self) -> int:
        return (
            self.optimizer_main_params.bytes + self.optimizer_grad_copies.bytes + self.optimizer_moments.bytes
        )

    @property
    def static_bytes(self) -> int:
        """Parameters + gradients + optimizer state: what Megatron calls weight and optimizer memory."""
        return self.parameters.bytes + self.gradients.bytes + self.optimizer_bytes

    @property
    def total_bytes(self) -> int:
        return self.static_bytes + self.activations.bytes


def _chunk_shape(chunk: torch.nn.Module) -> activations.ChunkShape:
    model = chunk.module if hasattr(chunk, "module") else chunk
    layers = list(model.decoder.layers)
    num_moe = sum(isinstance(layer.mlp, MoELayer) for layer in layers)
    mtp = getattr(model, "mtp", None)
    return activations.ChunkShape(
        num_dense_layers=len(layers) - num_moe,
        num_moe_layers=num_moe,
        has_embedding=model.pre_process,
        has_output_layer=model.post_process,
        num_mtp_layers=len(mtp.layers) if mtp is not None else 0,
    )


def _static_quantities(job: Job, buffers: list[plan_build.BufferPlan]) -> dict[str, Quantity]:
    a = job.args
    mixed = a.params_dtype != torch.float32
    param_bytes = sum(
        (b.numel_padded if b.has_param_buffer else b.num_params) * b.param_dtype.itemsize for b in buffers
    )
    grad_bytes = sum(b.numel_padded * b.grad_dtype.itemsize for b in buffers)
    owned = sum(b.owned_numel for b in buffers)
    copies = sum(b.owned_numel for b in buffers if mixed and b.grad_dtype != torch.float32)
    moments = 2 if a.optimizer == "adam" else 1
    shard = "the distributed optimizer's shard" if a.use_distributed_optimizer else "all parameters"
    return {
        "parameters": Quantity(
            bytes=param_bytes,
            source="DDP parameter buffer (padded)" if a.use_distributed_optimizer else "model parameters",
        ),
        "gradients": Quantity(bytes=grad_bytes, source="DDP gradient buffer (padded)"),
        "optimizer_main_params": Quantity(
            bytes=owned * _FP32_BYTES if mixed else 0, source=f"fp32 main parameters of {shard}"
        ),
        "optimizer_grad_copies": Quantity(
            bytes=copies * _FP32_BYTES,
            source="fp32 copies of 16-bit gradients, from the step to the next zero_grad",
        ),
        "optimizer_moments": Quantity(
            bytes=moments * owned * _FP32_BYTES, source=f"{a.optimizer} moments (fp32) of {shard}"
        ),
    }


@dataclasses.dataclass(frozen=True)
class StageBuild:
    """One pipeline stage's model chunks and DDP wrappers, built on meta as one of its ranks."""

    virtual_rank: int
    pipeline_rank: int
    ddp_chunks: list
    chunks: list[activations.ChunkShape]
    num_params: int
    seconds: float


def build_stage(job: Job, virtual_rank: int) -> StageBuild:
    """Build `virtual_rank`'s chunks and DDP buffers in its virtual world (a few seconds at any size).

    Every rank of a pipeline stage holds tensors of the same shapes (megatron-core splits TP, CP and
    EP evenly and pads the vocabulary to a multiple of TP), so the build serves the whole stage; only
    the distributed optimizer's shard depends on the rank, and `rank_plan` computes it per rank.
    """
    started = time.perf_counter()
    config = plan_build.build_config(transformer_config(job))
    with plan_build.virtual_world(job, virtual_rank):
        pp_rank = parallel_state.get_pipeline_model_parallel_rank()
        chunks = plan_build.build_model_chunks(job, config, "meta")
        ddp = plan_build.wrap_in_ddp(job, config, chunks, "meta")
    return StageBuild(
        virtual_rank=virtual_rank,
        pipeline_rank=pp_rank,
        ddp_chunks=ddp,
        chunks=[_chunk_shape(chunk) for chunk in chunks],
        num_params=sum(p.numel() for chunk in chunks for p in chunk.parameters()),
        seconds=time.perf_counter() - started,
    )


def rank_plan(job: Job, layout: Layout, stage: StageBuild, virtual_rank: int) -> RankPlan:
    """The plan of `virtual_rank`, from its stage's build and its own data-parallel positions."""
    started = time.perf_counter()
    assert layout.coords(virtual_rank).pp == stage.pipeline_rank, "rank planned with another stage's build"
    buffers = plan_build.buffer_plans(
        stage.ddp_chunks,
        job.args.use_distributed_optimizer,
        data_parallel_rank=layout.rank_in_group("dp_cp", virtual_rank),
        expert_data_parallel_rank=layout.rank_in_group("expt_dp", virtual_rank),
        allow_untested=job.args.allow_untested_megatron,
    )
    activation = activations.estimate(job, stage.pipeline_rank, stage.chunks)
    has_output = any(shape.has_output_layer for shape in stage.chunks)
    differences = theory.differences(job, stage.pipeline_rank, has_output)
    padding = sum(b.numel_padded - b.num_params for b in buffers if b.has_param_buffer)
    if padding:
        differences.append(
            f"padding: Megatron's buckets and 64-element alignment add {padding} elements to this "
            "rank's buffers; the formula has none"
        )
    built_here = virtual_rank == stage.virtual_rank
    return RankPlan(
        virtual_rank=virtual_rank,
        coords=layout.coords(virtual_rank).as_dict(),
        num_params=stage.num_params,
        **_static_quantities(job, buffers),
        activations=Quantity(bytes=activation.bytes, source=activation.formula),
        buffers=buffers,
        chunks=stage.chunks,
        megatron=theory.estimate(job, stage.pipeline_rank),
        differences=differences,
        seconds=time.perf_counter() - started + (stage.seconds if built_here else 0.0),
        built_as=stage.virtual_rank,
    )


def plan_ranks(job: Job, virtual_ranks: list[int]) -> list[RankPlan]:
    """Plan every rank of `virtual_ranks`, building each pipeline stage once (as its first selected rank)."""
    transformer_config(job)  # megatron-core's checks, once, before any world is built
    layout = job.target.layout()
    stages: dict[int, StageBuild] = {}
    plans = []
    for rank in virtual_ranks:
        pp_rank = layout.coords(rank).pp
        if pp_rank not in stages:
            stages[pp_rank] = build_stage(job, rank)
        plans.append(rank_plan(job, layout, stages[pp_rank], rank))
    return plans
