"""A Megatron-shaped model whose compute is a calibrated sleep: ground truth for many ranks on few cores.

Fidelity needs a real multi-process run of a whole job to compare the emulation with. On a machine
with two cores, 16-64 processes of a real model would fight for the cores and measure the fight.
This model keeps everything of a training step that is not the model's arithmetic, through
megatron-core's own code, and replaces the arithmetic with sleeps:

* megatron-core's schedules (1F1B, interleaved) drive it and its P2PCommunicator carries a small
  activation between stages (a (sequence, micro-batch, hidden) tensor, as a GPT stage sends);
* each layer is the shape of a transformer layer under tensor parallelism: a copy into the TP
  region (all-reduce of the input gradient in backward), half the layer's compute, a reduction out
  of the TP region (all-reduce in forward), the other half; with TP = 1 both are identities;
* each layer holds a parameter whose gradient flows into megatron-core's DDP grad buffers, so the
  data-parallel gradient reduction (buckets, overlap) and the optimizer step are megatron-core's.

Forward sleeps `fwd_ms` per layer and backward `bwd_ms`, both times `slowdown` (a straggler). A
sleep is compute where the program issues work (`replay.timeline.compute`): on the host it sleeps,
on a device (the asynchronous test device, a GPU) it is a kernel of that length on the current
stream and the host runs ahead, as after launching real kernels. The values carried are zeros: nothing diverges, and no arithmetic costs time a sleep does not account
for. Processes mostly sleep, so many of them share a few cores without distorting each other.
"""

from __future__ import annotations

import dataclasses
import math

import torch
from megatron.core import parallel_state
from megatron.core.enums import ModelType
from megatron.core.tensor_parallel import (
    copy_to_tensor_model_parallel_region,
    reduce_from_tensor_model_parallel_region,
)
from megatron.core.transformer import TransformerConfig
from megatron.core.transformer.module import MegatronModule

from prism_megatron.replay import timeline


@dataclasses.dataclass(frozen=True, kw_only=True)
class SleepSpec:
    """The shape and timing of the sleep model (the whole job's, not one rank's)."""

    num_layers: int
    """Layers of the whole model, split evenly over pipeline stages and model chunks."""
    fwd_ms: float
    """Forward compute of one layer for one micro-batch, milliseconds."""
    bwd_ms: float
    """Backward compute of one layer for one micro-batch, milliseconds."""
    hidden_size: int = 16
    """Hidden size of the activation passed between stages."""
    seq_length: int = 8
    micro_batch_size: int = 1
    params_per_layer: int = 4096
    """Elements of each layer's parameter (its gradient is what data parallelism reduces)."""
    slowdown: float = 1.0
    """This rank's compute factor (> 1: a straggler)."""

    def __post_init__(self) -> None:
        if self.num_layers < 1:
            raise ValueError(f"SleepSpec.num_layers must be >= 1, got {self.num_layers}")
        for name in ("fwd_ms", "bwd_ms"):
            value = getattr(self, name)
            if not (math.isfinite(value) and value >= 0):
                raise ValueError(f"SleepSpec.{name} must be a finite number of ms >= 0, got {value}")
        if min(self.hidden_size, self.seq_length, self.micro_batch_size, self.params_per_layer) < 1:
            raise ValueError("SleepSpec sizes (hidden, sequence, micro-batch, parameters) must be >= 1")
        if not (math.isfinite(self.slowdown) and self.slowdown > 0):
            raise ValueError(f"SleepSpec.slowdown must be > 0, got {self.slowdown}")

    def tensor_shape(self) -> tuple[int, int, int]:
        """The activation's shape, as the schedules' `seq_length` and `micro_batch_size` give it."""
        return (self.seq_length, self.micro_batch_size, self.hidden_size)


def transformer_config(spec: SleepSpec, *, tp: int, pp: int, vpp: int | None) -> TransformerConfig:
    """The config the schedules and DDP read (fp32; megatron-core's default p2p, batched and not
    overlapped: under the interleaved schedule Megatron-LM would overlap it, so the suite's flags
    say --no-overlap-p2p-communication, `passes.job_flags`)."""
    return TransformerConfig(
        num_layers=spec.num_layers,
        hidden_size=spec.hidden_size,
        num_attention_heads=tp,  # the config requires heads divisible by TP; nothing attends
        tensor_model_parallel_size=tp,
        pipeline_model_parallel_size=pp,
        virtual_pipeline_model_parallel_size=vpp,
        params_dtype=torch.float32,
        pipeline_dtype=torch.float32,
        deallocate_pipeline_outputs=True,
        gradient_accumulation_fusion=False,
    )


