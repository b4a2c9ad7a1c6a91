"""What-if asymmetries: a straggler, a slow NIC, an overloaded expert shard.

Flags take `RANK:FACTOR` (repeatable): `--straggler 17:1.5` makes virtual rank 17's compute 1.5
times slower; `--slow-nic 17:4` makes every communication op rank 17 takes part in 4 times slower;
`--expert-imbalance 3:2` makes the expert compute (compute ops named "expert...") of every rank of
expert-parallel rank 3 twice as slow (a hot expert; the all-to-all sizes are not changed).

An asymmetry that is the same for every rank of a role (every expert-parallel rank is its own
role, so expert imbalance always is) keeps the one-node-per-role simulation valid; any other
makes it per rank.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping

import numpy as np

from prism_megatron.config import SLOWDOWN_FACTOR_RANGE, check_slowdown_factor

EXPERT_PREFIX = "expert"
"""Compute ops whose name starts with this are expert compute (for `expert_slowdowns`)."""


@dataclasses.dataclass(frozen=True)
class WhatIf:
    """Asymmetries to inject, by virtual rank.

    Attributes:
        stragglers: virtual rank -> factor on all its compute durations (2.0: twice as slow).
        slow_nics: virtual rank -> factor on the cost of every communication op it takes part in
            (the whole op runs at the slowest member's pace).
        expert_slowdowns: virtual rank -> factor on its expert compute (ops named "expert...").
    """

    stragglers: Mapping[int, float] = dataclasses.field(default_factory=dict)
    slow_nics: Mapping[int, float] = dataclasses.field(default_factory=dict)
    expert_slowdowns: Mapping[int, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for what, table in self._tables():
            low, high = SLOWDOWN_FACTOR_RANGE
            for rank, factor in table.items():
                if not (math.isfinite(factor) and low <= factor <= high):
                    raise ValueError(
                        f"{what} factor for virtual rank {rank} must be from {low:g} to {high:g}, got {factor}"
                    )

    def _tables(self):
        return (
            ("straggler", self.stragglers),
            ("slow NIC", self.slow_nics),
            ("expert slowdown", self.expert_slowdowns),
        )

    @property
    def ranks(self) -> list[int]:
        """Every rank an asymmetry names, sorted."""
        return sorted({rank for _, table in self._tables() for rank in table})

    def per_rank(self, world_size: int) -> dict[str, np.ndarray]:
        """The factors as float64 arrays over all ranks: compute_factor, nic_factor, expert_factor.

        Raises:
            ValueError: a rank is outside the world.
        """
        arrays = {}
        for key, (what, table) in zip(
            ("compute_factor", "nic_factor", "expert_factor"), self._tables(), strict=True
        ):
            factors = np.ones(world_size, dtype=np.float64)
            for rank, factor in table.items():
                if not 0 <= rank < world_size:
                    raise ValueError(f"{what} virtual rank {rank} is outside the world (0..{world_size - 1})")
                factors[rank] = factor
            arrays[key] = factors
        return arrays


def per_role(factors: np.ndarray, role_ids: np.ndarray, num_roles: int) -> np.ndarray | None:
    """Each role's factor when it is the same for all the role's ranks, else None."""
    low = np.full(num_roles, np.inf)
    high = np.full(num_roles, -np.inf)
    np.minimum.at(low, role_ids, factors)
    np.maximum.at(high, role_ids, factors)
    return low if np.array_equal(low, high) else None


def parse_rank_factors(values: Iterable[str], flag: str) -> dict[int, float]:
    """Parse repeated `RANK:FACTOR` values of `flag` into {virtual rank: factor}.

    Raises:
        ValueError: naming the flag, the value and the valid form; a rank given twice (which factor
            was meant is not for us to guess).
    """
    out: dict[int, float] = {}
    for text in values:
        rank, sep, factor = text.partition(":")
        try:
            if not sep:
                raise ValueError
            rank_value, factor_value = int(rank), float(factor)
        except ValueError:
            raise ValueError(f"{flag} {text!r}: expected RANK:FACTOR, for example {flag} 17:1.5") from None
        if rank_value < 0:
            raise ValueError(f"{flag} {text!r}: the rank must be >= 0")
        check_slowdown_factor(factor_value, flag, text)
        if rank_value in out:
            raise ValueError(
                f"{flag} {text!r}: rank {rank_value} is already given ({flag} {rank_value}:{out[rank_value]:g}); "
                "give each rank once"
            )
        out[rank_value] = factor_value
    return out
