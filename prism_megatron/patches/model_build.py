"""Building megatron-core's models where megatron-core assumes CUDA or Transformer Engine.

Two builds need it: the memory plan builds every rank's model, DDP buffers and optimizer shard on the
meta device (`prism_megatron.megatron.plan.build`), and the built-in entry builds multi-latent
attention on megatron-core's local layers (`prism_megatron.megatron.layers.local_mla`). Each change
is a record, applied only for the duration of a build (`building_on`, `mla_constructible`):

* `build.current_device`, `build.tensor_cuda`: while building a model and its DDP wrapper
  (megatron-core 0.16.1 and 0.19), megatron-core reaches for CUDA with no extension point to choose
  the device: `torch.cuda.current_device()` as the device of the DDP buffers (param_and_grad_buffer.py)
  and of MLA's YaRN rotary table, and `Tensor.cuda()` in the initial sync of a tied or MTP embedding
  on the last stage (language_module.py). Both are bound to the build's device (meta for the plan).
* `build.mla_have_te`: megatron-core 0.16.1's `multi_latent_attention.py` sets `HAVE_TE = True`
  whenever megatron's own TE extension module imports, which it does without Transformer Engine (its
  classes are then placeholders that are not types), and MLASelfAttention's
  `isinstance(..., TELinear)` fails. While building, the flag says the truth (no TE).
* `plan.gbuf_range_map`: the plan asks the distributed optimizer which shard of each DDP buffer a
  data-parallel rank owns through its private `_build_gbuf_range_map` (no public function answers
  for a rank other than the caller's). Nothing is replaced; the record is its version gate and drift
  test (`registry.private_call`).
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from typing import Any

from prism_megatron.patches import registry
from prism_megatron.patches.registry import Patch, PrivateCall
from prism_megatron.patches.versions import EVERY_VERIFIED


def _current_device(original: Callable[[], Any], *, device: str) -> Callable[[], str]:
    def current_device() -> str:
        return device

    return current_device


def _tensor_cuda(original: Any, *, device: str) -> Callable[..., Any]:
    def cuda(tensor, *args: Any, **kwargs: Any):
        return tensor.to(device)

    return cuda


def _false(original: Any) -> bool:
    return False


BUILD_DEVICE: tuple[Patch, ...] = (
    Patch(
        name="build.current_device",
        target="torch.cuda:current_device",
        make=_current_device,
        needs=("device",),
        verified_on=EVERY_VERIFIED,
        reason="megatron-core puts DDP buffers and MLA's YaRN rotary table on torch.cuda.current_device(), "
        "with no parameter to choose another; a build away from CUDA answers its own device",
        signature="() -> int",
    ),
    Patch(
        name="build.tensor_cuda",
        target="torch:Tensor.cuda",
        make=_tensor_cuda,
        needs=("device",),
        verified_on=EVERY_VERIFIED,
        reason="the initial sync of a tied or MTP embedding on the last stage calls Tensor.cuda(); a build "
        "away from CUDA moves to its own device instead",
        signature=None,
    ),
)
"""Bound to the device a build happens on (`device`: "meta" for the plan)."""

MLA_HAVE_TE = Patch(
    name="build.mla_have_te",
    target="megatron.core.transformer.multi_latent_attention:HAVE_TE",
    make=_false,
    verified_on=EVERY_VERIFIED,
    reason="0.16.1 sets HAVE_TE whenever megatron's TE extension module imports, which it does without "
    "Transformer Engine, and MLASelfAttention's isinstance(..., TELinear) then fails; 0.19 imports the "
    "truth from that module, so there it changes nothing",
    count_calls=False,
)

GBUF_RANGE_MAP = PrivateCall(
    name="plan.gbuf_range_map",
    target="megatron.core.optimizer.distrib_optimizer:DistributedOptimizer._build_gbuf_range_map",
    verified_on=EVERY_VERIFIED,
    reason="the plan asks the distributed optimizer which slice of each DDP buffer a data-parallel rank "
    "owns; no public function answers for a rank other than the caller's",
    signature="(param_and_grad_buffer: megatron.core.distributed.param_and_grad_buffer._ParamAndGradBuffer)",
)

RECORDS = (*BUILD_DEVICE, MLA_HAVE_TE, GBUF_RANGE_MAP)
"""Every record of this module, for the catalog."""


@contextlib.contextmanager
def building_on(device: str, *, allow_untested: bool = False) -> Iterator[registry.AppliedPatches]:
    """Where megatron-core reaches for CUDA while building, use `device`, for the block."""
    with registry.patched(
        registry.bind(BUILD_DEVICE, device=device), allow_untested=allow_untested
    ) as applied:
        yield applied


@contextlib.contextmanager
def mla_constructible(*, allow_untested: bool = False) -> Iterator[None]:
    """While building a model, `multi_latent_attention.py` knows whether Transformer Engine is present
    (nothing is applied where megatron's TE extension module reports TE)."""
    from megatron.core.extensions import transformer_engine

    if transformer_engine.HAVE_TE:
        yield
        return
    with registry.patched((MLA_HAVE_TE,), allow_untested=allow_untested):
        yield