class _Sleep(torch.autograd.Function):
    """Sleeps in forward and in backward; passes the activation through and gives `weight` a gradient."""

    @staticmethod
    def forward(ctx, x, weight, fwd_s: float, bwd_s: float):
        ctx.bwd_s = bwd_s
        ctx.weight_shape = weight.shape
        timeline.compute(fwd_s)
        return x.clone()

    @staticmethod
    def backward(ctx, grad):
        timeline.compute(ctx.bwd_s)
        return grad.clone(), grad.new_zeros(ctx.weight_shape), None, None


class SleepLayer(torch.nn.Module):
    """One layer: TP copy-in, first half of the compute, TP reduce-out, second half.

    Without tensor parallelism the mappings are identities and the layer is one sleep (one wake-up
    per pass instead of two: the fewer a process's wake-ups, the less processes sharing cores delay
    each other).
    """

    def __init__(self, spec: SleepSpec) -> None:
        super().__init__()
        self.tensor_parallel = parallel_state.get_tensor_model_parallel_world_size() > 1
        self.fwd_s = spec.fwd_ms * spec.slowdown / 1e3
        self.bwd_s = spec.bwd_ms * spec.slowdown / 1e3
        self.weight = torch.nn.Parameter(torch.zeros(spec.params_per_layer))
        self.weight.tensor_model_parallel = False
        if self.tensor_parallel:
            self.bias = torch.nn.Parameter(torch.zeros(1))  # the first half's own parameter
            self.bias.tensor_model_parallel = False

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        if not self.tensor_parallel:
            return _Sleep.apply(x, self.weight, self.fwd_s, self.bwd_s)
        x = copy_to_tensor_model_parallel_region(x)
        x = _Sleep.apply(x, self.bias, self.fwd_s / 2, self.bwd_s / 2)
        x = reduce_from_tensor_model_parallel_region(x)
        return _Sleep.apply(x, self.weight, self.fwd_s / 2, self.bwd_s / 2)


class SleepChunk(MegatronModule):
    """The layers of one model chunk of one pipeline stage, with the schedules' input hook."""

    def __init__(self, config: TransformerConfig, spec: SleepSpec, *, num_layers: int, vp_stage: int | None):
        super().__init__(config=config)
        self.spec = spec
        self.vp_stage = vp_stage
        # What the schedules and finalize_model_grads ask of a GPT chunk: no embedding to share.
        self.model_type = ModelType.encoder_or_decoder
        self.pre_process = parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=vp_stage)
        self.post_process = parallel_state.is_pipeline_last_stage(ignore_virtual=False, vp_stage=vp_stage)
        self.share_embeddings_and_output_weights = False
        self.layers = torch.nn.ModuleList(SleepLayer(spec) for _ in range(num_layers))
        self.input_tensor: torch.Tensor | None = None

    def set_input_tensor(self, input_tensor) -> None:
        """What the previous stage sent (the schedules call this before every forward)."""
        if isinstance(input_tensor, list):
            input_tensor = input_tensor[0]
        self.input_tensor = input_tensor

    def forward(self, first_stage_input: torch.Tensor | None) -> torch.Tensor:
        x = first_stage_input if self.input_tensor is None else self.input_tensor
        for layer in self.layers:
            x = layer(x)
        return x


def build_chunks(spec: SleepSpec, config: TransformerConfig) -> list[SleepChunk]:
    """This rank's model chunks (one per virtual pipeline stage), after `initialize_model_parallel`.

    Raises:
        ValueError: the layers do not split evenly over stages and chunks.
    """
    pp = parallel_state.get_pipeline_model_parallel_world_size()
    vpp = config.virtual_pipeline_model_parallel_size or 1
    if spec.num_layers % (pp * vpp):
        raise ValueError(
            f"SleepSpec.num_layers {spec.num_layers} must be divisible by PP x VPP = {pp} x {vpp}"
        )
    layers = spec.num_layers // (pp * vpp)
    stages = range(vpp) if config.virtual_pipeline_model_parallel_size else [None]
    return [SleepChunk(config, spec, num_layers=layers, vp_stage=vp_stage) for vp_stage in stages]


def _sum_loss(output: torch.Tensor):
    loss = output.float().sum()
    return loss, {"loss": loss.detach().view(1)}


def forward_step(data_iterator, model):
    """The schedules' forward step: a zero input on the first chunk of the first stage."""
    chunk = model
    while not isinstance(chunk, SleepChunk):
        chunk = chunk.module
    first = parallel_state.is_pipeline_first_stage(ignore_virtual=False, vp_stage=chunk.vp_stage)
    x = torch.zeros(chunk.spec.tensor_shape()) if first else None
    return model(x), _sum_loss
