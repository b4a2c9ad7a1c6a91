"""Built-in cluster descriptions of common NVIDIA systems, each number with its public source.

Parameters come from hardware specifications and from efficiency factors NCCL itself publishes;
none is tuned to a measurement that the comparison in benchmarks/network checks them against.

Shared sources, cited below by their letter:
  [NCCL-topo]   NCCL src/graph/topo.h: the NVLink bandwidth per link that NCCL's topology search
                assumes it achieves: SM80 20.0 GB/s, SM90 20.6 GB/s, SM100 40.1 GB/s (line rates
                25, 25 and 50 GB/s per direction). Efficiency = achieved / line rate.
  [NCCL-tuning] NCCL src/graph/tuning.cc, the latency tables of its algorithm-selection model:
                base latency of a ring/LL call 6.6 us; one NVLink ring step with Simple 3.4 us; one
                network ring step with Simple 14 us; NVLS 25 us; NVLS efficiency factor Hopper 0.85,
                Blackwell 0.74 (multiplies the NVLink bandwidth of [NCCL-topo]).
  [NCCL-NIC]    NCCL maintainer, NVIDIA/nccl-tests issue 290 (2025-03): "For NDR @ 400Gbps you
                should see 46-48GB/s per NIC" -> 0.94 of the 50 GB/s line rate (middle of the
                range); used for every InfiniBand generation.
"""

from __future__ import annotations

from prism_megatron.network.cluster import ClusterSpec, IntraNodeFabric, NetworkFabric, Topology

# [NCCL-tuning] latencies shared by every preset.
_BASE_LATENCY_US = 6.6
_NVLINK_STEP_US = 3.4
_NET_STEP_US = 14.0
_NVLS_LATENCY_US = 25.0
# [NCCL-NIC]
_IB_EFFICIENCY = 0.94
# Two extra switch traversals (leaf -> spine -> leaf), about 130 ns each on Quantum-class
# InfiniBand switches plus cable; recalled, not read from a datasheet.
_SPINE_LATENCY_US = 0.3

DGX_A100 = ClusterSpec(
    name="dgx-a100",
    description="NVIDIA DGX A100: 8x A100 SXM4, NVSwitch gen 2, 8x ConnectX-6 HDR 200 Gb/s",
    gpus_per_node=8,
    base_latency_us=_BASE_LATENCY_US,
    intra_node=IntraNodeFabric(
        # A100 datasheet: third-generation NVLink, 12 links, 600 GB/s total = 300 GB/s per direction.
        nvlink_bandwidth_gb_per_s=300.0,
        nvlink_efficiency=20.0 / 25.0,  # [NCCL-topo] SM80
        step_latency_us=_NVLINK_STEP_US,
        nvswitch=True,  # DGX A100 datasheet: 6x NVSwitch
        nvls=False,  # NVLink SHARP arrived with third-generation NVSwitch (Hopper)
    ),
    network=NetworkFabric(
        # DGX A100 datasheet: 8x single-port ConnectX-6 VPI 200 Gb/s HDR InfiniBand for compute.
        nics_per_node=8,
        nic_bandwidth_gb_per_s=25.0,
        nic_efficiency=_IB_EFFICIENCY,
        step_latency_us=_NET_STEP_US,
    ),
    # DGX SuperPOD (A100) reference architecture: scalable units of 20 nodes, rail-optimised,
    # non-blocking fat tree.
    topology=Topology(nodes_per_leaf=20, oversubscription=1.0, spine_latency_us=_SPINE_LATENCY_US),
)

DGX_H100 = ClusterSpec(
    name="dgx-h100",
    description="NVIDIA DGX H100: 8x H100 SXM5, NVSwitch gen 3 with NVLink SHARP, 8x ConnectX-7 NDR 400 Gb/s",
    gpus_per_node=8,
    base_latency_us=_BASE_LATENCY_US,
    intra_node=IntraNodeFabric(
        # H100 datasheet: fourth-generation NVLink, 18 links, 900 GB/s total = 450 GB/s per direction.
        nvlink_bandwidth_gb_per_s=450.0,
        nvlink_efficiency=20.6 / 25.0,  # [NCCL-topo] SM90
        step_latency_us=_NVLINK_STEP_US,
        nvswitch=True,  # DGX H100 datasheet: 4x third-generation NVSwitch
        nvls=True,
        nvls_efficiency=20.6 / 25.0 * 0.85,  # [NCCL-topo] SM90 x [NCCL-tuning] Hopper NVLS factor
        nvls_latency_us=_NVLS_LATENCY_US,
    ),
    network=NetworkFabric(
        # DGX H100 datasheet: 8x ConnectX-7 (single-port NDR 400 Gb/s each) for the compute fabric.
        nics_per_node=8,
        nic_bandwidth_gb_per_s=50.0,
        nic_efficiency=_IB_EFFICIENCY,
        step_latency_us=_NET_STEP_US,
    ),
    # DGX SuperPOD (H100) reference architecture: scalable units of 32 nodes, rail-optimised,
    # non-blocking fat tree.
    topology=Topology(nodes_per_leaf=32, oversubscription=1.0, spine_latency_us=_SPINE_LATENCY_US),
)

