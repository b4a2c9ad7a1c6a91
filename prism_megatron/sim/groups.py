"""Who meets whom: group instances and p2p peers of every simulated node, as arrays for the core.

Full mode: a node is a virtual rank; a collective's instance is the rank's group of that kind, and
its members are the instance's nodes. Built from `World.groups` in O(world size) per kind used.

Symmetric mode: a node is a role, standing for every rank of the role (its representative's
timeline is every member's timeline). A rank's group of kind k holds ranks of some set of roles; in
a job where roles are symmetric every member of a role reaches an op when the representative does,
so the group behaves as an instance whose members are those roles' nodes. Its key is
(kind, the set of roles); `check_symmetric` refuses worlds where that view is inconsistent.
"""

from __future__ import annotations

import numpy as np

from prism_megatron.graph.schema import WORLD_GROUP
from prism_megatron.graph.world import World, peer_of


def full_instances(world: World, kinds: tuple[str, ...]) -> tuple[np.ndarray, np.ndarray]:
    """(instance of each (kind, rank) as a [len(kinds), W] int32 array (-1: no group), instance sizes)."""
    instance = np.full((len(kinds), world.world_size), -1, dtype=np.int32)
    sizes: list[int] = []
    for spec, kind in enumerate(kinds):
        for members in world.groups(kind):
            if members:
                instance[spec, np.asarray(members, dtype=np.int64)] = len(sizes)
                sizes.append(len(members))
    return instance, np.asarray(sizes, dtype=np.int32)


def full_peers(world: World, specs: tuple[tuple[str, int], ...]) -> np.ndarray:
    """Peer rank of each (p2p spec, rank) as a [len(specs), W] int32 array (-1: no group)."""
    peers = np.full((len(specs), world.world_size), -1, dtype=np.int32)
    for spec, (kind, offset) in enumerate(specs):
        for members in world.groups(kind):
            if members:
                m = np.asarray(members, dtype=np.int64)
                peers[spec, m] = m[(np.arange(len(m)) + offset) % len(m)]
    return peers


def _role_set(world: World, kind: str, representative: int, num_roles: int) -> tuple[int, ...]:
    if kind == WORLD_GROUP:
        return tuple(range(num_roles))
    members = world.group(kind, representative)
    if not members:
        return ()
    return tuple(int(r) for r in np.unique(world.role_ids()[np.asarray(members, dtype=np.int64)]))


def symmetric_instances(
    world: World, kinds: tuple[str, ...], representatives: np.ndarray
) -> tuple[np.ndarray, np.ndarray]:
    """Like `full_instances` with one node per role: instances keyed by (kind, set of roles)."""
    num_roles = len(representatives)
    instance = np.full((len(kinds), num_roles), -1, dtype=np.int32)
    keys: dict[tuple[str, tuple[int, ...]], int] = {}
    for spec, kind in enumerate(kinds):
        for node, rep in enumerate(representatives):
            roles = _role_set(world, kind, int(rep), num_roles)
            if roles:
                instance[spec, node] = keys.setdefault((kind, roles), len(keys))
        check_symmetric(kind, instance[spec], keys, world.roles())
    sizes = np.zeros(len(keys), dtype=np.int32)
    for (_, roles), index in keys.items():
        sizes[index] = len(roles)
    return instance, sizes


def check_symmetric(kind: str, instance_of_node: np.ndarray, keys: dict, role_names: tuple[str, ...]) -> None:
    """Every role in an instance's role set must see that same instance, or symmetry does not hold.

    Raises:
        ValueError: naming the kind and the roles that disagree; full simulation still works.
    """
    for (key_kind, roles), index in keys.items():
        if key_kind != kind:
            continue
        for role in roles:
            if instance_of_node[role] != index:
                raise ValueError(
                    f"roles are not symmetric in {kind!r} groups: a group holds roles "
                    f"{[role_names[r] for r in roles]} but role {role_names[role]!r} sees another set; "
                    f"simulate every rank (mode='full') instead"
                )


def symmetric_peers(
    world: World, specs: tuple[tuple[str, int], ...], representatives: np.ndarray
) -> np.ndarray:
    """Peer node (role) of each (p2p spec, role node), -1 where the representative has no such group."""
    role_ids = world.role_ids()
    peers = np.full((len(specs), len(representatives)), -1, dtype=np.int32)
    for spec, (kind, offset) in enumerate(specs):
        for node, rep in enumerate(representatives):
            if world.group(kind, int(rep)):
                peers[spec, node] = role_ids[peer_of(world, kind, int(rep), offset)]
    return peers
