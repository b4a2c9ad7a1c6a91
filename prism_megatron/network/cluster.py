"""The cluster description the collective cost model reads: one node's fabric, the NICs, the topology.

Why a separate description: the emulated job runs on a cluster that is not here, so every
communication cost comes from what we know of that cluster. The description holds physical numbers
(link rates from datasheets) and the efficiency with which NCCL uses them (from NCCL's own constants
or from a calibration against nccl-tests logs), so a user can read and question each one.

Units: bandwidths are GB/s (10**9 bytes per second, the unit nccl-tests prints), per direction;
a NIC's 400 Gb/s line rate is 50 GB/s. Latencies are microseconds. A "node" is one NVLink domain:
8 GPUs in a DGX, 72 GPUs in a GB200 NVL72 rack.
"""

from __future__ import annotations

import dataclasses
import reprlib

TOPOLOGY_KINDS = ("rail-optimized-fat-tree", "fat-tree")


MAX_BANDWIDTH_GB_PER_S = 1e6
"""Upper bound of every bandwidth (GB/s): a thousand times any link built so far."""
MAX_LATENCY_US = 1e6
"""Upper bound of every latency (us): one second per step is a broken link, not a slow one."""
MAX_COUNT = 1 << 20
"""Upper bound of every count (GPUs or NICs per node, nodes per leaf, rails): the largest world."""
MAX_OVERSUBSCRIPTION = 1024.0


def _is_number(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool)


def _check_positive(owner: str, name: str, value: float, high: float = MAX_LATENCY_US) -> None:
    # Compared, never converted: a huge integer (10**400) is refused, not an OverflowError; NaN and
    # infinity fail the comparison.
    if not (_is_number(value) and 0 < value <= high):
        raise ValueError(
            f"{owner}.{name} must be a finite number > 0 and <= {high:g}, got {reprlib.repr(value)}"
        )


def _check_fraction(owner: str, name: str, value: float) -> None:
    if not (_is_number(value) and 0 < value <= 1):
        raise ValueError(f"{owner}.{name} must be in (0, 1], got {reprlib.repr(value)}")


def _check_bool(owner: str, name: str, value: object) -> None:
    if not isinstance(value, bool):
        raise ValueError(f"{owner}.{name} must be true or false (unquoted), got {value!r}")


def _check_count(owner: str, name: str, value: int, low: int = 1) -> None:
    if not (isinstance(value, int) and not isinstance(value, bool) and low <= value <= MAX_COUNT):
        raise ValueError(
            f"{owner}.{name} must be an integer from {low} to {MAX_COUNT}, got {reprlib.repr(value)}"
        )


@dataclasses.dataclass(frozen=True, kw_only=True)
class IntraNodeFabric:
    """The GPU-to-GPU fabric inside one node (NVLink through NVSwitch)."""

    nvlink_bandwidth_gb_per_s: float
    """NVLink bandwidth of one GPU, per direction, in GB/s (H100: 18 links x 25 GB/s = 450)."""

    nvlink_efficiency: float
    """Fraction of ``nvlink_bandwidth_gb_per_s`` that NCCL's copy kernels reach (ring bus bandwidth)."""

    step_latency_us: float
    """Latency of one pipelined step between two GPUs of a node with NCCL's Simple protocol."""

    nvswitch: bool = True
    """All GPUs of the node reach each other at full bandwidth through NVSwitch."""

    nvls: bool = False
    """NVLink SHARP: the switch reduces and multicasts (NCCL's NVLS and NVLS-tree algorithms)."""

    nvls_efficiency: float = 1.0
    """Fraction of ``nvlink_bandwidth_gb_per_s`` that NVLS moves per GPU (only read when ``nvls``)."""

    nvls_latency_us: float = 25.0
    """Fixed latency of one NVLS operation (only read when ``nvls``)."""

    def __post_init__(self) -> None:
        owner = "intra_node"
        _check_bool(owner, "nvswitch", self.nvswitch)
        _check_bool(owner, "nvls", self.nvls)
        _check_positive(
            owner, "nvlink_bandwidth_gb_per_s", self.nvlink_bandwidth_gb_per_s, MAX_BANDWIDTH_GB_PER_S
        )
        _check_fraction(owner, "nvlink_efficiency", self.nvlink_efficiency)
        _check_positive(owner, "step_latency_us", self.step_latency_us)
        _check_fraction(owner, "nvls_efficiency", self.nvls_efficiency)
        _check_positive(owner, "nvls_latency_us", self.nvls_latency_us)
        if self.nvls and not self.nvswitch:
            raise ValueError("intra_node.nvls needs intra_node.nvswitch: NVLink SHARP runs in the switch")


