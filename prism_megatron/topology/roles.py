"""Roles: which virtual ranks of the target job behave alike in Megatron GPT training.

The slice runs one real rank per role and the execution graph of every other rank is copied from
the representative of its role, so a role must gather exactly the ranks whose iteration has the
same compute and communication pattern (up to which peers they talk to). The rule:

* **Pipeline stage** (`pp`). Each stage holds different layers, and with an interleaved schedule
  its model chunks are the virtual stages `pp, pp + PP, pp + 2 PP, ...`, a function of the stage.
  The first stage also holds the embedding and receives nothing forward; the last stage holds the
  output layer and the loss and sends nothing forward; both are in the embedding group.
* **Data source** (`data_source`). On the first and last stage, tensor-parallel rank 0 reads the
  batch from the data iterator and broadcasts it to its TP peers (Megatron-LM's
  `get_batch_on_this_tp_rank`); the other TP ranks only receive. Middle stages read no data, so
  there TP rank 0 is like any other.
* **Expert shard** (`ep`), only when EP > 1: each expert-parallel rank holds different experts, so
  token routing makes their work differ.

Everything else is symmetric and does not make a role: the TP rank (apart from the data source),
the CP rank (sequence chunks are load-balanced), the DP and expert-DP ranks (replicas), the
expert-TP rank (equal shards).

Limits: ranks that only log or write checkpoints (global rank 0, the last rank, DP rank 0) are not
set apart; expert imbalance is a run-time property that roles cannot see. Roles follow the layout
only; which roles run the same program (and so share one capture), given the layers of each stage
(uneven first and last stages, MTP, MoE layer patterns) and the schedule, is `equivalence.py`'s.

Roles are found without enumerating the world: TP rank 0 is a function of `rank mod TP` and the EP
rank of `rank mod (ETP * EP)`, so within a stage the role repeats with period
`lcm(TP, ETP * EP)`, and both periods divide the contiguous blocks a stage is made of.
"""

from __future__ import annotations

import math
from collections.abc import Iterator
from dataclasses import dataclass
from typing import TYPE_CHECKING

if TYPE_CHECKING:
    from prism_megatron.topology.layout import Layout


@dataclass(frozen=True)
class Role:
    """A class of virtual ranks that behave alike; `name` is short and unique within a job."""

    name: str
    """For example "pp3", "pp0-tp0src" (first stage, the TP rank that reads data), "pp7-ep5"."""
    pp: int
    """Pipeline stage."""
    first_stage: bool
    """Holds the embedding and the start of the model (pipeline stage 0)."""
    last_stage: bool
    """Holds the output layer and computes the loss (pipeline stage PP-1)."""
    data_source: bool
    """Reads batches and broadcasts them to its TP peers (TP rank 0 on the first or last stage)."""
    ep: int | None
    """Expert-parallel rank (which experts it holds); None when EP = 1."""
    model_chunks: tuple[int, ...]
    """Virtual pipeline stages of its model chunks: (pp,) without interleaving, else pp + k * PP."""


def _make_role(layout: Layout, stage: int, data_source: bool, ep_rank: int | None) -> Role:
    name = f"pp{stage}" + ("-tp0src" if data_source else "") + ("" if ep_rank is None else f"-ep{ep_rank}")
    chunks = tuple(stage + chunk * layout.pp for chunk in range(layout.vpp or 1))
    return Role(
        name=name,
        pp=stage,
        first_stage=stage == 0,
        last_stage=stage == layout.pp - 1,
        data_source=data_source,
        ep=ep_rank,
        model_chunks=chunks,
    )


def _period(layout: Layout) -> int:
    """Ranks within a stage repeat their role every `period` ranks."""
    return math.lcm(layout.tp, layout.etp * layout.ep) if layout.ep > 1 else layout.tp


def _key(layout: Layout, stage: int, virtual_rank: int) -> tuple[bool, int | None]:
    """(data_source, ep) of a rank on `stage`; depends on the rank only through rank mod period."""
    reads_data = stage in (0, layout.pp - 1) and virtual_rank % layout.tp == 0
    ep_rank = (virtual_rank // layout.etp) % layout.ep if layout.ep > 1 else None
    return reads_data, ep_rank


def role_of(layout: Layout, virtual_rank: int) -> Role:
    stage = layout.decoder.coord("pp", virtual_rank)
    return _make_role(layout, stage, *_key(layout, stage, virtual_rank))


def _stage_blocks(layout: Layout, stage: int) -> Iterator[range]:
    """The ranks of one pipeline stage as ascending contiguous blocks, each a multiple of the period."""
    stride = layout.decoder.strides[layout.decoder.names.index("pp")]
    if layout.order.endswith("pp") or layout.pp == 1:
        yield range(stage * stride, (stage + 1) * stride)
        return
    # pp before dp: a stage is DP blocks of TP * CP ranks, PP * TP * CP apart.
    for dp_rank in range(layout.dp):
        start = stage * stride + dp_rank * stride * layout.pp
        yield range(start, start + stride)


def _matching_offsets(layout: Layout, role: Role) -> list[int]:
    """Offsets within one period (from a period boundary) of the ranks of `role` on its stage."""
    key = (role.data_source, role.ep)
    return [offset for offset in range(_period(layout)) if _key(layout, role.pp, offset) == key]


def all_roles(layout: Layout) -> list[Role]:
    roles = []
    for stage in range(layout.pp):
        keys = {_key(layout, stage, offset) for offset in range(_period(layout))}
        for reads_data, ep_rank in sorted(keys, key=lambda k: (not k[0], -1 if k[1] is None else k[1])):
            roles.append(_make_role(layout, stage, reads_data, ep_rank))
    return roles


def _check_role(layout: Layout, role: Role) -> None:
    if role != _make_role(layout, role.pp, role.data_source, role.ep) or not _matching_offsets(layout, role):
        raise ValueError(f"role {role.name!r} does not exist in this job")


def role_members(layout: Layout, role: Role) -> Iterator[int]:
    _check_role(layout, role)  # here, not on first iteration, so a bad role fails at the call
    return _iter_members(layout, role)


def _iter_members(layout: Layout, role: Role) -> Iterator[int]:
    offsets = _matching_offsets(layout, role)
    period = _period(layout)
    for block in _stage_blocks(layout, role.pp):
        for start in range(block.start, block.stop, period):
            for offset in offsets:
                yield start + offset


def role_count(layout: Layout, role: Role) -> int:
    _check_role(layout, role)
    return len(_matching_offsets(layout, role)) * (layout.world_size // layout.pp // _period(layout))
