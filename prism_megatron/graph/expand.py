"""Expansion: the execution graph of all W ranks from the per-role graph and the topology.

Every virtual rank runs its role's ops with its own groups: a collective on "tp" is the rank's TP
group, a send to "pp+1" goes to the rank's next pipeline stage. `ExpandedGraph` resolves this on
demand, so memory stays O(roles x ops) however large the world; `materialize` builds the explicit
per-rank lists (O(W x ops)) for whoever asks for them.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Iterable, Mapping

from prism_megatron.graph.schema import ExecutionGraph, NodeType, Op
from prism_megatron.graph.world import World, peer_of


@dataclasses.dataclass(frozen=True, slots=True)
class ResolvedOp:
    """An op of one virtual rank with its partners resolved to global virtual ranks."""

    op: Op
    members: tuple[int, ...] = ()
    """COLLECTIVE: the rank's group of `op.group`, in group order; () when the rank has none."""
    peer: int = -1
    """SEND/RECV: the peer virtual rank."""


class ExpandedGraph:
    """The whole job's execution graph, resolved per rank when asked.

    Raises (at construction):
        ValueError: the graph lacks ops for a role of the world.
    """

    def __init__(self, graph: ExecutionGraph, world: World) -> None:
        missing = [name for name in world.roles() if name not in graph.roles]
        if missing:
            raise ValueError(f"the graph has no ops for roles {missing[:8]} of this job")
        self.graph = graph
        self.world = world
        self._role_names = world.roles()

    @property
    def world_size(self) -> int:
        return self.world.world_size

    def role_of(self, virtual_rank: int) -> str:
        if not 0 <= virtual_rank < self.world_size:
            raise ValueError(f"virtual rank {virtual_rank} is outside the world (0..{self.world_size - 1})")
        return self._role_names[int(self.world.role_ids()[virtual_rank])]

    def streams(self, virtual_rank: int) -> dict[str, tuple[ResolvedOp, ...]]:
        """The rank's ops, stream by stream, with groups and peers resolved."""
        role = self.graph.roles[self.role_of(virtual_rank)]
        groups: dict[str, tuple[int, ...]] = {}
        return {
            name: tuple(self._resolve(virtual_rank, op, groups) for op in ops)
            for name, ops in role.streams.items()
        }

    def _resolve(self, virtual_rank: int, op: Op, groups: dict[str, tuple[int, ...]]) -> ResolvedOp:
        if op.type == NodeType.COLLECTIVE:
            if op.group not in groups:
                groups[op.group] = self.world.group(op.group, virtual_rank)
            return ResolvedOp(op, members=groups[op.group])
        if op.type in (NodeType.SEND, NodeType.RECV):
            return ResolvedOp(op, peer=peer_of(self.world, op.group, virtual_rank, op.offset))
        return ResolvedOp(op)

    def num_ops(self) -> int:
        """Ops in the whole job (every rank's), without materializing them."""
        counts: Mapping[str, int] = {name: role.num_ops for name, role in self.graph.roles.items()}
        role_ids = self.world.role_ids()
        return sum(counts[self._role_names[int(r)]] for r in role_ids)

    def materialize(
        self, virtual_ranks: Iterable[int] | None = None
    ) -> dict[int, dict[str, tuple[ResolvedOp, ...]]]:
        """Explicit ops of the given ranks (default: all W); memory O(ranks x ops)."""
        ranks = range(self.world_size) if virtual_ranks is None else virtual_ranks
        return {rank: self.streams(rank) for rank in ranks}
