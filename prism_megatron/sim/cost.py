"""The simulator's seam to the network model: a cost function per communication op.

The simulator asks `cost_fn(kind, members, size_bytes)` once per distinct (role, op kind, group,
size) and hands the answers to the C++ core as an array, so the network model may be as slow and
as detailed as it likes. `members` are global virtual ranks in group order (for SEND/RECV: source,
destination). `size_bytes` is the op's message size as the graph records it.

`AlphaBetaCost` is the textbook model (Hockney; ring algorithms as in Thakur, Rabenseifner and
Gropp, "Optimization of collective communication operations in MPICH", 2005) for tests and quick
estimates; `NetworkCost` adapts `prism_megatron.network.CostModel`, the calibrated model.
"""

from __future__ import annotations

import dataclasses
from typing import Protocol

from prism_megatron.replay.schedule import OpKind


class CostFn(Protocol):
    def __call__(self, kind: OpKind, members: tuple[int, ...], size_bytes: int) -> float:
        """Communication time in ns once every participant has arrived."""
        ...


@dataclasses.dataclass(frozen=True)
class AlphaBetaCost:
    """Ring-algorithm alpha-beta costs over n members, in ns.

    With a = latency_ns per step and b = ns_per_byte, for a buffer of S bytes:
    all-reduce 2(n-1)(a + S/n b) (reduce-scatter then all-gather); all-gather and reduce-scatter
    (n-1)(a + S/n b), S being the full (gathered) buffer; all-to-all (n-1)(a + S/n b);
    broadcast, reduce, gather, scatter a + S b (one pipelined pass); barrier 2(n-1) a; send/recv
    a + S b. A group of one member costs 0. Limits: one flat ring, no hierarchy, no contention.
    """

    latency_ns: float = 0.0
    ns_per_byte: float = 0.0

    def __call__(self, kind: OpKind, members: tuple[int, ...], size_bytes: int) -> float:
        n = len(members)
        a, b = self.latency_ns, self.ns_per_byte
        if n <= 1:
            return 0.0
        if kind == OpKind.ALL_REDUCE:
            return 2 * (n - 1) * (a + size_bytes / n * b)
        if kind in (OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER, OpKind.ALL_TO_ALL):
            return (n - 1) * (a + size_bytes / n * b)
        if kind == OpKind.BARRIER:
            return 2 * (n - 1) * a
        return a + size_bytes * b


class NetworkCost:
    """A `CostFn` answered by the network model (`prism_megatron.network.CostModel`): each op's cost
    with its group alone on its links, and a concurrency term (`sim.concurrency`) from how the
    cluster's NICs are shared when the simulated schedule runs several groups at once."""

    def __init__(self, cost_model) -> None:
        self.cost_model = cost_model

    def __call__(self, kind: OpKind, members: tuple[int, ...], size_bytes: int) -> float:
        if len(members) <= 1:
            return 0.0
        return float(self.cost_model.shared_cost_ns(kind, members, size_bytes, 1))

    @property
    def concurrency_factor(self):
        """The concurrency term, or None on a cluster with a NIC per GPU or more: no group shares
        its links with another there, so the factor is 1 whatever overlaps (and the fixed point is
        skipped)."""
        spec = self.cost_model.spec
        return None if spec.network.nics_per_node >= spec.gpus_per_node else self._factor

    def _factor(self, kind: OpKind, members: tuple[int, ...], size_bytes: int, groups: float) -> float:
        """Cost with round(groups) groups at once over the cost alone."""
        alone = self(kind, members, size_bytes)
        if groups <= 1.0 or alone <= 0.0:
            return 1.0
        return self.cost_model.shared_cost_ns(kind, members, size_bytes, round(groups)) / alone
