"""What-if asymmetries: a straggler, a slow NIC. Any of them makes the simulation per rank.

Flags take `RANK:FACTOR` (repeatable): `--straggler 17:1.5` makes virtual rank 17's compute 1.5
times slower; `--slow-nic 17:4` makes every communication op rank 17 takes part in 4 times slower.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Iterable, Mapping


@dataclasses.dataclass(frozen=True)
class WhatIf:
    """Asymmetries to inject. Any of them makes the simulation per rank (full mode).

    Attributes:
        stragglers: virtual rank -> factor on all its compute durations (2.0: twice as slow).
        slow_nics: virtual rank -> factor on the cost of every communication op it takes part in
            (the whole op runs at the slowest member's pace).
    """

    stragglers: Mapping[int, float] = dataclasses.field(default_factory=dict)
    slow_nics: Mapping[int, float] = dataclasses.field(default_factory=dict)

    def __post_init__(self) -> None:
        for what, table in (("straggler", self.stragglers), ("slow NIC", self.slow_nics)):
            for rank, factor in table.items():
                if not factor > 0:
                    raise ValueError(f"{what} factor for virtual rank {rank} must be > 0, got {factor}")

    @property
    def symmetric(self) -> bool:
        return not self.stragglers and not self.slow_nics


def parse_rank_factors(values: Iterable[str], flag: str) -> dict[int, float]:
    """Parse repeated `RANK:FACTOR` values of `flag` into {virtual rank: factor}.

    Raises:
        ValueError: naming the flag, the value and the valid form.
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
        if rank_value < 0 or not (math.isfinite(factor_value) and factor_value > 0):
            raise ValueError(f"{flag} {text!r}: the rank must be >= 0 and the factor a positive number")
        out[rank_value] = factor_value
    return out
