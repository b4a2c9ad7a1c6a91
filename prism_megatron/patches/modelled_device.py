"""Patches a modelled GPU needs: object collectives on real tensors, a gradient norm without reads.

On a modelled GPU (`--prism-device model:<gpu>`) the program runs under torch's fake tensor mode
(`megatron/run/modelled_device.py`). torch.distributed's object collectives (`all_gather_object`,
`broadcast_object_list`, ...) pickle Python objects into byte tensors and read them back with
`.numpy()`, which a fake tensor cannot do: megatron-core's optimizer exchanges its parameter-group
metadata that way. These records run those calls with the dispatch modes switched off, so their
byte tensors are real and small, exactly as without prism; tensors the program computes never go
through them. No extension point reaches them: the calls are torch.distributed's module functions.

Without Transformer Engine or apex, megatron-core's gradient norm falls back to
`local_multi_tensor_l2_norm`, which builds a tensor from the per-tensor norms' Python values (a read
of each) and then reads the total once more: impossible on fake tensors, and on a GPU it is one fused
multi-tensor kernel (apex's or Transformer Engine's `multi_tensor_l2norm`) without a read. The
record gives `clip_grads.l2_norm_impl` the same maths on tensors: one multi-tensor norm
(`torch._foreach_norm`) and the norm of the norms, a [1] float tensor as the original returns.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import torch
from torch.utils._python_dispatch import _disable_current_modes

from prism_megatron.patches.registry import Patch
from prism_megatron.patches.versions import EVERY_VERIFIED

OBJECT_COLLECTIVES = (
    "all_gather_object",
    "broadcast_object_list",
    "gather_object",
    "scatter_object_list",
    "send_object_list",
    "recv_object_list",
)


def _outside_modes(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def call(*args: Any, **kwargs: Any) -> Any:
        with _disable_current_modes():
            return original(*args, **kwargs)

    return call


RECORDS: tuple[Patch, ...] = tuple(
    Patch(
        name=f"modelled.{name}",
        target=f"torch.distributed:{name}",
        make=_outside_modes,
        verified_on=EVERY_VERIFIED,
        reason=f"--prism-device model:<gpu>: torch.distributed.{name} pickles objects into byte tensors "
        "and reads them back with .numpy(), which fake tensors cannot; it runs outside the fake mode",
    )
    for name in OBJECT_COLLECTIVES
)


def _l2_norm(original: Callable[..., Any]) -> Callable[..., Any]:
    def l2_norm(chunk_size, noop_flag, tensor_lists, per_tensor, *args):
        norms = [torch.stack(torch._foreach_norm(tensors)) for tensors in tensor_lists if tensors]
        if not norms:
            return torch.zeros(1, dtype=torch.float), None
        total = torch.linalg.vector_norm(torch.cat(norms).float())
        return total.reshape(1), None

    return l2_norm


L2_NORM = Patch(
    name="modelled.l2_norm",
    target="megatron.core.optimizer.clip_grads:l2_norm_impl",
    make=_l2_norm,
    verified_on=EVERY_VERIFIED,
    reason="--prism-device model:<gpu>: megatron-core's fallback l2 norm reads every per-tensor norm as a "
    "Python float, which fake tensors cannot; on a GPU it is one multi-tensor kernel without a read",
    count_calls=False,
)

ALL_RECORDS: tuple[Patch, ...] = (*RECORDS, L2_NORM)
