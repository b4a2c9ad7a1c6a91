"""Keep control flow real on a rank whose peers are virtual (ARCHITECTURE.md decision 4).

Collectives with virtual members are the backend's business: it answers them with the data policy.
A few places in megatron-core, though, take a decision from data that only a specific peer holds,
and no data policy can answer for a peer whose role is not among the real ranks. Each is a record
here, applied only when emulating.

- Tied embeddings: the last stage zeroes its copy of the word embeddings and all-reduces it with the
  first stage to receive the first stage's initial values. When the first stage is virtual, the
  sum is zeros (fake backend) or this rank's zeros mirrored (prism backend), and the last stage
  would train with a zero output layer (grad norm 0 was seen). The fix initialises the copy the way
  the first stage initialises its embedding (same init method, same distribution), after the real
  all-reduce was issued, so the sequence of collectives is unchanged.
- fp16 overflow: with dynamic loss scaling, a rank that finds an inf or NaN in its unscaled grads
  skips the optimizer step, and every rank of the real job skips it with it (the flag is a MAX over
  the model-parallel group). Emulated, the virtual members of that group answer with this rank's own
  flag, so one stage skips while another steps: the roles' graphs then disagree on the collectives
  of the step (grad norm, ...) and the job's graph deadlocks. So where that group has virtual
  members, no rank skips: the non-finite entries of the unscaled grads are zeroed, the loss scale
  backs off as it would after the overflow, and the step is taken (the steady state of a job whose
  scale has settled). Where every member is real, Megatron's own decision stands.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import torch
import torch.distributed as dist

from prism_megatron.passes.world import VirtualWorld
from prism_megatron.patches.registry import Patch
from prism_megatron.patches.versions import EVERY_VERIFIED


def _needs_first_stage_values(module: Any, world: VirtualWorld) -> bool:
    tied_head = module.share_embeddings_and_output_weights and module.post_process
    if not ((tied_head or getattr(module, "mtp_process", False)) and not module.pre_process):
        return False
    if module.config.pipeline_model_parallel_size == 1 or not dist.is_initialized():
        return False
    embedding_ranks = dist.get_process_group_ranks(module.embd_group)
    return not world.is_real(embedding_ranks[0])


def _tied_embedding_fix(original: Callable[..., Any], *, world: VirtualWorld) -> Callable[..., Any]:
    def setup_embeddings_and_output_layer(self) -> None:
        original(self)
        if not _needs_first_stage_values(self, world):
            return
        from megatron.core.tensor_parallel import get_cuda_rng_tracker

        init_method = self.config.embedding_init_method or self.config.init_method
        weight = self.shared_embedding_or_output_weight()
        with torch.no_grad(), get_cuda_rng_tracker().fork():
            init_method(weight.data)

    return setup_embeddings_and_output_layer


def _group_is_real(group: Any, world: VirtualWorld) -> bool:
    return all(world.is_real(rank) for rank in dist.get_process_group_ranks(group))


def _overflow_fix(original: Callable[..., Any], *, world: VirtualWorld) -> Callable[..., Any]:
    def prepare_grads(self) -> bool:
        found_inf = original(self)  # megatron-core's check, and its one loss-scale update for it
        if not found_inf or _group_is_real(self.get_grad_stats_parallel_group(), world):
            return found_inf  # every member's flag was real: Megatron's own decision stands
        if not self.is_stub_optimizer:
            with torch.no_grad():
                for grad in self._collect_main_grad_data_for_unscaling():
                    torch.nan_to_num_(grad, nan=0.0, posinf=0.0, neginf=0.0)
        return False

    return prepare_grads


CORE_FIXES: tuple[Patch, ...] = (
    Patch(
        name="megatron.tied_embedding_from_virtual_first_stage",
        target="megatron.core.models.common.language_module.language_module:LanguageModule.setup_embeddings_and_output_layer",
        make=_tied_embedding_fix,
        needs=("world",),
        verified_on=EVERY_VERIFIED,
        reason="the last stage's tied output weight (or the embedding of its MTP layers) gets its initial "
        "values from the first stage by an all-reduce of zeros; with a virtual first stage it would stay "
        "zero, so it is initialised as the first stage initialises its embedding",
        signature="(self) -> None",
    ),
    Patch(
        name="megatron.fp16_overflow_takes_the_step",
        target="megatron.core.optimizer.optimizer:MixedPrecisionOptimizer.prepare_grads",
        make=_overflow_fix,
        needs=("world",),
        verified_on=EVERY_VERIFIED,
        reason="an fp16 overflow skips the step on the rank that found it, and virtual members answer "
        "its flag with the rank's own, so stages of one job would disagree on the step's collectives; "
        "where the model-parallel group has virtual members the non-finite grads are zeroed, the loss "
        "scale backs off and the step is taken",
        signature="(self) -> bool",
    ),
)
"""The megatron-core control-flow fixes (bound to the run's virtual world)."""
