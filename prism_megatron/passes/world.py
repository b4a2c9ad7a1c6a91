"""Bring-up of the virtual world: a default process group of the target job's size W whose rank is
the virtual rank this process executes, plus a real gloo group among the real processes.

Megatron's own `initialize_model_parallel` then builds the exact topology on it (ARCHITECTURE.md
decision 1). The virtual world is served by the `prism` backend when `prism_megatron.backend`
provides `activate`; until then by torch's `fake` backend, which completes every collective at once
and leaves data untouched (so control flow that depends on virtual peers' data is not real on it).
This is the one function to switch when the backend lands.

The real group is this module's own: pipeline p2p between adjacent real stages uses it directly
(physical ranks), whichever backend serves the virtual world.
"""

from __future__ import annotations

import dataclasses
import datetime
import os
from typing import Any

import torch.distributed as dist

import prism_megatron.backend as prism_backend
from prism_megatron.megatron.job.target import ParallelSizes
from prism_megatron.topology.layout import embedding_ranks

REAL_GROUP_PREFIX = "prism-megatron/real"


@dataclasses.dataclass
class VirtualWorld:
    """The live virtual world of one real process."""

    world_size: int
    """W, the target job's size."""
    virtual_rank: int
    """The virtual rank this process executes (its rank in the default group)."""
    real_ranks: tuple[int, ...]
    """Virtual ranks executed by real processes, indexed by physical rank."""
    physical_rank: int
    """This process's rank among the real processes."""
    backend: str
    """'prism' or 'fake' (the fallback until the prism backend lands)."""
    real_group: Any = None
    """gloo group among the real processes (None with a single real process)."""
    activation: Any = None
    """What `prism_megatron.backend.activate` returned (None on the fake fallback)."""

    def is_real(self, virtual_rank: int) -> bool:
        return virtual_rank in self.real_ranks

    def physical_rank_of(self, virtual_rank: int) -> int:
        return self.real_ranks.index(virtual_rank)

    def close(self) -> None:
        """Tear the world down so a later one can be built in the same process (tests do)."""
        if self.activation is not None:
            self.activation.deactivate()
            self.activation = None
        elif dist.is_initialized():
            dist.destroy_process_group()
        self.real_group = None


def prism_backend_available() -> bool:
    return hasattr(prism_backend, "activate")


def rendezvous_store(timeout_s: float) -> tuple[Any, int, int]:
    """(store, physical_rank, num_real_processes) from torchrun's environment, or a private store."""
    if "MASTER_ADDR" not in os.environ:
        return dist.HashStore(), 0, 1
    store, physical_rank, num_real = next(
        dist.rendezvous("env://", timeout=datetime.timedelta(seconds=timeout_s))
    )
    store.set_timeout(datetime.timedelta(seconds=timeout_s))
    return store, physical_rank, num_real


def init_virtual_world(
    *,
    world_size: int,
    real_ranks: tuple[int, ...],
    physical_rank: int,
    store: Any,
    device: str = "cpu",
    data_policy: str = "mirror",
    timeout_s: float = 300.0,
    roles: list | None = None,
    force_fake: bool = False,
    poll_real_waits: bool = False,
) -> VirtualWorld:
    """Initialise torch.distributed as virtual rank `real_ranks[physical_rank]` of a W-rank world.
    `poll_real_waits`: see `prism_megatron.backend.activate` (a process with cores of its own).

    Raises:
        ValueError: a real rank outside [0, W), or more physical ranks than real ranks.
    """
    if not 0 <= physical_rank < len(real_ranks):
        raise ValueError(
            f"physical rank {physical_rank} has no real rank: --prism-ranks selected {len(real_ranks)} "
            "ranks; launch one process per selected rank"
        )
    bad = [r for r in real_ranks if not 0 <= r < world_size]
    if bad:
        raise ValueError(
            f"--prism-ranks selected {bad}, outside [0, {world_size}) for --prism-world-size {world_size}"
        )
    virtual_rank = real_ranks[physical_rank]
    timeout = datetime.timedelta(seconds=timeout_s)
    world = VirtualWorld(world_size, virtual_rank, tuple(real_ranks), physical_rank, backend="fake")
    if prism_backend_available() and not force_fake:
        world.backend = "prism"
        world.activation = prism_backend.activate(
            world_size=world_size,
            virtual_rank=virtual_rank,
            real_ranks=list(real_ranks),
            physical_rank=physical_rank,
            real_store=store,
            device=device,
            data_policy=data_policy,
            timeout_s=timeout_s,
            roles=roles,
            poll_real_waits=poll_real_waits,
        )
    else:
        import torch.testing._internal.distributed.fake_pg as fake_pg  # registers the 'fake' backend

        dist.init_process_group(
            "fake", store=fake_pg.FakeStore(), rank=virtual_rank, world_size=world_size, timeout=timeout
        )
    if len(real_ranks) > 1:
        prefixed = dist.PrefixStore(REAL_GROUP_PREFIX, store)
        world.real_group = dist.ProcessGroupGloo(prefixed, physical_rank, len(real_ranks), timeout)
    return world


def init_real_world(*, backend: str = "gloo", timeout_s: float = 300.0) -> None:
    """The plain default group from torchrun's environment (a real run without emulation)."""
    if dist.is_initialized():
        return
    timeout = datetime.timedelta(seconds=timeout_s)
    if "MASTER_ADDR" in os.environ:
        dist.init_process_group(backend, timeout=timeout)
    else:  # one process started by hand
        dist.init_process_group(backend, store=dist.HashStore(), rank=0, world_size=1, timeout=timeout)


def initialize_groups(
    sizes: ParallelSizes, *, hierarchical_context_parallel_sizes: list[int] | None = None
) -> None:
    """megatron-core's own `initialize_model_parallel` for the target job's sizes, over the current
    default process group (the virtual world, a fake one, or a real one), with Megatron-LM's embedding
    groups (`pretrain_gpt.py`'s rule: an untied last stage leaves them unless it holds MTP layers; the
    core's default keeps it in). No gloo groups: the entry and the plan never use them, and a fake
    store cannot hold them."""
    from megatron.core import parallel_state

    def get_embedding_ranks(pp_ranks, *_):
        return list(embedding_ranks(pp_ranks, untie_embeddings=sizes.untie_embeddings, mtp=sizes.mtp))

    parallel_state.initialize_model_parallel(
        tensor_model_parallel_size=sizes.tp,
        pipeline_model_parallel_size=sizes.pp,
        virtual_pipeline_model_parallel_size=sizes.vpp,
        context_parallel_size=sizes.cp,
        hierarchical_context_parallel_sizes=hierarchical_context_parallel_sizes,
        expert_model_parallel_size=sizes.ep,
        expert_tensor_parallel_size=sizes.etp,
        order=sizes.order,
        get_embedding_ranks=get_embedding_ranks,
        create_gloo_process_groups=False,
    )
