"""Topology of the target job: pure arithmetic over virtual ranks (no torch.distributed, no Megatron).

* `Layout`: world size, parallel sizes and rank order; coordinates and every Megatron group of any
  virtual rank, computed per rank (layout.py, grid.py);
* roles and the default slice (roles.py), and which roles run one program (equivalence.py);
* the rank-selection language of `--prism-ranks` (selection.py) and the compact rank notation it
  shares with the `topology` command's output (notation.py);
* placement of real ranks onto processes and devices (placement.py).
"""

from prism_megatron.topology.equivalence import JobModel, RoleClass, role_classes
from prism_megatron.topology.grid import MAX_WORLD_SIZE
from prism_megatron.topology.layout import (
    COORD_NAMES,
    GROUP_KINDS,
    ORDERS,
    Coords,
    Layout,
)
from prism_megatron.topology.notation import format_ranks, parse_ranks
from prism_megatron.topology.placement import Placement, place
from prism_megatron.topology.roles import Role
from prism_megatron.topology.selection import select_ranks

__all__ = [
    "COORD_NAMES",
    "GROUP_KINDS",
    "MAX_WORLD_SIZE",
    "ORDERS",
    "Coords",
    "JobModel",
    "Layout",
    "Placement",
    "Role",
    "RoleClass",
    "format_ranks",
    "parse_ranks",
    "place",
    "role_classes",
    "select_ranks",
]