DGX_H200 = DGX_H100.replace(
    name="dgx-h200",
    # DGX H200 datasheet: same NVLink 4 / NVSwitch (900 GB/s per GPU) and 8x ConnectX-7 400 Gb/s as
    # the DGX H100; only the GPU memory differs, which the network model does not see.
    description="NVIDIA DGX H200: 8x H200 SXM, NVSwitch gen 3 with NVLink SHARP, 8x ConnectX-7 NDR 400 Gb/s",
)

DGX_B200 = ClusterSpec(
    name="dgx-b200",
    description="NVIDIA DGX B200: 8x B200 SXM, fifth-generation NVLink / NVSwitch, 8x ConnectX-7 400 Gb/s",
    gpus_per_node=8,
    base_latency_us=_BASE_LATENCY_US,
    intra_node=IntraNodeFabric(
        # DGX B200 datasheet: 8x B200, 1.8 TB/s NVLink per GPU (fifth generation) = 900 GB/s per
        # direction, 14.4 TB/s aggregate NVLink bandwidth through 2x NVLink switch chips.
        nvlink_bandwidth_gb_per_s=900.0,
        nvlink_efficiency=40.1 / 50.0,  # [NCCL-topo] SM100
        step_latency_us=_NVLINK_STEP_US,
        nvswitch=True,
        nvls=True,  # fifth-generation NVLink switches carry SHARP in-network reduction
        nvls_efficiency=40.1 / 50.0 * 0.74,  # [NCCL-topo] SM100 x [NCCL-tuning] Blackwell NVLS factor
        nvls_latency_us=_NVLS_LATENCY_US,
    ),
    network=NetworkFabric(
        # DGX B200 datasheet: 4x OSFP ports serving 8x single-port ConnectX-7 VPI, up to 400 Gb/s
        # InfiniBand/Ethernet each, for the compute fabric.
        nics_per_node=8,
        nic_bandwidth_gb_per_s=50.0,
        nic_efficiency=_IB_EFFICIENCY,
        step_latency_us=_NET_STEP_US,
    ),
    # DGX SuperPOD (B200) reference architecture: scalable units of 32 nodes, rail-optimised,
    # non-blocking fat tree (as the H100 SuperPOD).
    topology=Topology(nodes_per_leaf=32, oversubscription=1.0, spine_latency_us=_SPINE_LATENCY_US),
)

GB200_NVL72 = ClusterSpec(
    name="gb200-nvl72",
    description="NVIDIA GB200 NVL72: 72 Blackwell GPUs in one NVLink domain, one 400 Gb/s NIC per GPU",
    gpus_per_node=72,  # GB200 NVL72 datasheet: 72 GPUs in one NVLink domain (a node here)
    base_latency_us=_BASE_LATENCY_US,
    intra_node=IntraNodeFabric(
        # GB200 NVL72 datasheet: fifth-generation NVLink, 1.8 TB/s per GPU = 900 GB/s per direction.
        nvlink_bandwidth_gb_per_s=900.0,
        nvlink_efficiency=40.1 / 50.0,  # [NCCL-topo] SM100
        step_latency_us=_NVLINK_STEP_US,
        nvswitch=True,  # 9 NVLink switch trays
        nvls=True,  # NVLink Switch with SHARP in-network reduction
        nvls_efficiency=40.1 / 50.0 * 0.74,  # [NCCL-topo] SM100 x [NCCL-tuning] Blackwell NVLS factor
        nvls_latency_us=_NVLS_LATENCY_US,
    ),
    network=NetworkFabric(
        # Each of the 18 compute trays holds 4 GPUs and 4 ConnectX-7 400 Gb/s NICs for the compute
        # fabric, one per GPU (recalled from the DGX GB200 user guide, not re-read).
        nics_per_node=72,
        nic_bandwidth_gb_per_s=50.0,
        nic_efficiency=_IB_EFFICIENCY,
        step_latency_us=_NET_STEP_US,
    ),
    # DGX SuperPOD (GB200) reference architecture: scalable units of 8 racks, rail-optimised with one
    # rail per NIC position of a compute tray (4), non-blocking (recalled, not re-read).
    topology=Topology(
        nodes_per_leaf=8, num_rails=4, oversubscription=1.0, spine_latency_us=_SPINE_LATENCY_US
    ),
)

PRESETS: dict[str, ClusterSpec] = {
    spec.name: spec for spec in (DGX_A100, DGX_H100, DGX_H200, DGX_B200, GB200_NVL72)
}
"""Built-in clusters by name; ``load_cluster(name)`` returns one."""
