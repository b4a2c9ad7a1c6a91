"""What expansion needs to know about the target job's ranks: roles and group members.

`World` is the small interface the graph and simulator code is written against. `LayoutWorld`
answers it from `prism_megatron.topology.Layout` (the real job); `ExplicitWorld` from lists given
by hand (tests, hand-made graphs). Both add the pseudo group kind "world" (every rank, in order).
"""

from __future__ import annotations

from collections.abc import Iterable, Mapping, Sequence
from typing import Protocol

import numpy as np

from prism_megatron.graph.schema import WORLD_GROUP, NodeType
from prism_megatron.topology import Layout


class World(Protocol):
    """Roles and groups of the target job, by virtual rank."""

    @property
    def world_size(self) -> int: ...

    def roles(self) -> tuple[str, ...]:
        """Role names, in a fixed order (role ids index into it)."""
        ...

    def role_ids(self) -> np.ndarray:
        """int32 array of length world_size: the index in `roles()` of every virtual rank's role."""
        ...

    def representative(self, role: str) -> int:
        """The virtual rank that stands for the role (the one the slice runs)."""
        ...

    def group(self, kind: str, virtual_rank: int) -> tuple[int, ...]:
        """Members of the rank's group of this kind, in group order; () when it has none."""
        ...

    def groups(self, kind: str) -> Iterable[tuple[int, ...]]:
        """Every group of the kind, in a fixed order (a group's position is its index)."""
        ...

    def group_size(self, kind: str) -> int: ...


def peer_of(world: World, kind: str, virtual_rank: int, offset: int) -> int:
    """The member `offset` places after `virtual_rank` in its group of `kind`, wrapping around.

    Raises:
        ValueError: the rank has no group of that kind.
    """
    members = world.group(kind, virtual_rank)
    if virtual_rank not in members:
        raise ValueError(f"virtual rank {virtual_rank} has no {kind!r} group to find a peer in")
    return members[(members.index(virtual_rank) + offset) % len(members)]


def p2p_partner(world: World, op, virtual_rank: int) -> tuple[int, NodeType, int]:
    """The peer of `virtual_rank`'s SEND or RECV `op` and the matching op there: (peer, that op's
    type, that op's offset), the offset back to `virtual_rank` within the same group."""
    peer = peer_of(world, op.group, virtual_rank, op.offset)
    partner_type = NodeType.RECV if op.type == NodeType.SEND else NodeType.SEND
    return peer, partner_type, -op.offset % world.group_size(op.group)


def peer_spec(
    world: World, virtual_rank: int, peer: int, kinds: Sequence[str] = ("pp", "cp", "ep")
) -> tuple[str, int]:
    """(group kind, offset) that names `peer` relative to `virtual_rank`, for capture.

    The first of `kinds` whose group holds both ranks wins, with the offset of smallest magnitude
    (the previous stage is -1, not PP-1); "world" (offset = peer - rank) when none does.
    """
    for kind in kinds:
        members = world.group(kind, virtual_rank)
        if peer in members and virtual_rank in members:
            size = len(members)
            offset = (members.index(peer) - members.index(virtual_rank)) % size
            return kind, offset - size if offset > size // 2 else offset
    return WORLD_GROUP, peer - virtual_rank


def group_kind_of(world: World, virtual_rank: int, members: Sequence[int], kinds: Sequence[str]) -> str:
    """The first of `kinds` whose group of `virtual_rank` has exactly `members` (in any order), for capture.

    Raises:
        ValueError: no kind matches; the message lists the members.
    """
    wanted = sorted(members)
    if len(wanted) == world.world_size:
        return WORLD_GROUP
    for kind in kinds:
        if sorted(world.group(kind, virtual_rank)) == wanted:
            return kind
    raise ValueError(
        f"virtual rank {virtual_rank}: no group kind in {list(kinds)} has members {list(members)[:16]}"
    )


