"""Mixed-radix rank arithmetic: megatron-core's rank-group rule, computed per rank.

megatron-core numbers global ranks as a mixed-radix number over the parallel dimensions in the
order given by `order` (the first dimension varies fastest): with order `tp-cp-ep-dp-pp`,
`rank = tp + TP * (cp + CP * (ep + EP * (dp + DP * pp)))`. A group of kind `tp-dp` holds the ranks
that agree on every dimension outside the kind (the unmasked ones) and differ in the dimensions
inside it (the masked ones). `generate_masked_orthogonal_rank_groups` lists those groups by
enumerating the whole world; this module answers the same questions for one rank directly:

* members of the rank's group: the unmasked coordinates fix a base rank, the masked coordinates
  run through their mixed-radix range, first masked dimension fastest. Cost: O(group size).
* index of the group among all groups of the kind: the unmasked coordinates read as a mixed-radix
  number, first unmasked dimension fastest. Cost: O(number of dimensions).

Both orders match megatron-core 0.16.1 exactly (tests hold them against its `RankGenerator`), so
`groups(token)` yields the same lists in the same order as `RankGenerator.get_ranks(token)`.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass, field

MAX_WORLD_SIZE = 1 << 20
"""The largest world the project takes (1,048,576 ranks, several times any job trained so far): a
group of such a world is a list of at most that many ranks. Every world size a user gives (a flag,
a graph's metadata, a report) is checked against it before anything is built from it."""


@dataclass(frozen=True)
class RankGrid:
    """The world as a mixed-radix grid of named dimensions, the first dimension varying fastest.

    One grid plays the part of one megatron-core `RankGenerator`: the decoder grid has dimensions
    (tp, cp, ep=1, dp, pp) in the job's order, the expert grid (etp, cp=1, ep, edp, pp).
    """

    names: tuple[str, ...]
    """Dimension names in rank order, fastest first (for example ("tp", "cp", "ep", "dp", "pp"))."""
    sizes: tuple[int, ...]
    """Size of each dimension, aligned with `names`."""
    strides: tuple[int, ...] = field(init=False)
    """Rank distance between neighbours along each dimension (the prefix products of `sizes`)."""
    world_size: int = field(init=False)
    """Product of all sizes."""

    def __post_init__(self) -> None:
        assert len(self.names) == len(self.sizes), (self.names, self.sizes)
        assert all(size >= 1 for size in self.sizes), self.sizes
        if math.prod(self.sizes) > MAX_WORLD_SIZE:  # a caller that skipped Layout's check
            raise ValueError(
                f"a world of {math.prod(self.sizes)} ranks is above the largest supported, {MAX_WORLD_SIZE}"
            )
        strides = [1]
        for size in self.sizes[:-1]:
            strides.append(strides[-1] * size)
        object.__setattr__(self, "strides", tuple(strides))
        object.__setattr__(self, "world_size", math.prod(self.sizes))

    def coords(self, rank: int) -> dict[str, int]:
        """Coordinate of `rank` along every dimension, by name."""
        return {
            name: (rank // stride) % size
            for name, size, stride in zip(self.names, self.sizes, self.strides, strict=True)
        }

    def coord(self, name: str, rank: int) -> int:
        """Coordinate of `rank` along one dimension."""
        axis = self.names.index(name)
        return (rank // self.strides[axis]) % self.sizes[axis]

    def rank_of(self, coords: dict[str, int]) -> int:
        """The rank with the given coordinates; dimensions left out are taken as 0."""
        return sum(
            coords.get(name, 0) * stride for name, stride in zip(self.names, self.strides, strict=True)
        )

    def _axes(self, token: str) -> tuple[list[int], list[int]]:
        """Axes inside the group kind `token` ("tp-dp") and outside it, each in rank order."""
        wanted = token.split("-")
        assert all(name in self.names for name in wanted), (token, self.names)
        masked = [axis for axis, name in enumerate(self.names) if name in wanted]
        unmasked = [axis for axis, name in enumerate(self.names) if name not in wanted]
        return masked, unmasked

    def group_size(self, token: str) -> int:
        masked, _ = self._axes(token)
        return math.prod(self.sizes[axis] for axis in masked)

    def num_groups(self, token: str) -> int:
        return self.world_size // self.group_size(token)

    def offsets(self, token: str) -> list[int]:
        """Rank offsets of a group's members from its first member, in megatron-core's order."""
        masked, _ = self._axes(token)
        offsets = [0]
        for axis in masked:
            stride = self.strides[axis]
            offsets = [offset + step * stride for step in range(self.sizes[axis]) for offset in offsets]
        return offsets

    def group_base(self, token: str, rank: int) -> int:
        """The first (smallest) member of the group of kind `token` that holds `rank`."""
        masked, _ = self._axes(token)
        return rank - sum(
            ((rank // self.strides[axis]) % self.sizes[axis]) * self.strides[axis] for axis in masked
        )

    def group(self, token: str, rank: int) -> tuple[int, ...]:
        """Members of the group of kind `token` that holds `rank`, in megatron-core's order."""
        base = self.group_base(token, rank)
        return tuple(base + offset for offset in self.offsets(token))

    def group_index(self, token: str, rank: int) -> int:
        """Position of `rank`'s group among all groups of kind `token` as megatron-core lists them."""
        _, unmasked = self._axes(token)
        index, radix = 0, 1
        for axis in unmasked:
            index += ((rank // self.strides[axis]) % self.sizes[axis]) * radix
            radix *= self.sizes[axis]
        return index

    def rank_in_group(self, token: str, rank: int) -> int:
        """Position of `rank` inside its group of kind `token` (its group-local rank)."""
        masked, _ = self._axes(token)
        position, radix = 0, 1
        for axis in masked:
            position += ((rank // self.strides[axis]) % self.sizes[axis]) * radix
            radix *= self.sizes[axis]
        return position

    def group_at(self, token: str, group_index: int) -> tuple[int, ...]:
        """Members of the `group_index`-th group of kind `token`."""
        _, unmasked = self._axes(token)
        base = 0
        for axis in unmasked:
            group_index, coord = divmod(group_index, self.sizes[axis])
            base += coord * self.strides[axis]
        return tuple(base + offset for offset in self.offsets(token))

    def groups(self, token: str) -> Iterator[tuple[int, ...]]:
        """Every group of kind `token`, in megatron-core's order. O(world size) in all."""
        _, unmasked = self._axes(token)
        offsets = self.offsets(token)
        bases = [0]
        for axis in unmasked:
            stride = self.strides[axis]
            bases = [base + step * stride for step in range(self.sizes[axis]) for base in bases]
        for base in bases:
            yield tuple(base + offset for offset in offsets)
