"""Patches a modelled GPU needs for MoE: balanced routing where the token dispatcher reads its counts.

On a modelled GPU (`--prism-device model:<gpu>`) the program runs on fake tensors, which hold no data.
megatron-core's MoE token dispatchers (the ones it runs without Transformer Engine: all-to-all and
all-gather) read the number of tokens each expert receives out of the routing map: as the split sizes
of the expert-parallel all-to-all and of the tensor-parallel all-gather (`.numpy()`, `.tolist()`), as
the chunks the tokens are sorted and split into per local expert (`.tolist()`), and as the output
length of `masked_select` in the token permutation (megatron-core 0.16; 0.19 permutes with a
fixed-length `argsort`). None of these exist on fake tensors.

The stand-in is balanced routing (`balanced_counts`): every rank of the expert-and-tensor-parallel
group routes its T tokens x topk over the E experts as evenly as integers allow, floor(T k / E) each,
and the remainder one token more to as many experts, starting at expert (g x remainder) mod E for the
rank at place g of the group, so the remainders of the group go round the experts. Every rank derives
every other rank's counts from the same rule, so the all-to-all split sizes agree across ranks as the
real gather of counts would make them. With `--moe-expert-capacity-factor` each count is capped at
the capacity (megatron-core's `get_capacity`); padded to capacity (`--moe-pad-expert-input-to-capacity`)
the counts are static and nothing is replaced. The GPU program still runs every op around the counts
(the routing map's sum, the all-gather of counts, the permutation): only the values read are the
stand-in's. The simulation's `--expert-imbalance` what-if is a separate knob on the simulated graph.

No extension point reaches these reads: the counts are attributes the dispatcher computes and reads
within its own methods. The records replace the one method of each dispatcher that computes them and
run the original around it; they are applied only on a modelled device (`patches/modelled_device.py`:
`ALL_RECORDS`), so a CPU or CUDA run routes by its data as without prism.

Versions: run on 0.16.1. The 0.19 variants were checked against core_v0.19.0's source (the dispatchers'
`preprocess` and `dispatch_postprocess` are unchanged; `permute` selects by argsort, `sort_chunks_by_idxs`
still reads `.tolist()`), not yet run there.
"""

from __future__ import annotations

import functools
from collections.abc import Callable
from typing import Any

import numpy as np
import torch
from torch._subclasses.fake_tensor import FakeTensor
from torch.utils._python_dispatch import TorchDispatchMode

from prism_megatron.patches.registry import Patch, variants
from prism_megatron.patches.versions import EVERY_VERIFIED, MEGATRON_CORE_0_16, MEGATRON_CORE_0_19

_DISPATCHER = "megatron.core.transformer.moe.token_dispatcher"
_MOE_UTILS = "megatron.core.transformer.moe.moe_utils"


def balanced_counts(num_routed: int, num_experts: int, *, first: int = 0) -> list[int]:
    """`num_routed` token-to-expert assignments spread over `num_experts` experts as evenly as integers
    allow: each gets num_routed // num_experts, and the remainder one more each, given to the experts
    from `first` on (cyclically)."""
    base, remainder = divmod(num_routed, num_experts)
    return [base + int((expert - first) % num_experts < remainder) for expert in range(num_experts)]


def group_counts(
    num_tokens: int, *, topk: int, num_experts: int, group_size: int, capacity: int | None = None
) -> np.ndarray:
    """[group_size, num_experts]: what each rank of the expert-and-tensor-parallel group routes to each
    expert under balanced routing (`balanced_counts`, the remainder of the rank at place g starting
    at expert g x remainder), every rank routing its `num_tokens` tokens to `topk` experts; capped at
    `capacity` when the router drops tokens over it."""
    num_routed = num_tokens * topk
    remainder = num_routed % num_experts
    counts = np.array(
        [balanced_counts(num_routed, num_experts, first=place * remainder) for place in range(group_size)],
        dtype=np.int64,
    )
    return np.minimum(counts, capacity) if capacity is not None else counts


