"""The Mann-Whitney U test: is one run's sample of a metric shifted against the other's?

Why this test: per-iteration times on a shared machine are skewed (a descheduled iteration is much
slower, never much faster) and there are few of them (5 to 50), so a test on means (Welch's t) is
swayed by one outlier; a rank test is not, and it needs no assumption about the distribution.
It asks whether a value drawn from one sample tends to be larger than one drawn from the other.

The p-value is two-sided. Without ties and with n_a x n_b <= `EXACT_LIMIT` it is exact (the null
distribution of U counted over all orderings); otherwise the normal approximation with the tie
correction of the variance and a continuity correction (as scipy.stats.mannwhitneyu's "asymptotic"
method). `smallest_p` tells whether a sample size can reach a level at all: with 3 values against 3
the smallest two-sided p is 0.1, so no difference can be significant at 0.05.
"""

from __future__ import annotations

import dataclasses
import functools
import math
from collections.abc import Sequence

EXACT_LIMIT = 2500
"""Largest n_a x n_b for the exact distribution (counting is O(n_a n_b (n_a + n_b)))."""

NAME = "Mann-Whitney U test (two-sided)"


@dataclasses.dataclass(frozen=True)
class RankTest:
    """The result of the test of sample b against sample a."""

    u: float
    """U of sample b: pairs (a_i, b_j) with b_j > a_i, ties counted half."""
    p_value: float
    method: str
    """'exact' or 'normal approximation'."""


def mann_whitney(a: Sequence[float], b: Sequence[float]) -> RankTest:
    """Two-sided Mann-Whitney U test of b against a.

    Raises:
        ValueError: a sample is empty.
    """
    n_a, n_b = len(a), len(b)
    if n_a == 0 or n_b == 0:
        raise ValueError(f"the Mann-Whitney test needs two non-empty samples, got {n_a} and {n_b} values")
    u_b = sum(1.0 if y > x else 0.5 if y == x else 0.0 for x in a for y in b)
    ties = _tie_sizes([*a, *b])
    if not any(t > 1 for t in ties) and n_a * n_b <= EXACT_LIMIT:
        return RankTest(u_b, _exact_p(u_b, n_a, n_b), "exact")
    return RankTest(u_b, _normal_p(u_b, n_a, n_b, ties), "normal approximation")


def smallest_p(n_a: int, n_b: int) -> float:
    """The smallest two-sided p-value the test can give for these sample sizes (no ties)."""
    if n_a == 0 or n_b == 0:
        return 1.0
    return min(1.0, 2.0 / math.comb(n_a + n_b, n_a))


def _tie_sizes(values: Sequence[float]) -> list[int]:
    counts: dict[float, int] = {}
    for v in values:
        counts[v] = counts.get(v, 0) + 1
    return list(counts.values())


@functools.lru_cache(maxsize=64)
def _u_counts(n_a: int, n_b: int) -> tuple[int, ...]:
    """Number of orderings of n_a + n_b distinct values giving each U = 0 .. n_a n_b.

    The classic recurrence: the largest value belongs to b (it beats all n_a values of a: U grows
    by n_a) or to a (U unchanged): c(m, n, u) = c(m, n - 1, u - m) + c(m - 1, n, u).
    """
    # table[m][u] for the current n, built up n = 0, 1, ..., n_b
    table = [[1] for _ in range(n_a + 1)]  # n = 0: U is 0 in one way
    for n in range(1, n_b + 1):
        new = [[1]]  # m = 0: U is 0 in one way
        for m in range(1, n_a + 1):
            size = m * n + 1
            row = [0] * size
            for u, ways in enumerate(table[m]):  # largest in b: c(m, n - 1, u - m)
                row[u + m] += ways
            for u, ways in enumerate(new[m - 1]):  # largest in a: c(m - 1, n, u)
                row[u] += ways
            new.append(row)
        table = new
    return tuple(table[n_a])


def _exact_p(u: float, n_a: int, n_b: int) -> float:
    counts = _u_counts(n_a, n_b)
    total = sum(counts)
    mean = n_a * n_b / 2
    distance = abs(u - mean)
    # P(|U - mean| >= distance) under the null: both tails of the symmetric distribution.
    extreme = sum(c for value, c in enumerate(counts) if abs(value - mean) >= distance - 1e-9)
    return min(1.0, extreme / total)


def _normal_p(u: float, n_a: int, n_b: int, ties: list[int]) -> float:
    n = n_a + n_b
    mean = n_a * n_b / 2
    tie_term = sum(t**3 - t for t in ties) / (n * (n - 1)) if n > 1 else 0.0
    variance = n_a * n_b / 12 * ((n + 1) - tie_term)
    if variance <= 0:  # every value equal: no evidence of a shift
        return 1.0
    z = (abs(u - mean) - 0.5) / math.sqrt(variance)
    return min(1.0, math.erfc(max(z, 0.0) / math.sqrt(2)))