class ExplicitWorld:
    """A world described by hand: the role of every rank and the groups of every kind.

    Args:
        role_of_rank: role name of each virtual rank 0..W-1.
        groups: kind -> list of groups (member lists). A rank may be in no group of a kind.
        representatives: role -> its representative; default the role's smallest rank.
    """

    def __init__(
        self,
        role_of_rank: Sequence[str],
        groups: Mapping[str, Sequence[Sequence[int]]],
        representatives: Mapping[str, int] | None = None,
    ) -> None:
        self._roles = tuple(dict.fromkeys(role_of_rank))
        index = {name: i for i, name in enumerate(self._roles)}
        self._role_ids = np.array([index[name] for name in role_of_rank], dtype=np.int32)
        self._groups = {kind: [tuple(int(m) for m in g) for g in gs] for kind, gs in groups.items()}
        self._group_of: dict[str, dict[int, tuple[int, ...]]] = {}
        for kind, gs in self._groups.items():
            table = self._group_of.setdefault(kind, {})
            for members in gs:
                for member in members:
                    if member in table:
                        raise ValueError(f"virtual rank {member} is in two {kind!r} groups")
                    table[member] = members
        self._everyone = tuple(range(len(role_of_rank)))
        self._representatives = {name: role_of_rank.index(name) for name in self._roles}
        self._representatives.update(representatives or {})

    @property
    def world_size(self) -> int:
        return len(self._role_ids)

    def roles(self) -> tuple[str, ...]:
        return self._roles

    def role_ids(self) -> np.ndarray:
        return self._role_ids

    def representative(self, role: str) -> int:
        return self._representatives[role]

    def group(self, kind: str, virtual_rank: int) -> tuple[int, ...]:
        if kind == WORLD_GROUP:
            return self._everyone
        if kind not in self._groups:
            raise ValueError(
                f"unknown group kind {kind!r}; this world has {sorted(self._groups)} and 'world'"
            )
        return self._group_of[kind].get(virtual_rank, ())

    def groups(self, kind: str) -> list[tuple[int, ...]]:
        if kind == WORLD_GROUP:
            return [self._everyone]
        self.group(kind, 0)  # raises for an unknown kind
        return self._groups[kind]

    def group_size(self, kind: str) -> int:
        return max(len(g) for g in self.groups(kind))


class LayoutWorld:
    """The `World` of a `prism_megatron.topology.Layout`: roles by name, every Megatron group kind."""

    def __init__(self, layout) -> None:
        self.layout = layout
        self._roles = tuple(layout.roles())
        self._by_name = {role.name: role for role in self._roles}
        self._role_ids: np.ndarray | None = None
        self._everyone: tuple[int, ...] | None = None
        self._members: dict[tuple[str, int], tuple[int, ...]] = {}
        """(kind, rank) -> its group, for the ranks asked about: a simulation or a timeline asks
        for a few ranks' groups hundreds of thousands of times, and the layout computes each."""
        self._interned: dict[tuple[int, ...], tuple[int, ...]] = {}
        """Each group once, whichever of its members asked (a full simulation asks for every rank)."""
        self._sizes: dict[str, int] = {}

    @property
    def world_size(self) -> int:
        return self.layout.world_size

    def roles(self) -> tuple[str, ...]:
        return tuple(role.name for role in self._roles)

    def role_ids(self) -> np.ndarray:
        if self._role_ids is None:  # O(world size), once
            ids = np.full(self.world_size, -1, dtype=np.int32)
            for index, role in enumerate(self._roles):
                ids[np.fromiter(self.layout.role_members(role), dtype=np.int64)] = index
            assert (ids >= 0).all(), "every virtual rank has a role"
            self._role_ids = ids
        return self._role_ids

    def representative(self, role: str) -> int:
        if role not in self._by_name:
            raise ValueError(f"role {role!r} is not a role of this job; roles: {', '.join(self.roles())}")
        return self.layout.representative(self._by_name[role])

    def group(self, kind: str, virtual_rank: int) -> tuple[int, ...]:
        if kind == WORLD_GROUP:
            if self._everyone is None:
                self._everyone = tuple(range(self.world_size))
            return self._everyone
        virtual_rank = self.layout.check_rank(virtual_rank)
        members = self._members.get((kind, virtual_rank))
        if members is None:
            members = self.layout.group(kind, virtual_rank)
            members = self._members[kind, virtual_rank] = self._interned.setdefault(members, members)
        return members

    def groups(self, kind: str) -> Iterable[tuple[int, ...]]:
        if kind == WORLD_GROUP:
            return [self.group(WORLD_GROUP, 0)]
        return self.layout.groups(kind)

    def group_size(self, kind: str) -> int:
        size = self._sizes.get(kind)
        if size is None:
            size = self._sizes[kind] = (
                self.world_size if kind == WORLD_GROUP else self.layout.group_size(kind)
            )
        return size


def world_from_metadata(layout: Mapping[str, object]) -> LayoutWorld:
    """The `LayoutWorld` of a graph's `metadata.layout` (keyword arguments of `Layout`).

    Raises:
        ValueError: the metadata holds no layout, or one `Layout` refuses.
    """
    if not layout:
        raise ValueError("the graph's metadata has no layout (world_size, tp, pp, ...) to expand it with")
    try:
        return LayoutWorld(Layout(**dict(layout)))
    except TypeError as exc:
        raise ValueError(f"the graph's layout metadata {dict(layout)} is not a Layout: {exc}") from exc
