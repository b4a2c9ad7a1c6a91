"""Activation memory per rank with sequence and context parallelism, against Megatron's formula.

Megatron-LM's theoretical activation memory (`megatron/plan/theory.py`, its restatement) charges a
layer s b h (18 + 4 f / h) bytes / TP with sequence parallelism and selective recompute (Korthikanti
et al. 2022): 16-bit activations, 1-byte dropout masks, no attention scores. It ignores context
parallelism; per rank the sequence is s / CP. Here one rank of a TP 2 job with sequence parallelism,
and of a TP 2 x CP 2 job, builds the entry's decoder layers (its local layers with the sequence-
parallel norm and the context-parallel attention) in torch's fake process group (shapes are exact,
values are not needed), runs a forward pass and counts every tensor autograd keeps for the backward
that is not a parameter. The CPU differs from the formula's GPU in two known ways, added to it: torch
keeps a dropout mask in the activations' dtype (2 bytes, not 1: + 2 s b h / TP for the two hidden
dropouts), and a norm keeps float32 statistics per token (a few bytes per token, which the formula
neglects). The kept bytes equal the formula plus the masks' extra byte, within 0.5 %.
"""

from __future__ import annotations

import contextlib

import pytest
import torch
import torch.distributed as dist
from megatron.core import parallel_state, tensor_parallel
from megatron.core.models.gpt.gpt_layer_specs import get_gpt_layer_local_spec
from megatron.core.transformer.transformer_block import TransformerBlock

from prism_megatron.megatron.entry import arguments as pretrain_args
from prism_megatron.megatron.entry import model
from prism_megatron.megatron.job.job import job_from_flags
from prism_megatron.megatron.layers import parallel_spec
from prism_megatron.megatron.plan import theory
from prism_megatron.patches import cpu_shim, registry

SEQUENCE, HIDDEN, LAYERS = 128, 128, 2
MODEL = (
    "--num-layers", str(LAYERS), "--hidden-size", str(HIDDEN), "--num-attention-heads", "8",
    "--seq-length", str(SEQUENCE), "--micro-batch-size", "1", "--train-iters", "1", "--bf16",
    "--hidden-dropout", "0.1", "--attention-dropout", "0.1", "--recompute-granularity", "selective",
    "--position-embedding-type", "rope", "--vocab-size", "255",
)  # fmt: skip


@contextlib.contextmanager
def one_rank_of(world_size: int, tp: int, cp: int):
    """Rank 0 of a `world_size` job in torch's fake process group, megatron-core's groups on top."""
    from torch.testing._internal.distributed.fake_pg import FakeStore

    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        with registry.patched(cpu_shim.MEGATRON_CORE_SHIMS):
            parallel_state.initialize_model_parallel(
                tensor_model_parallel_size=tp, context_parallel_size=cp, create_gloo_process_groups=False
            )
            tensor_parallel.model_parallel_cuda_manual_seed(1234)
            yield
    finally:
        parallel_state.destroy_model_parallel()
        dist.destroy_process_group()


def kept_bytes_per_layer(flags: list[str], world_size: int) -> float:
    """Bytes autograd keeps per decoder layer (parameters excluded) on rank 0, in one forward pass."""
    args = pretrain_args.parse(flags)
    config = model.transformer_config(args)
    with one_rank_of(world_size, args.tensor_model_parallel_size, args.context_parallel_size):
        spec = parallel_spec.decoder_spec(get_gpt_layer_local_spec(), config, vp_stage=None)
        block = TransformerBlock(config, spec, post_layer_norm=False).to(torch.bfloat16)
        parameters = {p.untyped_storage().data_ptr() for p in block.parameters()}
        tokens = SEQUENCE // (args.context_parallel_size * args.tensor_model_parallel_size)
        hidden = torch.randn(tokens, 1, HIDDEN, dtype=torch.bfloat16, requires_grad=True)
        kept: dict[int, int] = {}

        def pack(tensor: torch.Tensor) -> torch.Tensor:
            storage = tensor.untyped_storage()
            if storage.data_ptr() not in parameters:
                kept[storage.data_ptr()] = storage.nbytes()
            return tensor

        with torch.autograd.graph.saved_tensors_hooks(pack, lambda tensor: tensor):
            block(hidden, attention_mask=None)
    return sum(kept.values()) / LAYERS  # the block's input is the first norm's input, as a layer's is


def formula_per_layer(flags: list[str], cp: int) -> float:
    """Megatron's per-layer term for this rank: the estimate's growth with one more layer, at the
    rank's sequence s / CP."""
    per_rank = [*flags, "--seq-length", str(SEQUENCE // cp), "--context-parallel-size", "1"]
    world = ["--prism-world-size", "2"]
    one_more = job_from_flags([*per_rank, *world, "--num-layers", str(LAYERS + 1)])
    this = job_from_flags([*per_rank, *world])
    assert "sequence parallelism and selective recompute" in theory.estimate(this, 0).activation_formula
    return theory.estimate(one_more, 0).activation_bytes - theory.estimate(this, 0).activation_bytes


@pytest.mark.parametrize(("cp", "world_size"), [(1, 2), (2, 4)], ids=["tp2-sp", "tp2-sp-cp2"])
def test_kept_activations_per_layer_are_megatrons_formula_per_rank(cp, world_size):
    flags = [
        *MODEL,
        "--tensor-model-parallel-size",
        "2",
        "--sequence-parallel",
        "--context-parallel-size",
        str(cp),
    ]
    tokens_per_tp_rank = SEQUENCE // cp // 2  # s / CP, split over TP by sequence parallelism
    cpu_masks = 2 * tokens_per_tp_rank * HIDDEN  # two hidden-dropout masks, 1 byte more per element
    expected = formula_per_layer(flags, cp) + cpu_masks
    # The norms' float32 statistics (a few bytes per token, 0.2 % here) are what remains.
    assert kept_bytes_per_layer(flags, world_size) == pytest.approx(expected, rel=5e-3)
