"""Cluster descriptions and the collective cost model (floor 2: imports topology/replay types only).

    from prism_megatron.network import CostModel, load_cluster
    model = CostModel(load_cluster("dgx-h100"))          # a preset name or a YAML/JSON file
    lines = model.cost_lines(OpKind.ALL_REDUCE, members)  # what the replay engine evaluates
    model.cost_ns(OpKind.ALL_GATHER, members, input_shard_bytes)

See model.py for the byte convention of each op kind, algorithms.py for the formulas, and
calibration.py for fitting a cluster to nccl-tests logs.
"""

from prism_megatron.network.cluster import ClusterSpec, IntraNodeFabric, NetworkFabric, Topology
from prism_megatron.network.loading import cluster_from_dict, load_cluster, save_cluster
from prism_megatron.network.model import CostModel
from prism_megatron.network.placement import GroupShape, group_shape, nccl_tests_members
from prism_megatron.network.presets import PRESETS

__all__ = [
    "PRESETS",
    "ClusterSpec",
    "CostModel",
    "GroupShape",
    "IntraNodeFabric",
    "NetworkFabric",
    "Topology",
    "cluster_from_dict",
    "group_shape",
    "load_cluster",
    "nccl_tests_members",
    "save_cluster",
]
