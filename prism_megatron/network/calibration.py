"""Fitting the cost model's parameters to nccl-tests measurements.

Every candidate cost is linear in the parameters (parameters.py), but the cost of a row is the
minimum over candidates, and a candidate's slope the maximum over link levels. The fit therefore
alternates two steps until the choices stop changing: (1) at the current parameters, find for each
row the cheapest candidate and its bottleneck level; (2) with those choices fixed, the model is
linear, so solve for the parameters by least squares (numpy). Rows are weighted by 1/time so that
an 8-byte latency and an 8-GB bandwidth count alike (relative error), and a weak pull towards the
base cluster keeps parameters that the logs cannot tell apart where the base puts them.
Parameters that no row depends on (no multi-node log: no network numbers) keep the base's values.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Sequence

import numpy as np

from prism_megatron.network.algorithms import Candidate, evaluate
from prism_megatron.network.cluster import ClusterSpec
from prism_megatron.network.model import candidates_for
from prism_megatron.network.nccl_tests import NcclTestsRun
from prism_megatron.network.parameters import (
    BANDWIDTH_PARAMETERS,
    FITTED_PARAMETERS,
    LATENCY_PARAMETERS,
    cluster_with_parameters,
    parameter_bounds,
    parameters_of,
)
from prism_megatron.network.placement import group_shape
from prism_megatron.replay.schedule import OpKind

PRIOR_WEIGHT = 1e-3
"""Weight of the pull towards the base cluster, relative to one row's relative error."""
MAX_ITERATIONS = 50
START_DISTORTIONS = ((1.0, 1.0), (3.0, 1.0), (3.0, 1.0 / 0.75))
"""Starting points: (factor on latencies, factor on ns per byte) applied to the base cluster."""


@dataclasses.dataclass(frozen=True)
class Observation:
    """One measured row, ready for the fit: its candidates and its size in units of S."""

    source: str
    line_number: int
    candidates: tuple[Candidate, ...]
    size_s: float
    time_ns: float


@dataclasses.dataclass(frozen=True)
class CalibrationResult:
    """The fitted cluster and how well it reproduces the measurements.

    Attributes:
        spec: the base cluster with fitted latencies and efficiencies.
        fitted: the parameter values that the logs determined (others kept the base's values).
        relative_errors: (predicted - measured) / measured for every row, in input order.
        iterations: rounds of choose-candidates-then-solve until the choices were stable.
        warnings: doubts about the fit a user should read (a link pinned at its line rate).
    """

    spec: ClusterSpec
    fitted: dict[str, float]
    relative_errors: tuple[float, ...]
    iterations: int
    warnings: tuple[str, ...] = ()

    @property
    def rms_relative_error(self) -> float:
        return float(np.sqrt(np.mean(np.square(self.relative_errors))))


def observations(base: ClusterSpec, runs: Sequence[NcclTestsRun]) -> list[Observation]:
    """Turn parsed runs into observations on ``base``'s cluster layout.

    Raises:
        ValueError: a run has more GPUs per host than ``base.gpus_per_node`` (wrong base cluster).
    """
    found = []
    for run in runs:
        local_gpus = [local for _, local in run.placement]
        if max(local_gpus) >= base.gpus_per_node:
            raise ValueError(
                f"{run.source}: device {max(local_gpus)} does not exist on {base.name} "
                f"({base.gpus_per_node} GPUs per node); choose a base cluster that matches the measured system"
            )
        members = [node * base.gpus_per_node + local for node, local in run.placement]
        if run.kind == OpKind.SEND:
            members = _slowest_pair(members, base.gpus_per_node)
        shape = group_shape(base, members)
        candidates = tuple(candidates_for(base, run.kind, shape))
        for row in run.rows:  # the candidates cost bytes of S, the nccl-tests size column
            if not (math.isfinite(row.time_us) and row.time_us > 0):  # a row built by hand, not parsed
                raise ValueError(
                    f"{run.source}:{row.line_number}: time {row.time_us!r} us is not a finite number > 0; "
                    "the fit needs measured times"
                )
            found.append(
                Observation(run.source, row.line_number, candidates, row.size_bytes, row.time_us * 1e3)
            )
    return found


def _slowest_pair(members: list[int], gpus_per_node: int) -> list[int]:
    """sendrecv_perf's slowest pair: one that crosses nodes when the run spans several."""
    for sender, receiver in zip(members, members[1:] + members[:1], strict=True):
        if sender // gpus_per_node != receiver // gpus_per_node:
            return [sender, receiver]
    return members[:2]