class _KnownSelections(TorchDispatchMode):
    """`masked_select` on fake tensors, whose output length is a data read: served with the number of
    elements the balanced routing selects (`num_selected`). The stand-in is the first `num_selected`
    elements of the broadcast values (their shape, dtype and device; fake tensors have no values)."""

    def __init__(self, num_selected: int, *, reads_count: bool = False) -> None:
        super().__init__()
        self.num_selected = int(num_selected)
        self.reads_count = reads_count
        """Also answer every value read (`.item()`) with `num_selected`: in a scope whose only read is
        the number of routed tokens (megatron-core 0.19's all-gather dispatcher)."""

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        if func is torch.ops.aten.masked_select.default:
            values, _ = torch.broadcast_tensors(*args)
            return values.reshape(-1).narrow(0, 0, self.num_selected).clone()
        if self.reads_count and func is torch.ops.aten._local_scalar_dense.default:
            return self.num_selected
        return func(*args, **(kwargs or {}))


def _capacity(config, num_tokens: int, num_experts: int) -> int | None:
    """The router's per-expert capacity of `num_tokens` local tokens (None: dropless)."""
    if config.moe_router_padding_for_quantization:
        raise NotImplementedError(
            "--moe-router-padding-for-quantization (or -for-fp8) on a modelled GPU: the padded routing map has "
            "no balanced stand-in; drop the flag"
        )
    if config.moe_expert_capacity_factor is None:
        return None
    from megatron.core.transformer.moe.moe_utils import get_capacity

    return get_capacity(
        num_tokens=num_tokens * config.moe_router_topk,
        num_experts=num_experts,
        capacity_factor=config.moe_expert_capacity_factor,
    )