@dataclasses.dataclass(frozen=True, kw_only=True)
class NetworkFabric:
    """The NICs of one node and the latency of one step between nodes."""

    nics_per_node: int
    """Compute-fabric NICs per node; NIC ``i`` serves the GPUs ``i * gpus_per_node / nics_per_node`` on."""

    nic_bandwidth_gb_per_s: float
    """Line rate of one NIC, per direction, in GB/s (400 Gb/s NDR = 50)."""

    nic_efficiency: float
    """Fraction of ``nic_bandwidth_gb_per_s`` that NCCL reaches through one NIC."""

    step_latency_us: float
    """Latency of one pipelined step between GPUs of two nodes (NIC, one switch) with Simple."""

    def __post_init__(self) -> None:
        owner = "network"
        _check_count(owner, "nics_per_node", self.nics_per_node)
        _check_positive(owner, "nic_bandwidth_gb_per_s", self.nic_bandwidth_gb_per_s, MAX_BANDWIDTH_GB_PER_S)
        _check_fraction(owner, "nic_efficiency", self.nic_efficiency)
        _check_positive(owner, "step_latency_us", self.step_latency_us)


@dataclasses.dataclass(frozen=True, kw_only=True)
class Topology:
    """How the nodes' NICs are wired: leaves (one per rail in a rail-optimised tree) and spines."""

    kind: str = "rail-optimized-fat-tree"
    """``rail-optimized-fat-tree``: NIC ``i`` of every node of a leaf group sits on leaf (rail) ``i``;
    ``fat-tree``: all NICs of a node sit on one leaf."""

    nodes_per_leaf: int = 32
    """Nodes whose NICs share leaf switches (a scalable unit); traffic beyond them crosses a spine."""

    num_rails: int = 0
    """Rails (leaf switches per leaf group); NIC ``i`` is on rail ``i % num_rails``; 0 means one rail
    per NIC of the node."""

    oversubscription: float = 1.0
    """Leaf downlink : uplink bandwidth ratio; traffic that crosses a spine gets 1/oversubscription."""

    spine_latency_us: float = 0.3
    """Extra latency of a step that goes leaf -> spine -> leaf instead of through one leaf."""

    def __post_init__(self) -> None:
        if not isinstance(self.kind, str) or self.kind not in TOPOLOGY_KINDS:
            raise ValueError(f"topology.kind must be one of {', '.join(TOPOLOGY_KINDS)}, got {self.kind!r}")
        _check_count("topology", "nodes_per_leaf", self.nodes_per_leaf)
        _check_count("topology", "num_rails", self.num_rails, low=0)
        if not (_is_number(self.oversubscription) and 1 <= self.oversubscription <= MAX_OVERSUBSCRIPTION):
            raise ValueError(
                f"topology.oversubscription must be from 1 (non-blocking) to {MAX_OVERSUBSCRIPTION:g}, "
                f"got {reprlib.repr(self.oversubscription)}"
            )
        if not (_is_number(self.spine_latency_us) and 0 <= self.spine_latency_us <= MAX_LATENCY_US):
            raise ValueError(
                f"topology.spine_latency_us must be from 0 to {MAX_LATENCY_US:g}, got {reprlib.repr(self.spine_latency_us)}"
            )


@dataclasses.dataclass(frozen=True, kw_only=True)
class ClusterSpec:
    """Everything the cost model knows of the target cluster (see the module docstring for units)."""

    name: str
    """A short name for reports (a preset's name, or the calibrated file's)."""

    gpus_per_node: int
    """GPUs per node (NVLink domain); virtual rank r sits on node r // gpus_per_node."""

    base_latency_us: float
    """Fixed cost of one collective call (launch and setup), paid once per op."""

    intra_node: IntraNodeFabric
    network: NetworkFabric
    topology: Topology = dataclasses.field(default_factory=Topology)

    description: str = ""
    """Free text: the system, and where its numbers come from."""

    def __post_init__(self) -> None:
        if not (isinstance(self.name, str) and self.name):
            raise ValueError(f"cluster name must be a non-empty string, got {self.name!r}")
        if not isinstance(self.description, str):
            raise ValueError(f"cluster description must be text, got {self.description!r}")
        _check_count("cluster", "gpus_per_node", self.gpus_per_node)
        _check_positive("cluster", "base_latency_us", self.base_latency_us)

    @property
    def num_rails(self) -> int:
        """Rails of the network (``topology.num_rails``, or one per NIC of a node when 0)."""
        return self.topology.num_rails or self.network.nics_per_node

    def nic_of(self, local_gpu: int) -> int:
        """The NIC serving a GPU of a node (GPUs are shared evenly, in order, among the NICs)."""
        return local_gpu * self.network.nics_per_node // self.gpus_per_node

    def replace(self, **changes) -> ClusterSpec:
        """A copy with top-level fields changed (sections are replaced whole)."""
        return dataclasses.replace(self, **changes)

    def to_dict(self) -> dict:
        """Plain data in the layout of a cluster YAML file (``load_cluster`` reads it back)."""
        return {
            "schema_version": 1,
            "name": self.name,
            "description": self.description,
            "gpus_per_node": self.gpus_per_node,
            "base_latency_us": self.base_latency_us,
            "intra_node": dataclasses.asdict(self.intra_node),
            "network": dataclasses.asdict(self.network),
            "topology": dataclasses.asdict(self.topology),
        }
