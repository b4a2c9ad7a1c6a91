"""Where the members of a group sit in the cluster, reduced to what their communication cost depends on.

Placement follows torchrun and SLURM's contiguous assignment, which Megatron jobs use: virtual rank
r runs on node ``r // gpus_per_node`` as local GPU ``r % gpus_per_node``. A local GPU talks to the
network through its NIC, and in a rail-optimised fat tree that NIC's rail decides whether a step
between two nodes stays under one leaf switch or climbs to a spine.

The cost of a collective depends on its members only through a GroupShape, so thousands of groups
of an 8192-rank job collapse into a handful of shapes and the cost model caches per shape.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from prism_megatron.network.cluster import ClusterSpec


@dataclasses.dataclass(frozen=True, slots=True)
class GroupShape:
    """What a group's communication cost depends on.

    Attributes:
        num_ranks: members of the group.
        num_nodes: nodes the members span.
        max_gpus_per_node: members on the busiest node (the intra-node work of that node).
        min_nics_per_node: NICs that serve members, on the node with the fewest (each node's
            traffic leaves through its members' NICs, so this node is the network bottleneck).
        crosses_spine: some step between nodes climbs to a spine: the nodes are under different
            leaves, or, in a rail-optimised tree, the members' rails differ between nodes.
    """

    num_ranks: int
    num_nodes: int
    max_gpus_per_node: int
    min_nics_per_node: int
    crosses_spine: bool

    def __post_init__(self) -> None:
        assert 1 <= self.num_nodes <= self.num_ranks, self
        assert 1 <= self.max_gpus_per_node <= self.num_ranks, self
        assert self.min_nics_per_node >= 1, self


def group_shape(spec: ClusterSpec, members: Sequence[int]) -> GroupShape:
    """The shape of a group of virtual ranks placed on ``spec``'s cluster.

    Raises:
        ValueError: the member list is empty, has a negative rank or a rank twice.
    """
    if not members:
        raise ValueError("a group needs at least one member virtual rank")
    if len(set(members)) != len(members):
        raise ValueError(f"group members must be distinct virtual ranks, got {list(members)[:16]}")
    gpus_per_node = spec.gpus_per_node
    rails_by_node: dict[int, set[int]] = {}
    nics_by_node: dict[int, set[int]] = {}
    gpus_by_node: dict[int, int] = {}
    for virtual_rank in members:
        if virtual_rank < 0:
            raise ValueError(f"group members must be virtual ranks >= 0, got {virtual_rank}")
        node, local_gpu = divmod(virtual_rank, gpus_per_node)
        nic = spec.nic_of(local_gpu)
        gpus_by_node[node] = gpus_by_node.get(node, 0) + 1
        nics_by_node.setdefault(node, set()).add(nic)
        rails_by_node.setdefault(node, set()).add(nic % spec.num_rails)
    return GroupShape(
        num_ranks=len(members),
        num_nodes=len(gpus_by_node),
        max_gpus_per_node=max(gpus_by_node.values()),
        min_nics_per_node=min(len(nics) for nics in nics_by_node.values()),
        crosses_spine=_crosses_spine(spec, rails_by_node),
    )


def _crosses_spine(spec: ClusterSpec, rails_by_node: dict[int, set[int]]) -> bool:
    if len(rails_by_node) == 1:
        return False
    leaves = {node // spec.topology.nodes_per_leaf for node in rails_by_node}
    if len(leaves) > 1:
        return True
    if spec.topology.kind != "rail-optimized-fat-tree":
        return False
    # NCCL connects the nodes of a ring or tree rail to rail; when the nodes hold members on
    # different rails some of those connections must go through a spine.
    first, *others = rails_by_node.values()
    return any(rails != first for rails in others)


def nccl_tests_members(spec: ClusterSpec, num_gpus: int, gpus_per_node: int | None = None) -> list[int]:
    """The virtual ranks of an nccl-tests run of ``num_gpus`` ranks, ``gpus_per_node`` per node.

    Nodes are filled in order with local GPUs 0..gpus_per_node-1 (default: whole nodes), so a
    2-node, 1-GPU-per-node run is members [0, spec.gpus_per_node].

    Raises:
        ValueError: a count is < 1, or more GPUs per node than the cluster has.
    """
    per_node = spec.gpus_per_node if gpus_per_node is None else gpus_per_node
    if num_gpus < 1:
        raise ValueError(f"num_gpus must be >= 1, got {num_gpus}")
    if not 1 <= per_node <= spec.gpus_per_node:
        raise ValueError(
            f"gpus_per_node must be in 1..{spec.gpus_per_node} for cluster {spec.name}, got {per_node}"
        )
    per_node = min(per_node, num_gpus)
    return [(i // per_node) * spec.gpus_per_node + i % per_node for i in range(num_gpus)]
