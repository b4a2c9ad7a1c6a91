"""The `create_group` wrapper: Megatron builds its whole topology inside the virtual world.

ARCHITECTURE.md decision 1: keep Megatron's own `initialize_model_parallel`; on a default group of
size W whose rank is the emulated virtual rank it builds every group of the 8192-GPU job and every
getter answers for the full topology. Only two things change, both in `create_group`, the single
function through which `initialize_model_parallel` creates groups:

- groups requested with an explicit backend (gloo for the CPU-side copies, nccl or ucc for the
  pipeline) are created on the virtual world's backend instead: real gloo groups cannot be built on
  a virtual world and the virtual world has no NCCL;
- every group is recorded (its description, its members in group order, whether this rank is a
  member), so the graph capture and the replay engine can name groups by their members.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Callable
from typing import Any

import torch.distributed as dist

from prism_megatron.patches.registry import Patch
from prism_megatron.patches.versions import EVERY_VERIFIED


@dataclasses.dataclass(frozen=True, slots=True)
class GroupRecord:
    """One group Megatron created."""

    desc: str
    """Megatron's group description (e.g. 'TENSOR_MODEL_PARALLEL_GROUP'), '' when it gave none."""
    ranks: tuple[int, ...]
    """Member virtual ranks, in group order."""
    requested_backend: str | None
    """The backend Megatron asked for (None: the default)."""
    is_member: bool
    """Whether this process's virtual rank is in the group."""


@dataclasses.dataclass
class GroupLog:
    """Every group created since the patch was applied, in creation order."""

    records: list[GroupRecord] = dataclasses.field(default_factory=list)

    def member_groups(self) -> list[GroupRecord]:
        return [r for r in self.records if r.is_member]

    def by_desc(self, desc: str) -> list[GroupRecord]:
        return [r for r in self.records if r.desc == desc]


def _create_group(
    original: Callable[..., Any], *, virtual_backend: str | None, group_log: GroupLog
) -> Callable[..., Any]:
    def create_group(
        ranks=None,
        timeout=None,
        backend=None,
        pg_options=None,
        use_local_synchronization=False,
        group_desc=None,
    ):
        requested = backend
        if virtual_backend is not None and backend is not None:
            backend, pg_options = virtual_backend, None
        group = original(
            ranks=ranks,
            timeout=timeout,
            backend=backend,
            pg_options=pg_options,
            use_local_synchronization=use_local_synchronization,
            group_desc=group_desc,
        )
        members = tuple(ranks) if ranks is not None else tuple(range(dist.get_world_size()))
        group_log.records.append(
            GroupRecord(group_desc or "", members, requested, dist.get_rank() in members)
        )
        return group

    return create_group


CREATE_GROUP = Patch(
    name="megatron.create_group",
    target="megatron.core.parallel_state:create_group",
    make=_create_group,
    needs=("virtual_backend", "group_log"),
    verified_on=EVERY_VERIFIED,
    reason="routes explicitly requested gloo/nccl groups to the virtual world's backend and records "
    "every group; create_group is the one place initialize_model_parallel makes groups, and no hook exists",
    signature="(ranks=None, timeout=None, backend=None, pg_options=None, use_local_synchronization=False, group_desc=None)",
)
"""Bound to a run by the virtual world's backend (None keeps requested backends: a real run that only
records) and the `GroupLog` the groups are recorded in."""
