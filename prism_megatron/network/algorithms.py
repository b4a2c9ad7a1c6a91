"""NCCL's collective algorithms as alpha-beta costs: one candidate line per algorithm and protocol.

Each candidate is ``latency + slope * bytes``, built symbolically on the parameters of
``parameters.py`` so that it can be evaluated (a CostLine) or fitted (calibration). The cost of an
op is the cheapest candidate at its size, which approximates NCCL's own choice by size and scale.

The model follows the structure of NCCL's tuning model (src/graph/tuning.cc): a base latency per
call, a latency per pipelined step on each level (NVLink inside a node, the network between nodes),
and a bus bandwidth set by the slowest level. Bandwidths come from counting the bytes each link
carries (the formulas below); NCCL pipelines every algorithm with a fixed chunk size per protocol,
so the pipeline fill is a fixed number of steps and each candidate is exactly linear in the size:
the per-step latency includes the chunk's transfer, as in NCCL's table. The non-linearity that is
left (protocols trade latency for bandwidth) is what the three protocol lines cover, one size band
each: LL for small messages, LL128 for medium, Simple for large.

Sizes: each builder works on ``S``, the bytes nccl-tests prints in its size column (the whole
buffer of all-reduce, the gathered output of all-gather, the input of reduce-scatter, one rank's
send buffer of all-to-all), which is also the byte count the cost model takes (model.py).
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping

from prism_megatron.network.cluster import ClusterSpec
from prism_megatron.network.parameters import CONSTANT_NS
from prism_megatron.network.placement import GroupShape
from prism_megatron.replay.schedule import CostLine

Terms = tuple[tuple[str, float], ...]
"""A sum of ``coefficient * parameter`` (parameter names from parameters.PARAMETERS)."""


@dataclasses.dataclass(frozen=True, slots=True)
class Candidate:
    """One algorithm/protocol choice for one op kind and group shape.

    Attributes:
        name: ``algorithm/protocol``, e.g. ``ring/ll128``.
        latency: the fixed part in ns.
        slopes: ns per byte of ``S`` for each link level the data crosses; the slowest level sets
            the pace (levels work concurrently in a pipelined algorithm), so the slope is the max.
    """

    name: str
    latency: Terms
    slopes: tuple[Terms, ...]

    def line(self, params: Mapping[str, float]) -> CostLine:
        """The CostLine at these parameters."""
        slope = max((evaluate(terms, params) for terms in self.slopes), default=0.0)
        return CostLine(latency_ns=evaluate(self.latency, params), ns_per_byte=slope)


def evaluate(terms: Terms, params: Mapping[str, float]) -> float:
    return sum(coefficient * params[name] for name, coefficient in terms)


@dataclasses.dataclass(frozen=True)
class Protocol:
    """An NCCL protocol: how much of the link carries payload, and its latency relative to Simple.

    Ratios from NCCL's tuning model (src/graph/tuning.cc): base latencies LL 6.6, LL128 14,
    Simple 8.4 us; per step on NVLink LL 0.6, LL128 1.9, Simple 3.4 us; per step on the network
    LL 2.7, LL128 4.0, Simple 14 us. Payload: LL sends 8 bytes of data per 16-byte line (0.5);
    LL128 120 of 128 bytes, which NCCL rounds to 0.92; Simple all of it.
    """

    name: str
    payload_fraction: float
    base_factor: float
    intra_step_factor: float
    inter_step_factor: float


LL = Protocol("ll", 0.5, 1.0, 0.6 / 3.4, 2.7 / 14.0)
LL128 = Protocol("ll128", 0.92, 14.0 / 6.6, 1.9 / 3.4, 4.0 / 14.0)
SIMPLE = Protocol("simple", 1.0, 8.4 / 6.6, 1.0, 1.0)
PROTOCOLS = (LL, LL128, SIMPLE)
P2P_PROTOCOLS = (LL, SIMPLE)  # NCCL's send/recv uses LL below a threshold, Simple above

TREE_EFFICIENCY = 0.92  # NCCL tuning.cc: tree all-reduce bus bandwidth x 0.92
PAT_EFFICIENCY = 0.75  # NCCL tuning.cc: PAT bus bandwidth x 0.75
PAT_BASE_FACTOR = 8.0 / 6.6  # NCCL tuning.cc: PAT base latency 8 us
PAT_PER_RANK_NS = 2800.0  # NCCL tuning.cc: PAT's remaining linear part, 2.8 us per rank
PAT_LOG_STEP_FACTOR = 1.0 / 3.5  # NCCL tuning.cc: PAT's log latency, network step / 3.5


@dataclasses.dataclass(frozen=True)
class Levels:
    """The per-shape coefficients shared by every algorithm on one group."""

    shape: GroupShape
    net_per_node: float
    """Multiplier on ``nic_ns_per_byte`` for a node's whole egress: oversubscription / NICs used."""
    net_per_gpu: float
    """Multiplier on ``nic_ns_per_byte`` for one GPU's share of its node's NICs."""

    @classmethod
    def of(cls, spec: ClusterSpec, shape: GroupShape, concurrent_groups: int | None = None) -> Levels:
        """The coefficients of `shape`, its node's NICs shared as `concurrent_groups` says.

        Link sharing: with G groups of this shape communicating at once, a node holds
        s = min(G, gpus_per_node // max_gpus_per_node) of them (each on GPUs of its own). A ring
        leaves the node through min_nics_per_node NICs; s rings need s times that, so each NIC
        carries max(1, s min_nics_per_node / nics_per_node) rings. A fan's GPU gets its share of the
        node's NICs among the s max_gpus_per_node GPUs sending at once, at most its own NICs
        (max(1, nics per GPU)). None keeps the model's old assumptions, every GPU of the node busy
        for a fan and a ring alone on its NICs; 1 is a group alone (`sim.concurrency` asks for it
        and for the schedule's G).
        """
        oversubscription = spec.topology.oversubscription if shape.crosses_spine else 1.0
        nics, gpus = spec.network.nics_per_node, spec.gpus_per_node
        nics_per_gpu = nics / gpus
        if concurrent_groups is None:
            ring_load, fan_share = 1.0, nics_per_gpu
        else:
            on_node = max(1, min(concurrent_groups, gpus // shape.max_gpus_per_node))
            ring_load = max(1.0, on_node * shape.min_nics_per_node / nics)
            busy_gpus = min(gpus, on_node * shape.max_gpus_per_node)
            fan_share = min(nics / busy_gpus, max(1.0, nics_per_gpu))
        return cls(
            shape=shape,
            net_per_node=oversubscription * ring_load / shape.min_nics_per_node,
            net_per_gpu=oversubscription / fan_share,
        )

    def step_latency(
        self, protocol_intra: float, protocol_inter: float, intra_steps: float, inter_steps: float
    ) -> list[tuple[str, float]]:
        """Latency terms of ``intra_steps`` NVLink steps and ``inter_steps`` network steps."""
        terms = [
            ("intra_step_ns", intra_steps * protocol_intra),
            ("inter_step_ns", inter_steps * protocol_inter),
        ]
        if self.shape.crosses_spine:
            terms.append(("spine_ns", inter_steps))
        return terms


def log2_ceil(value: int) -> int:
    return max(0, math.ceil(math.log2(value))) if value > 1 else 0


def ring(levels: Levels, volume: float, steps: int, inter_steps: int) -> list[Candidate]:
    """A ring (or chain) over all ranks, rail-aligned across nodes, one line per protocol.

    Each rank sends ``volume * S`` bytes on its outgoing link (all-reduce: 2(n-1)/n, all-gather and
    reduce-scatter: (n-1)/n, broadcast and reduce as a pipelined chain: 1). NCCL runs several rings
    (channels) at once; each crosses every node boundary once through one NIC, so a node's NICs
    together carry ``volume * S`` too. Time = volume * S / min(NVLink rate, node NIC rate).
    Latency: ``steps`` steps, of which ``inter_steps`` cross the network.
    """
    shape = levels.shape
    candidates = []
    for protocol in PROTOCOLS:
        slopes = []
        if shape.max_gpus_per_node > 1:
            slopes.append((("nvlink_ns_per_byte", volume / protocol.payload_fraction),))
        if shape.num_nodes > 1:
            slopes.append((("nic_ns_per_byte", volume * levels.net_per_node / protocol.payload_fraction),))
        latency = [("base_ns", protocol.base_factor)]
        latency += levels.step_latency(
            protocol.intra_step_factor, protocol.inter_step_factor, steps - inter_steps, inter_steps
        )
        candidates.append(Candidate(f"ring/{protocol.name}", tuple(latency), tuple(slopes)))
    return candidates


def tree(levels: Levels) -> list[Candidate]:
    """NCCL's hierarchical tree all-reduce: a chain inside each node, double binary trees across nodes.

    Reduce up then broadcast down, pipelined. Inside a node every GPU of the chain forwards S up and
    S down: 2 S per GPU on NVLink. Across nodes two binary trees each carry S/2; each of the N-1
    edges of a tree carries S/2 up and S/2 down, so the nodes send 2 (N-1) S in all, 2 (N-1)/N S
    each on average (the two trees are built so that every node is inner in at most one). On two
    nodes that is S against the ring's 2 (n-1)/n S, which is why the tree wins there. Depth
    (latency): g-1 NVLink hops and log2(N) network hops, each way.
    """
    shape = levels.shape
    nodes, gpus = shape.num_nodes, shape.max_gpus_per_node
    depth = log2_ceil(nodes)
    candidates = []
    for protocol in PROTOCOLS:
        rate = TREE_EFFICIENCY * protocol.payload_fraction
        slopes = [(("nic_ns_per_byte", 2.0 * (nodes - 1) / nodes * levels.net_per_node / rate),)]
        if gpus > 1:
            slopes.append((("nvlink_ns_per_byte", 2.0 / rate),))
        latency = [("base_ns", protocol.base_factor)]
        latency += levels.step_latency(
            protocol.intra_step_factor, protocol.inter_step_factor, 2 * (gpus - 1), 2 * depth
        )
        candidates.append(Candidate(f"tree/{protocol.name}", tuple(latency), tuple(slopes)))
    return candidates


def nvls(levels: Levels) -> list[Candidate]:
    """NVLink SHARP all-reduce in one node: the switch reduces and multicasts (Simple protocol only).

    Each GPU reduce-loads its 1/g of the buffer from the switch, which reads S from every GPU in
    all, and multicast-stores S/g, which the switch writes to every GPU: per GPU S (1 + 1/g) each
    way on NVLink at the NVLS rate. Latency: one fixed NVLS latency (NCCL's model has no base term).
    """
    gpus = levels.shape.max_gpus_per_node
    return [Candidate("nvls/simple", (("nvls_ns", 1.0),), ((("nvls_ns_per_byte", 1.0 + 1.0 / gpus),),))]


def nvls_tree(levels: Levels) -> list[Candidate]:
    """NVLS inside each node, trees across nodes (NCCL's NVLS_TREE; Simple protocol only).

    The in-node part moves S (1 + 1/g) per GPU as in ``nvls``; the network part is the tree's
    2 (N-1)/N S per node. Latency: the NVLS latency plus log2(N) network steps each way.
    """
    shape = levels.shape
    nodes, gpus = shape.num_nodes, shape.max_gpus_per_node
    latency = [("nvls_ns", 1.0), *levels.step_latency(0.0, 1.0, 0, 2 * log2_ceil(nodes))]
    slopes = (
        (("nvls_ns_per_byte", 1.0 + 1.0 / gpus),),
        (("nic_ns_per_byte", 2.0 * (nodes - 1) / nodes * levels.net_per_node / TREE_EFFICIENCY),),
    )
    return [Candidate("nvls_tree/simple", tuple(latency), slopes)]


def pat(levels: Levels) -> list[Candidate]:
    """PAT all-gather / reduce-scatter for one GPU per node (NCCL 2.23+; Simple protocol only).

    Logarithmic latency across nodes with a remaining linear part per rank, and the ring's bytes
    at 0.75 of its bandwidth (constants of NCCL's tuning model).
    """
    shape = levels.shape
    volume = (shape.num_ranks - 1) / shape.num_ranks
    latency = (
        ("base_ns", PAT_BASE_FACTOR),
        ("inter_step_ns", log2_ceil(shape.num_nodes) * PAT_LOG_STEP_FACTOR),
        (CONSTANT_NS, shape.num_ranks * PAT_PER_RANK_NS),
    )
    slopes = ((("nic_ns_per_byte", volume * levels.net_per_node / PAT_EFFICIENCY),),)
    return [Candidate("pat/simple", latency, slopes)]


def fan(levels: Levels, name: str, local_share: float, remote_share: float) -> list[Candidate]:
    """Concurrent point-to-point transfers from (or to) one GPU: all-to-all, gather, scatter, send.

    The GPU moves ``local_share * S`` over NVLink (to peers of its node) and ``remote_share * S``
    through its share of its node's NICs (all GPUs of the node are busy at once). Latency: one step
    on the farthest level, all peers in flight together (NCCL's per-peer scheduling is not modelled).
    """
    shape = levels.shape
    remote = shape.num_nodes > 1
    candidates = []
    for protocol in P2P_PROTOCOLS:
        slopes = []
        if local_share > 0:
            slopes.append((("nvlink_ns_per_byte", local_share / protocol.payload_fraction),))
        if remote_share > 0:
            slopes.append(
                (("nic_ns_per_byte", remote_share * levels.net_per_gpu / protocol.payload_fraction),)
            )
        latency = [("base_ns", protocol.base_factor)]
        latency += levels.step_latency(
            protocol.intra_step_factor, protocol.inter_step_factor, 0 if remote else 1, 1 if remote else 0
        )
        candidates.append(Candidate(f"{name}/{protocol.name}", tuple(latency), tuple(slopes)))
    return candidates
