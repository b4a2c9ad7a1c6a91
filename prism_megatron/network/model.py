"""The collective cost model: for an op kind and its members, the lines the replay engine evaluates.

Byte convention of ``cost_lines`` and ``cost_ns``: ``size_bytes`` is the op's whole buffer, the
number nccl-tests prints in its size column, which is also what the prism backend records:

| op kind          | size_bytes is                                                      |
|------------------|--------------------------------------------------------------------|
| ALL_REDUCE       | the buffer (input = output)                                        |
| ALL_GATHER       | the gathered OUTPUT, n times one rank's input                      |
| REDUCE_SCATTER   | one rank's input, n times its output shard                         |
| ALL_TO_ALL       | one rank's whole send buffer                                       |
| BROADCAST/REDUCE | the buffer                                                         |
| SEND/RECV        | the message                                                        |
| GATHER/SCATTER   | the gathered (scattered) whole, n times one rank's shard           |
| BARRIER          | ignored (a one-element all-reduce)                                 |

Members are global virtual ranks in group order; SEND/RECV take (sender, receiver).

The engine evaluates ``min over lines (latency_ns + ns_per_byte * size_bytes)`` in C++; lines are
computed once per (op kind, group shape) and cached, so an 8192-rank job with thousands of groups
costs a handful of shape computations, and nothing on the engine's path calls Python.
"""

from __future__ import annotations

from collections.abc import Sequence

from prism_megatron.network import algorithms
from prism_megatron.network.algorithms import Candidate, Levels
from prism_megatron.network.cluster import ClusterSpec
from prism_megatron.network.nccl_tests import BUS_BANDWIDTH_FACTORS
from prism_megatron.network.parameters import parameters_of
from prism_megatron.network.placement import GroupShape, group_shape, nccl_tests_members
from prism_megatron.replay import schedule
from prism_megatron.replay.schedule import CostLine, OpKind

_LOCAL = CostLine(0.0, 0.0)  # a group of one: nothing to communicate
_RING_OPS = {
    # kind: (bytes per rank on its outgoing link / S, ring steps as a function of (n, N))
    OpKind.ALL_REDUCE: (lambda n: 2.0 * (n - 1) / n, lambda n, nodes: (2 * (n - 1), 2 * (nodes - 1))),
    OpKind.ALL_GATHER: (lambda n: (n - 1) / n, lambda n, nodes: (n - 1, nodes - 1)),
    OpKind.REDUCE_SCATTER: (lambda n: (n - 1) / n, lambda n, nodes: (n - 1, nodes - 1)),
    OpKind.BROADCAST: (lambda n: 1.0, lambda n, nodes: (n - 1, nodes - 1)),
    OpKind.REDUCE: (lambda n: 1.0, lambda n, nodes: (n - 1, nodes - 1)),
}


def candidates_for(
    spec: ClusterSpec, kind: OpKind, shape: GroupShape, concurrent_groups: int | None = None
) -> list[Candidate]:
    """Every algorithm/protocol NCCL may use for this op on this shape (costs per byte of ``S``);
    `concurrent_groups` as `algorithms.Levels.of` takes it."""
    levels = Levels.of(spec, shape, concurrent_groups)
    n, nodes, gpus = shape.num_ranks, shape.num_nodes, shape.max_gpus_per_node
    if kind == OpKind.BARRIER:
        kind = OpKind.ALL_REDUCE
    if kind in _RING_OPS:
        volume, steps = _RING_OPS[kind]
        found = algorithms.ring(levels, volume(n), *steps(n, nodes))
        if kind == OpKind.ALL_REDUCE:
            found += _all_reduce_extras(spec, levels)
        elif kind in (OpKind.ALL_GATHER, OpKind.REDUCE_SCATTER) and gpus == 1 and nodes > 1:
            found += algorithms.pat(levels)
        return found
    if kind == OpKind.ALL_TO_ALL:
        return algorithms.fan(levels, "p2p", (gpus - 1) / n, (n - gpus) / n)
    if kind in (OpKind.GATHER, OpKind.SCATTER):  # the root exchanges S/n with each member
        return algorithms.fan(levels, "p2p", (gpus - 1) / n, (n - gpus) / n)
    if kind in (OpKind.SEND, OpKind.RECV):
        if n != 2:
            raise ValueError(f"{kind.name} cost needs members (sender, receiver), got {n} members")
        return algorithms.fan(levels, "p2p", 1.0 if nodes == 1 else 0.0, 1.0 if nodes > 1 else 0.0)
    raise ValueError(f"no cost model for op kind {kind!r}")


def _all_reduce_extras(spec: ClusterSpec, levels: Levels) -> list[Candidate]:
    shape = levels.shape
    found = []
    if shape.num_nodes > 1:
        found += algorithms.tree(levels)
    if spec.intra_node.nvls and shape.max_gpus_per_node > 1:
        found += algorithms.nvls(levels) if shape.num_nodes == 1 else algorithms.nvls_tree(levels)
    return found


