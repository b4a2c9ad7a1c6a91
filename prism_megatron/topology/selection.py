"""The rank-selection language of `--prism-ranks` and `prism-megatron topology --ranks`.

A selection names the virtual ranks to run for real (or to show). One of:

* `slice`: the default slice, one representative per role (see roles.py);
* `all`: every rank of the world (only sensible for small worlds);
* explicit ranks in the compact notation of notation.py: `0,7168`, `0-7`, `0-7680:512`;
* coordinate filters, `;`-separated, all of which a rank must pass: `pp=0,7;tp=0;dp=0`. A filter
  is a coordinate (`tp cp dp pp etp ep edp`) with values in the same notation, or `role=` with role
  names (`role=pp0-tp0src,pp3`).

The result is sorted and free of duplicates. Filters never enumerate the world: they enumerate the
product of the allowed coordinates in the grid (dense or expert) that constrains more, or the
members of the named roles, whichever is smaller, and test each candidate against every filter.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Iterable

from prism_megatron.topology.layout import COORD_NAMES, Layout
from prism_megatron.topology.notation import parse_ranks
from prism_megatron.topology.roles import Role

_FILTER_NAMES = (*COORD_NAMES, "role")


def select_ranks(layout: Layout, spec: str) -> list[int]:
    """The virtual ranks `spec` selects, sorted and unique.

    Raises:
        ValueError: the spec does not parse, names a rank or coordinate outside the job, or
            selects nothing; the message quotes the spec and says what is valid.
    """
    text = spec.strip()
    try:
        if text == "slice":
            return layout.default_slice()
        if text == "all":
            return list(range(layout.world_size))
        selected = _select_by_filters(layout, text) if "=" in text else _select_explicit(layout, text)
    except ValueError as exc:
        raise ValueError(f"rank selection {spec!r}: {exc}") from None
    if not selected:
        raise ValueError(f"rank selection {spec!r} selects no rank of this job")
    return selected


def _select_explicit(layout: Layout, text: str) -> list[int]:
    if not text:
        raise ValueError("it is empty; write `slice`, `all`, ranks like `0,7168` or filters like `pp=0;tp=0`")
    ranks = parse_ranks(text)
    for virtual_rank in ranks:
        layout.check_rank(virtual_rank)
    return sorted(set(ranks))


def _coord_size(layout: Layout, name: str) -> int:
    return getattr(layout, name)


def _parse_filters(layout: Layout, text: str) -> tuple[dict[str, set[int]], list[Role] | None]:
    """Coordinate filters as allowed-value sets, and the named roles (None without a role filter)."""
    allowed: dict[str, set[int]] = {}
    roles: list[Role] | None = None
    for clause in text.split(";"):
        name, equals, values = (part.strip() for part in clause.partition("="))
        if not equals or name not in _FILTER_NAMES:
            raise ValueError(
                f"{clause.strip()!r} is not a filter NAME=VALUES; names: {', '.join(_FILTER_NAMES)}"
            )
        if name in allowed or (name == "role" and roles is not None):
            raise ValueError(f"filter {name!r} is given twice; list its values once, comma-separated")
        if name == "role":
            roles = _parse_roles(layout, values)
            continue
        size = _coord_size(layout, name)
        chosen = set(parse_ranks(values))
        outside = sorted(value for value in chosen if not 0 <= value < size)
        if outside:
            raise ValueError(f"{name}={outside[0]} is out of range; {name} runs 0..{size - 1} in this job")
        allowed[name] = chosen
    return allowed, roles


def _parse_roles(layout: Layout, values: str) -> list[Role]:
    by_name = {role.name: role for role in layout.roles()}
    chosen = []
    for name in (value.strip() for value in values.split(",")):
        if name not in by_name:
            known = list(by_name)
            shown = ", ".join(known[:8]) + (", ..." if len(known) > 8 else "")
            raise ValueError(f"no role named {name!r} in this job; roles: {shown}")
        chosen.append(by_name[name])
    return chosen


def _select_by_filters(layout: Layout, text: str) -> list[int]:
    allowed, roles = _parse_filters(layout, text)
    candidates, num_candidates = _grid_candidates(layout, allowed)
    if roles is not None:
        num_in_roles = sum(layout.role_count(role) for role in roles)
        if num_in_roles < num_candidates:
            candidates = itertools.chain.from_iterable(layout.role_members(role) for role in roles)
    wanted_roles = None if roles is None else set(roles)
    selected = set()
    for virtual_rank in candidates:
        coords = layout.coords(virtual_rank).as_dict()
        if all(coords[name] in values for name, values in allowed.items()) and (
            wanted_roles is None or layout.role_of(virtual_rank) in wanted_roles
        ):
            selected.add(virtual_rank)
    return sorted(selected)


def _grid_candidates(layout: Layout, allowed: dict[str, set[int]]) -> tuple[Iterable[int], int]:
    """Ranks whose coordinates in the more constrained grid are allowed, and how many there are."""
    best = None
    for grid in (layout.decoder, layout.expert):
        axes = [
            sorted(allowed[name]) if name in allowed else range(size)
            for name, size in zip(grid.names, grid.sizes, strict=True)
        ]
        count = math.prod(len(axis) for axis in axes)
        if best is None or count < best[2]:
            best = (grid, axes, count)
    grid, axes, count = best
    ranks = (
        sum(coord * stride for coord, stride in zip(combo, grid.strides, strict=True))
        for combo in itertools.product(*axes)
    )
    return ranks, count