def calibrate(base: ClusterSpec, runs: Sequence[NcclTestsRun], *, name: str) -> CalibrationResult:
    """Fit ``base``'s latencies and efficiencies to the runs (see the module docstring).

    The alternation can settle in a local optimum (say, small messages explained by the wrong
    algorithm), so it starts from the base cluster and from two distorted copies of it (slower
    steps; slower steps and lower efficiencies) and keeps the best fit.
    """
    rows = observations(base, runs)
    if not rows:
        raise ValueError("no nccl-tests rows to calibrate from")
    prior = parameters_of(base)
    bounds = parameter_bounds(base)
    best = None
    for latency_factor, bandwidth_factor in START_DISTORTIONS:
        start = {
            key: value * (latency_factor if key in LATENCY_PARAMETERS else bandwidth_factor)
            if key in FITTED_PARAMETERS
            else value
            for key, value in prior.items()
        }
        start = {
            key: min(max(value, bounds[key][0]), bounds[key][1]) if key in bounds else value
            for key, value in start.items()
        }
        fit = _alternate(rows, prior, start, bounds)
        if best is None or fit[0] < best[0]:
            best = fit
    _, params, choices, iterations = best
    errors = tuple(_predict(row, params) / row.time_ns - 1.0 for row in rows)
    fitted = {key: params[key] for key in FITTED_PARAMETERS if _is_determined(key, rows, choices)}
    warnings = tuple(
        f"{key.removesuffix('_ns_per_byte')} runs at the base cluster's full line rate "
        f"({1 / bounds[key][0]:.1f} GB/s) in the fit: the measurements may come from a faster system than "
        f"{base.name}, or from an algorithm the model lacks; check the base cluster"
        for key in BANDWIDTH_PARAMETERS
        if key in fitted and fitted[key] <= bounds[key][0] * (1 + 1e-9)
    )
    spec = cluster_with_parameters(base, fitted, name=name)
    return CalibrationResult(
        spec=spec, fitted=fitted, relative_errors=errors, iterations=iterations, warnings=warnings
    )


def _alternate(rows, prior, params, bounds):
    """Choose candidates, solve, repeat until the choices are stable; (squared error, params, choices, rounds)."""
    previous, iterations = None, 0
    while iterations < MAX_ITERATIONS:
        iterations += 1
        choices = [_choose(row, params) for row in rows]
        params = _solve(rows, choices, prior, params, bounds)
        if choices == previous:
            break
        previous = choices
    error = sum((_predict(row, params) / row.time_ns - 1.0) ** 2 for row in rows)
    return error, params, choices, iterations


def _cost(candidate: Candidate, size_s: float, params: dict[str, float]) -> tuple[float, int]:
    """(cost in ns, index of the bottleneck slope) of one candidate at one size."""
    slopes = [evaluate(terms, params) for terms in candidate.slopes] or [0.0]
    bottleneck = int(np.argmax(slopes))
    return evaluate(candidate.latency, params) + slopes[bottleneck] * size_s, bottleneck


def _choose(row: Observation, params: dict[str, float]) -> tuple[int, int]:
    costs = [_cost(candidate, row.size_s, params) for candidate in row.candidates]
    best = min(range(len(costs)), key=lambda i: costs[i][0])
    return best, costs[best][1]


def _predict(row: Observation, params: dict[str, float]) -> float:
    return min(_cost(candidate, row.size_s, params)[0] for candidate in row.candidates)


def _row_terms(row: Observation, choice: tuple[int, int]) -> dict[str, float]:
    """Coefficient of each parameter in the row's chosen cost."""
    candidate = row.candidates[choice[0]]
    coefficients: dict[str, float] = {}
    for name, value in candidate.latency:
        coefficients[name] = coefficients.get(name, 0.0) + value
    if candidate.slopes:
        for name, value in candidate.slopes[choice[1]]:
            coefficients[name] = coefficients.get(name, 0.0) + value * row.size_s
    return coefficients


def _is_determined(key: str, rows: Sequence[Observation], choices) -> bool:
    return any(_row_terms(row, choice).get(key, 0.0) > 0 for row, choice in zip(rows, choices, strict=True))


def _solve(rows, choices, prior, params, bounds) -> dict[str, float]:
    """Bounded least squares for the parameters the chosen costs depend on.

    Unknowns are ratios to the base values (well conditioned). A parameter that leaves its bounds
    is pinned to the bound and the rest solved again (an active-set method).
    """
    free = [key for key in FITTED_PARAMETERS if _is_determined(key, rows, choices)]
    solved = dict(params)
    terms = [_row_terms(row, choice) for row, choice in zip(rows, choices, strict=True)]
    while free:
        matrix = np.zeros((len(rows) + len(free), len(free)))
        target = np.zeros(len(rows) + len(free))
        for i, (row, row_terms) in enumerate(zip(rows, terms, strict=True)):
            fixed = sum(value * solved[name] for name, value in row_terms.items() if name not in free)
            matrix[i] = [row_terms.get(key, 0.0) * prior[key] / row.time_ns for key in free]
            target[i] = (row.time_ns - fixed) / row.time_ns
        for j, key in enumerate(free):  # the weak pull towards the base value
            matrix[len(rows) + j, j] = PRIOR_WEIGHT
            target[len(rows) + j] = PRIOR_WEIGHT * params[key] / prior[key]
        ratios, *_ = np.linalg.lstsq(matrix, target, rcond=None)
        values = {key: prior[key] * float(ratio) for key, ratio in zip(free, ratios, strict=True)}
        outside = {key for key, value in values.items() if not bounds[key][0] <= value <= bounds[key][1]}
        for key, value in values.items():
            solved[key] = min(max(value, bounds[key][0]), bounds[key][1])
        if not outside:
            break
        free = [key for key in free if key not in outside]
    return solved