class CostModel:
    """Communication cost of any op on any group of a cluster (see the module docstring)."""

    def __init__(self, spec: ClusterSpec):
        self.spec = spec
        self.params = parameters_of(spec)
        self._named: dict[tuple[OpKind, GroupShape], tuple[tuple[str, CostLine], ...]] = {}
        self._lines: dict[tuple[OpKind, GroupShape], tuple[CostLine, ...]] = {}
        self._shapes: dict[tuple[int, ...], GroupShape] = {}
        self._shared: dict[tuple[OpKind, GroupShape, int], tuple[CostLine, ...]] = {}

    def shape(self, members: Sequence[int]) -> GroupShape:
        """The placement shape of a group (remembered per member list: groups recur every op)."""
        key = tuple(members)
        shape = self._shapes.get(key)
        if shape is None:
            shape = self._shapes[key] = group_shape(self.spec, key)
        return shape

    def named_lines(self, kind: OpKind, members: Sequence[int]) -> tuple[tuple[str, CostLine], ...]:
        """``(algorithm/protocol, line)`` pairs for this op on these members (cached per shape)."""
        return self._named[self._key(kind, members)]

    def cost_lines(self, kind: OpKind, members: Sequence[int]) -> tuple[CostLine, ...]:
        """The lines whose minimum is this op's cost in ns, for the engine (cached per shape)."""
        return self._lines[self._key(kind, members)]

    def _key(self, kind: OpKind, members: Sequence[int]) -> tuple[OpKind, GroupShape]:
        key = (OpKind(kind), self.shape(members))
        if key not in self._named:
            kind, shape = key
            if shape.num_ranks == 1:
                named = (("local", _LOCAL),)
            else:
                named = tuple((c.name, c.line(self.params)) for c in candidates_for(self.spec, kind, shape))
            self._named[key] = named
            self._lines[key] = tuple(line for _, line in named)
        return key

    def cost_ns(self, kind: OpKind, members: Sequence[int], size_bytes: int) -> float:
        """Python reference of the engine's evaluation (``replay.schedule.cost_ns``)."""
        return schedule.cost_ns(self.cost_lines(kind, members), size_bytes)

    def shared_cost_ns(
        self, kind: OpKind, members: Sequence[int], size_bytes: int, concurrent_groups: int
    ) -> float:
        """The cost with `concurrent_groups` groups of this shape communicating at once (link
        sharing as `algorithms.Levels.of` derives it; 1: the group alone)."""
        shape = self.shape(members)
        if shape.num_ranks == 1:
            return 0.0
        key = (OpKind(kind), shape, concurrent_groups)
        lines = self._shared.get(key)
        if lines is None:
            candidates = candidates_for(self.spec, OpKind(kind), shape, concurrent_groups)
            lines = self._shared[key] = tuple(c.line(self.params) for c in candidates)
        return schedule.cost_ns(lines, size_bytes)

    def nccl_tests_time_ns(
        self,
        kind: OpKind,
        num_gpus: int,
        size_bytes: int,
        gpus_per_node: int | None = None,
        algorithm: str | None = None,
    ) -> float:
        """Predicted time of one nccl-tests row (``size_bytes`` = its size column).

        ``algorithm`` keeps only the candidates whose name starts with it (``ring``, ``tree``,
        ``nvls``, ``ring/simple`` ...), as NCCL_ALGO / NCCL_PROTO would.
        """
        kind = OpKind(kind)
        members = nccl_tests_members(self.spec, num_gpus, gpus_per_node)
        if kind in (OpKind.SEND, OpKind.RECV):
            members = _sendrecv_pair(members, gpus_per_node or self.spec.gpus_per_node)
        named = self.named_lines(kind, members)
        if algorithm is not None:
            named = tuple((name, line) for name, line in named if name.startswith(algorithm))
            if not named:
                valid = ", ".join(name for name, _ in self.named_lines(kind, members))
                raise ValueError(
                    f"algorithm {algorithm!r} does not apply to {kind.name} here; candidates: {valid}"
                )
        return schedule.cost_ns([line for _, line in named], size_bytes)

    def bus_bandwidth_gb_per_s(
        self,
        kind: OpKind,
        n_gpus: int,
        size_bytes: int,
        gpus_per_node: int | None = None,
        algorithm: str | None = None,
    ) -> float:
        """Predicted nccl-tests bus bandwidth in GB/s for ``size_bytes`` in its size column."""
        kind = OpKind(kind)
        if kind not in BUS_BANDWIDTH_FACTORS:
            raise ValueError(f"nccl-tests has no bus bandwidth for {kind.name}")
        time_ns = self.nccl_tests_time_ns(kind, n_gpus, size_bytes, gpus_per_node, algorithm)
        return size_bytes / time_ns * BUS_BANDWIDTH_FACTORS[kind](n_gpus)


def _sendrecv_pair(members: list[int], per_node: int) -> list[int]:
    """The slowest pair of sendrecv_perf's ring (rank i sends to i+1): one that crosses nodes if any."""
    if len(members) < 2:
        raise ValueError("sendrecv needs at least 2 GPUs")
    if len(members) > per_node:
        return [members[per_node - 1], members[per_node]]
    return members[:2]
