"""Cost lines for the replay engine until the network model supplies them.

The engine costs an op on a group as ``min over lines (latency_ns + ns_per_byte * bytes)``
(:func:`prism_megatron.replay.schedule.cost_ns`). A *cost model* is anything with
``cost_lines(kind, members) -> tuple[CostLine, ...]``; the network package's ``CostModel`` is the
real one. :class:`LatencyBandwidthCost` here is the simple stand-in: one link of fixed latency and
bandwidth per step, and the textbook ring / tree step counts, so costs grow with group size and
message size in the right proportions without knowing the cluster.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence
from typing import Protocol

from prism_megatron.replay.schedule import CostLine, OpKind

CostLines = tuple[CostLine, ...]
"""The cost model of one (group, op kind): the cheapest line at each message size."""


class CostModel(Protocol):
    """What the backend asks for each group it creates with virtual members."""

    def cost_lines(self, kind: OpKind, members: Sequence[int]) -> CostLines: ...


@dataclasses.dataclass(frozen=True, kw_only=True)
class LatencyBandwidthCost:
    """Alpha-beta costs with ring (bandwidth-bound ops) and binary-tree (latency-bound ops) steps.

    For a group of n members, a message of S bytes (sizes as in ``replay.events``), per-step latency
    a (``latency_us``) and link bandwidth B (``bandwidth_gb_per_s``, so 1/B ns per byte at 1 GB/s = 1
    byte/ns):

    * all-reduce (ring): 2(n-1) a + 2 (n-1)/n S / B
    * all-gather, reduce-scatter, all-to-all, gather, scatter (ring): (n-1) a + (n-1)/n S / B
    * broadcast, reduce (pipelined tree): ceil(log2 n) a + S / B
    * barrier: 2 ceil(log2 n) a
    * send, recv: a + S / B

    Limits: one link type, no hierarchy, no protocol switch; a placeholder, not a prediction.
    """

    latency_us: float = 5.0
    """Latency of one step (one message between two members), microseconds."""
    bandwidth_gb_per_s: float = 25.0
    """Bandwidth of one link, GB/s (1 GB/s moves one byte per ns)."""

    def __post_init__(self) -> None:
        if not (math.isfinite(self.latency_us) and self.latency_us >= 0):
            raise ValueError(
                f"LatencyBandwidthCost.latency_us must be finite and >= 0, got {self.latency_us}"
            )
        if not (math.isfinite(self.bandwidth_gb_per_s) and self.bandwidth_gb_per_s > 0):
            raise ValueError(
                f"LatencyBandwidthCost.bandwidth_gb_per_s must be finite and > 0, got {self.bandwidth_gb_per_s}"
            )

    def cost_lines(self, kind: OpKind, members: Sequence[int]) -> CostLines:
        n = len(members)
        if n <= 1 and kind not in (OpKind.SEND, OpKind.RECV):
            return (CostLine(0.0, 0.0),)
        step_ns = self.latency_us * 1e3
        ns_per_byte = 1.0 / self.bandwidth_gb_per_s
        tree_steps = math.ceil(math.log2(n)) if n > 1 else 0
        if kind == OpKind.ALL_REDUCE:
            return (CostLine(2 * (n - 1) * step_ns, 2 * (n - 1) / n * ns_per_byte),)
        if kind in (
            OpKind.ALL_GATHER,
            OpKind.REDUCE_SCATTER,
            OpKind.ALL_TO_ALL,
            OpKind.GATHER,
            OpKind.SCATTER,
        ):
            return (CostLine((n - 1) * step_ns, (n - 1) / n * ns_per_byte),)
        if kind in (OpKind.BROADCAST, OpKind.REDUCE):
            return (CostLine(tree_steps * step_ns, ns_per_byte),)
        if kind == OpKind.BARRIER:
            return (CostLine(2 * tree_steps * step_ns, 0.0),)
        return (CostLine(step_ns, ns_per_byte),)  # SEND, RECV