def _balanced_alltoall_counts(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def preprocess(self, routing_map: torch.Tensor) -> Any:
        tokens_per_local_expert = original(self, routing_map)
        if self.drop_and_pad or not isinstance(routing_map, FakeTensor):
            return tokens_per_local_expert  # static counts, or a tensor with data to read
        from megatron.core import utils

        place = utils.get_pg_rank(self.tp_ep_group)  # where megatron-core's gather of counts puts it
        return set_balanced_alltoall_counts(self, routing_map.size(0), place=place)

    return preprocess


def set_balanced_alltoall_counts(dispatcher, num_tokens: int, *, place: int) -> np.ndarray:
    """Set the all-to-all dispatcher's count metadata to balanced routing (NumPy, as a GPU run's
    device-to-host copies leave it) and return the tokens per local expert.

    Args:
        dispatcher: a `MoEAlltoAllTokenDispatcher` (what `preprocess` sets: input_splits,
            output_splits, output_splits_tp, num_global_tokens_per_local_expert, num_out_tokens).
        num_tokens: the tokens this rank routes (the routing map's rows).
        place: this rank's place in the tp_ep group (ep rank x tp size + tp rank).
    """
    config = dispatcher.config
    num_experts, num_local = dispatcher.num_experts, dispatcher.num_local_experts
    tp_size, ep_size = dispatcher.tp_size, dispatcher.ep_size
    capacity = _capacity(config, num_tokens, num_experts)
    # [ep, tp, E]: the order of megatron-core's gather of counts over the tp_ep group.
    counts = group_counts(
        num_tokens, topk=config.moe_router_topk, num_experts=num_experts, group_size=tp_size * ep_size,
        capacity=capacity,
    ).reshape(ep_size, tp_size, num_experts)  # fmt: skip
    own = counts.reshape(ep_size * tp_size, num_experts)[place]
    if capacity is not None:
        dispatcher.num_out_tokens = int(own.sum())
    first = dispatcher.local_expert_indices[0]
    # [tp, ep, local experts]: what every rank sends to this rank's experts.
    to_local = counts.transpose(1, 0, 2)[:, :, first : first + num_local]
    if ep_size > 1 or tp_size > 1:
        per_rank = to_local.sum(axis=2)  # [tp, ep]
        dispatcher.input_splits = own.reshape(ep_size, num_local).sum(axis=1)
        dispatcher.output_splits = per_rank[dispatcher.tp_rank]
        dispatcher.output_splits_tp = per_rank.sum(axis=1)
    if num_local > 1:
        dispatcher.num_global_tokens_per_local_expert = to_local.reshape(-1, num_local)
        # Built from Python numbers at construction: on a GPU their values are these.
        chunks = np.arange(num_experts * tp_size)
        dispatcher.sort_input_by_local_experts = chunks.reshape(-1, num_local).T.ravel()
        dispatcher.restore_output_by_local_experts = chunks.reshape(num_local, -1).T.ravel()
    return to_local.sum(axis=(0, 1))


BALANCED_ALLTOALL = Patch(
    name="modelled.moe_alltoall_counts",
    target=f"{_DISPATCHER}:MoEAlltoAllTokenDispatcher.preprocess",
    make=_balanced_alltoall_counts,
    verified_on=EVERY_VERIFIED,
    reason="--prism-device model:<gpu> with --moe-token-dispatcher-type alltoall: the all-to-all split "
    "sizes and tokens per expert are read out of the routing map, which fake tensors cannot; after the "
    "original (its ops and the all-gather of counts run), they are set to balanced routing",
    signature="(self, routing_map: torch.Tensor) -> torch.Tensor",
)


def _permute_known_length(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def permute(tokens, routing_map, probs=None, num_out_tokens=None, *args: Any, **kwargs: Any) -> Any:
        if isinstance(routing_map, FakeTensor) and isinstance(num_out_tokens, (int, np.integer)):
            with _KnownSelections(num_out_tokens):
                return original(tokens, routing_map, probs, num_out_tokens, *args, **kwargs)
        return original(tokens, routing_map, probs, num_out_tokens, *args, **kwargs)

    return permute


PERMUTE: tuple[Patch, ...] = variants(
    name="modelled.moe_permute",
    target=f"{_MOE_UTILS}:permute",
    make=_permute_known_length,
    importers=(_DISPATCHER,),
    reason="--prism-device model:<gpu>: megatron-core 0.16's token permutation selects the routed tokens "
    "with masked_select, whose output length is a data read fake tensors refuse; every token is routed "
    "to topk experts, so the length is the `num_out_tokens` the dispatcher passes, and the selection is "
    "served with it (0.19 permutes with a fixed-length argsort: the record passes through)",
    by_release={
        MEGATRON_CORE_0_16: {
            "signature": "(tokens: torch.Tensor, routing_map: torch.Tensor, probs: Optional[torch.Tensor] = None, "
            "num_out_tokens: Optional[int] = None, fused: bool = False, drop_and_pad: bool = False) "
            "-> Tuple[torch.Tensor, Optional[torch.Tensor], torch.Tensor]"
        },
        MEGATRON_CORE_0_19: {"signature": None},
    },
)


def _balanced_allgather_counts(original: Callable[..., Any]) -> Callable[..., Any]:
    @functools.wraps(original)
    def dispatch_postprocess(self, hidden_states: torch.Tensor, probs: torch.Tensor) -> Any:
        if not isinstance(hidden_states, FakeTensor):
            return original(self, hidden_states, probs)
        tokens_per_local_expert = _allgather_local_counts(self, hidden_states.shape[0])
        with _KnownSelections(int(tokens_per_local_expert.sum()), reads_count=True):
            permuted, _, local_probs = original(self, hidden_states, probs)
        return permuted, tokens_per_local_expert, local_probs

    return dispatch_postprocess


def _allgather_local_counts(dispatcher, num_gathered: int) -> np.ndarray:
    """Tokens per local expert of the all-gather dispatcher under balanced routing: the gathered
    tokens are every tp_ep rank's `num_gathered / (tp x ep)`, each routed as `group_counts` says."""
    group_size = dispatcher.tp_size * dispatcher.ep_size
    num_experts = dispatcher.config.num_moe_experts
    num_tokens = num_gathered // group_size
    counts = group_counts(
        num_tokens, topk=dispatcher.router_topk, num_experts=num_experts, group_size=group_size,
        capacity=_capacity(dispatcher.config, num_tokens, num_experts),
    )  # fmt: skip
    first = dispatcher.local_expert_indices[0]
    return counts[:, first : first + dispatcher.num_local_experts].sum(axis=0)


BALANCED_ALLGATHER = Patch(
    name="modelled.moe_allgather_counts",
    target=f"{_DISPATCHER}:MoEAllGatherTokenDispatcher.dispatch_postprocess",
    make=_balanced_allgather_counts,
    verified_on=EVERY_VERIFIED,
    reason="--prism-device model:<gpu> with --moe-token-dispatcher-type allgather: the tokens per local "
    "expert are read out of the gathered routing map and the local tokens selected by it, which fake "
    "tensors cannot; the original runs with the selections (and 0.19's read of their count) served by "
    "balanced routing, and returns its tokens per local expert",
    signature="(self, hidden_states, probs)",
)

RECORDS: tuple[Patch, ...] = (BALANCED_ALLTOALL, BALANCED_ALLGATHER, *PERMUTE)
