"""The cost model's parameters as one flat vector, and the way back to a cluster description.

Every algorithm's cost is linear in these parameters (latencies in ns, inverse bandwidths in ns per
byte), so the same symbolic costs serve two purposes: evaluated at a cluster's parameters they are
the CostLines the replay engine reads, and stacked over the rows of nccl-tests logs they are the
design matrix that calibration solves by least squares.

Units: 1 GB/s is 1 byte per ns, so ``nvlink_ns_per_byte = 1 / (GB/s reached)``.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Mapping

from prism_megatron.network.cluster import ClusterSpec

CONSTANT_NS = "constant_ns"
"""A pseudo-parameter equal to 1: terms on it are fixed costs in ns."""

LATENCY_PARAMETERS = ("base_ns", "intra_step_ns", "inter_step_ns", "nvls_ns")
BANDWIDTH_PARAMETERS = ("nvlink_ns_per_byte", "nic_ns_per_byte", "nvls_ns_per_byte")
FITTED_PARAMETERS = LATENCY_PARAMETERS + BANDWIDTH_PARAMETERS
"""What calibration fits; ``spine_ns`` and the constant stay as the base cluster says."""

PARAMETERS = (*FITTED_PARAMETERS, "spine_ns", CONSTANT_NS)


def parameters_of(spec: ClusterSpec) -> dict[str, float]:
    """The parameter vector of a cluster (every name in PARAMETERS)."""
    intra, net = spec.intra_node, spec.network
    return {
        "base_ns": spec.base_latency_us * 1e3,
        "intra_step_ns": intra.step_latency_us * 1e3,
        "inter_step_ns": net.step_latency_us * 1e3,
        "nvls_ns": intra.nvls_latency_us * 1e3,
        "nvlink_ns_per_byte": 1.0 / (intra.nvlink_bandwidth_gb_per_s * intra.nvlink_efficiency),
        "nic_ns_per_byte": 1.0 / (net.nic_bandwidth_gb_per_s * net.nic_efficiency),
        "nvls_ns_per_byte": 1.0 / (intra.nvlink_bandwidth_gb_per_s * intra.nvls_efficiency),
        "spine_ns": spec.topology.spine_latency_us * 1e3,
        CONSTANT_NS: 1.0,
    }


MIN_EFFICIENCY = 0.02
"""Calibration keeps every efficiency in [MIN_EFFICIENCY, 1]."""
MAX_LATENCY_NS = 1e7


def parameter_bounds(spec: ClusterSpec) -> dict[str, tuple[float, float]]:
    """Physical bounds of the fitted parameters: efficiencies in [MIN_EFFICIENCY, 1] of the line
    rates of ``spec``, latencies in [1 ns, 10 ms]."""
    nvlink, nic = spec.intra_node.nvlink_bandwidth_gb_per_s, spec.network.nic_bandwidth_gb_per_s
    bounds = {key: (1.0, MAX_LATENCY_NS) for key in LATENCY_PARAMETERS}
    for key, line_rate_gb_per_s in (
        ("nvlink_ns_per_byte", nvlink),
        ("nvls_ns_per_byte", nvlink),
        ("nic_ns_per_byte", nic),
    ):
        bounds[key] = (1.0 / line_rate_gb_per_s, 1.0 / (line_rate_gb_per_s * MIN_EFFICIENCY))
    return bounds


def cluster_with_parameters(spec: ClusterSpec, values: Mapping[str, float], *, name: str) -> ClusterSpec:
    """A copy of ``spec`` whose latencies and efficiencies give the parameter ``values``.

    Link rates, NIC counts and the topology stay those of ``spec``: a fitted bandwidth becomes the
    efficiency with which that link rate is used.

    Raises:
        ValueError: a fitted bandwidth exceeds the line rate of ``spec`` (the base cluster does not
            match the measured system), or a value is not positive.
    """
    merged = {**parameters_of(spec), **values}
    for key in FITTED_PARAMETERS:
        if not merged[key] > 0:
            raise ValueError(f"parameter {key} must be > 0, got {merged[key]!r}")
    intra, net = spec.intra_node, spec.network
    nvlink_eff = _efficiency("NVLink", merged["nvlink_ns_per_byte"], intra.nvlink_bandwidth_gb_per_s)
    nvls_eff = _efficiency("NVLS", merged["nvls_ns_per_byte"], intra.nvlink_bandwidth_gb_per_s)
    nic_eff = _efficiency("NIC", merged["nic_ns_per_byte"], net.nic_bandwidth_gb_per_s)
    return spec.replace(
        name=name,
        base_latency_us=merged["base_ns"] / 1e3,
        intra_node=dataclasses.replace(
            intra,
            nvlink_efficiency=nvlink_eff,
            step_latency_us=merged["intra_step_ns"] / 1e3,
            nvls_efficiency=nvls_eff,
            nvls_latency_us=merged["nvls_ns"] / 1e3,
        ),
        network=dataclasses.replace(
            net, nic_efficiency=nic_eff, step_latency_us=merged["inter_step_ns"] / 1e3
        ),
    )


def _efficiency(link: str, ns_per_byte: float, line_rate_gb_per_s: float) -> float:
    reached_gb_per_s = 1.0 / ns_per_byte
    efficiency = reached_gb_per_s / line_rate_gb_per_s
    if efficiency > 1.0 + 1e-9:
        raise ValueError(
            f"the fitted {link} bandwidth {reached_gb_per_s:.1f} GB/s exceeds the base cluster's line rate "
            f"{line_rate_gb_per_s:.1f} GB/s; choose a base cluster that matches the measured system"
        )
    return min(efficiency, 1.0)
