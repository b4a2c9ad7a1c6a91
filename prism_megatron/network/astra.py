"""A cluster description as ASTRA-sim's analytical network configuration (the YAML its
--network-configuration reads), so a job exported as Chakra traces can be simulated there too.

ASTRA-sim's analytical network is a stack of dimensions, each a topology (Ring, Switch,
FullyConnected) of `npus_count` members with a per-link bandwidth in its GB/s, which are 2**30
bytes/s (common/NetworkFunction.cpp, bw_GBps_to_Bpns), per direction, and a latency in ns; the
product of the counts is the number of NPUs. Our bandwidths are in 10**9 bytes/s, so each is
written divided by 2**30 / 10**9 (1.0737...): written as it is, every link would run 7.4 % fast.
A cluster maps to:

1. the node's NVLink domain: Switch (NVSwitch) or FullyConnected (direct links), `gpus_per_node`
   members, the NVLink bandwidth NCCL reaches (`nvlink_bandwidth_gb_per_s x nvlink_efficiency`),
   the NVLink step latency;
2. the network between nodes: Switch, one member per node of a leaf group (`nodes_per_leaf`, or all
   nodes when they fit under one leaf), each GPU's share of its node's NIC bandwidth
   (`nics_per_node x nic_bandwidth_gb_per_s x nic_efficiency / gpus_per_node`), the network step
   latency;
3. when the job spans several leaf groups: Switch across them, with the bandwidth divided by the
   oversubscription and the spine latency added.

Latency: ASTRA-sim's analytical backend charges a message `hops x latency` plus its size over the
bandwidth (BasicTopology::compute_communication_delay), and a Switch route is two hops (NPU ->
switch -> NPU) where a FullyConnected one is one. Our cluster's latencies are per step, a message
from one GPU to another, so a Switch dimension gets half the step latency per link and a message
there pays the step latency once.

What ASTRA-sim cannot express is dropped, and the file's comments say so: NVLink SHARP, rails (a
rail-optimised tree and a plain fat tree map alike) and the per-call base latency.
"""

from __future__ import annotations

import math

from prism_megatron.network.cluster import ClusterSpec

_NS_PER_US = 1000.0
ASTRA_GB = 1 << 30
"""Bytes in the GB of ASTRA-sim's analytical network bandwidths (its GB/s is 2**30 bytes/s)."""
HOPS = {"Switch": 2, "FullyConnected": 1, "Ring": 1}
"""Links a message crosses between two members of a dimension (a ring's neighbours: one)."""


def astra_network(spec: ClusterSpec, world_size: int) -> dict[str, list]:
    """The dimensions for a job of `world_size` GPUs on this cluster.

    Raises:
        ValueError: `world_size` is not a whole number of nodes (or of leaf groups, when it spans
            several).
    """
    gpus = spec.gpus_per_node
    if world_size < 1 or (world_size > gpus and world_size % gpus):
        raise ValueError(
            f"--world-size {world_size} must fill whole nodes of {gpus} GPUs on cluster {spec.name!r}"
        )
    intra = spec.intra_node
    dims = [
        (
            "Switch" if intra.nvswitch else "FullyConnected",
            min(world_size, gpus),
            intra.nvlink_bandwidth_gb_per_s * intra.nvlink_efficiency,
            intra.step_latency_us * _NS_PER_US,
        )
    ]
    num_nodes = max(1, world_size // gpus)
    if num_nodes > 1:
        net = spec.network
        per_gpu = net.nics_per_node * net.nic_bandwidth_gb_per_s * net.nic_efficiency / gpus
        latency_ns = net.step_latency_us * _NS_PER_US
        per_leaf = spec.topology.nodes_per_leaf
        if num_nodes <= per_leaf:
            dims.append(("Switch", num_nodes, per_gpu, latency_ns))
        else:
            if num_nodes % per_leaf:
                raise ValueError(
                    f"--world-size {world_size}: {num_nodes} nodes do not fill leaf groups of {per_leaf} "
                    f"nodes (topology.nodes_per_leaf of {spec.name!r})"
                )
            dims.append(("Switch", per_leaf, per_gpu, latency_ns))
            spine_ns = latency_ns + spec.topology.spine_latency_us * _NS_PER_US
            dims.append(("Switch", num_nodes // per_leaf, per_gpu / spec.topology.oversubscription, spine_ns))
    assert math.prod(d[1] for d in dims) == world_size, dims
    return {
        "topology": [d[0] for d in dims],
        "npus_count": [d[1] for d in dims],
        "bandwidth": [round(d[2] * 1e9 / ASTRA_GB, 3) for d in dims],  # 10**9 B/s -> 2**30 B/s
        "latency": [round(d[3] / HOPS[d[0]], 1) for d in dims],  # per link: a step is HOPS links
    }


def astra_network_yaml(spec: ClusterSpec, world_size: int) -> str:
    """The YAML text, with comments naming the source and what was left out."""
    config = astra_network(spec, world_size)
    dropped = ["the per-call base latency"]
    if spec.intra_node.nvls:
        dropped.append("NVLink SHARP")
    if spec.topology.kind == "rail-optimized-fat-tree":
        dropped.append("the rails of the rail-optimised fat tree")
    lines = [
        f"# ASTRA-sim analytical network for {world_size} NPUs on cluster {spec.name}",
        f"# ({spec.description})" if spec.description else "#",
        "# written by prism-megatron export astra-network; bandwidth per link and direction (the share",
        "# NCCL reaches) in ASTRA-sim's GB/s, 2**30 bytes/s; latency in ns per link (a Switch message",
        "# crosses two: half our step latency each). Not expressible here: " + ", ".join(dropped) + ".",
    ]
    for key in ("topology", "npus_count", "bandwidth", "latency"):
        values = ", ".join(str(v) for v in config[key])
        lines.append(f"{key}: [ {values} ]")
    return "\n".join(lines) + "\n"
