"""Placement of the selected real ranks onto physical processes, nodes and devices.

Each real rank runs in its own process. Processes are numbered 0..R-1 in the order the real ranks
are given (the physical rank) and filled node by node, `nproc_per_node` to a node, as torchrun and
srun number them; the local rank is the device index on the node.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass


@dataclass(frozen=True)
class Placement:
    """Where one real rank runs."""

    virtual_rank: int
    """The rank of the target job this process plays."""
    physical_rank: int
    """The process's rank among the real processes (0..R-1)."""
    node: int
    """Index of the node (machine) the process runs on."""
    local_rank: int
    """The process's index on its node, which is also its device index."""


def place(virtual_ranks: Sequence[int], nproc_per_node: int) -> list[Placement]:
    """Give each real rank a process, a node and a device, in the given order.

    Raises:
        ValueError: `nproc_per_node` is below 1, or a virtual rank appears twice.
    """
    if not isinstance(nproc_per_node, int) or nproc_per_node < 1:
        raise ValueError(f"--nproc-per-node must be a positive integer, got {nproc_per_node!r}")
    seen: set[int] = set()
    for virtual_rank in virtual_ranks:
        if virtual_rank in seen:
            raise ValueError(
                f"virtual rank {virtual_rank} is selected twice; each real rank needs one process"
            )
        seen.add(virtual_rank)
    return [
        Placement(
            virtual_rank=virtual_rank,
            physical_rank=physical_rank,
            node=physical_rank // nproc_per_node,
            local_rank=physical_rank % nproc_per_node,
        )
        for physical_rank, virtual_rank in enumerate(virtual_ranks)
    ]
