"""Compute slowed by the communication kernels it overlaps, on a GPU whose spans were taken alone.

On a GPU a collective or transfer is a kernel too: NCCL runs one CTA per channel on the SMs and moves
its data through HBM, so a compute kernel that overlaps it gets fewer SMs and less bandwidth than it
had alone. A modelled GPU (`--prism-device model:<gpu>`) times every compute op as if it ran alone,
and the simulation overlaps a data-parallel reduce-scatter or all-gather with backward or forward
compute for free; this term charges that overlap. A measured span (a real GPU's, the CPU's) already
holds whatever its device shared, so the term is for modelled graphs only (`compute_slowdown_of`).

The term follows the simulated schedule, like the concurrency term (`sim.concurrency`):

* a node is communicating from each communication op's *start* to its end. The start, not the ready
  time: an NCCL kernel is launched where its stream reaches it and holds its SMs from then on, while
  it spins for peers that have not arrived, until it ends.
* the overlap of a compute op: the ns of its simulated span during which its own node has a
  communication op in flight (any stream; several at once count once).
* its duration: beside a kernel its device work runs at 1 / (1 + s) of its speed alone, `s` being
  the GPU model's measured compute slowdown under overlap (`compute_slowdown_of`); so it grows by
  s / (1 + s) x the overlap: by s x the fraction of its work done beside communication, and by the
  measured s when communication covers it whole. Per role op, the largest over the role's nodes (as
  the core takes an op's cost).

Stretching compute moves the schedule, so `engine.run_problem` repeats the run to a fixed point
with this term and the concurrency term together (after `concurrency.FREE_ROUNDS` durations only
grow). Integer and sorted arithmetic only: as deterministic as one run.
"""

from __future__ import annotations

from collections.abc import Mapping

import numpy as np

from prism_megatron.config import MODELLED_PREFIX
from prism_megatron.graph.schema import NodeType
from prism_megatron.sim.concurrency import flat_ops, merged_runs

DEVICE_KEY = "device"
"""Key of the capture's device (`--prism-device`, e.g. "model:h100") in a graph's `metadata.extra`;
absent in graphs written before it was recorded, which then get no contention term."""

SLOWDOWN_QUANTITY = "comm_overlap_compute_slowdown"
"""The GPU model's constant (`gpu_model/constants.py`, per GPU) this term charges."""


def compute_slowdown_of(device: str | None) -> float:
    """The fraction by which compute overlapped by communication slows on `device`: the GPU model's
    constant for a modelled GPU ("model:h100"), 0 for anything else (cpu, cuda, unknown: spans
    measured there already hold what the device shared).

    Raises:
        ValueError: a modelled GPU the GPU model has no such constant for.
    """
    if not device or not str(device).startswith(MODELLED_PREFIX):
        return 0.0
    from prism_megatron.gpu_model.constants import CONSTANTS  # no torch: the table alone

    gpu = str(device)[len(MODELLED_PREFIX) :].strip().lower()
    key = f"{gpu}.{SLOWDOWN_QUANTITY}"
    if key not in CONSTANTS:
        known = sorted({k.split(".")[0] for k in CONSTANTS})
        raise ValueError(f"device {device!r}: the GPU model knows no GPU {gpu!r} (valid: {', '.join(known)})")
    return float(CONSTANTS[key].value)


def graph_device(extra: Mapping[str, object]) -> str | None:
    """The device a graph was captured on (its `metadata.extra`), None when it does not say."""
    device = extra.get(DEVICE_KEY)
    return str(device) if device else None


def comm_op_mask(problem) -> np.ndarray:
    """Per op of the problem (flat, role by role): True for a communication kernel (collective,
    send, recv)."""
    op_type = problem.arrays["op_type"]
    return np.isin(op_type, [int(NodeType.COLLECTIVE), int(NodeType.SEND), int(NodeType.RECV)])


def covered_ns(begin_ns, end_ns, owner, span_ns: int):
    """A function (node, from, to) -> ns of [from, to) inside the union of that node's intervals
    [begin_ns, end_ns) (`owner`: each interval's node). `span_ns` exceeds every time, so shifting
    each node's times by node x span keeps the nodes apart on one axis."""
    run_begin, run_end = merged_runs(begin_ns, end_ns, owner, span_ns)
    before = np.concatenate([[0], np.cumsum(run_end - run_begin)])  # covered length of runs < k

    def up_to(x: np.ndarray) -> np.ndarray:
        """Covered length of (-inf, x) on the shifted axis."""
        k = np.searchsorted(run_begin, x, side="right")  # runs starting at or before x
        last_end = np.where(k > 0, run_end[np.maximum(k - 1, 0)], 0)
        return before[k] - np.maximum(last_end - x, 0)

    def between(node: np.ndarray, from_ns: np.ndarray, to_ns: np.ndarray) -> np.ndarray:
        return up_to(to_ns + node * span_ns) - up_to(from_ns + node * span_ns)

    return between


def overlaps(result) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """For every compute op of every simulated node with a span: (its timeline slot, its flat op
    index, the ns of its span during which its node has a communication op in flight)."""
    problem = result.problem
    node, flat = flat_ops(result)
    comm = comm_op_mask(problem)[flat]
    start, end = result.start_ns, result.end_ns
    keep = comm & (start >= 0) & (end > start)
    span_ns = int(max(end.max(initial=0), 0)) + 1
    between = covered_ns(start[keep], end[keep], node[keep], span_ns)
    compute = problem.arrays["op_type"][flat] == int(NodeType.COMPUTE)
    slots = np.flatnonzero(compute & (start >= 0) & (end > start))
    return slots, flat[slots], between(node[slots], start[slots], end[slots])


def contended_durations(result, base_duration_ns: np.ndarray, slowdown: float) -> np.ndarray:
    """Each op's duration under the overlap its simulated span saw: its duration alone plus
    slowdown / (1 + slowdown) x the ns it ran beside its node's communication (device work only:
    scaled by the device share of the duration), the largest over the role's nodes; ops that
    overlap nothing (and every non-compute op) keep `base_duration_ns`.

    Why slowdown / (1 + slowdown): beside a communication kernel the op's work runs at 1 / (1 + s)
    of its speed alone, so T ns beside it do T / (1 + s) of the work and cost T s / (1 + s) more;
    covered whole, the op takes its duration x (1 + s), the measured slowdown. At the fixed point
    this is the duration growing by s x the fraction of its *work* done beside the kernel.
    """
    durations = base_duration_ns.copy()
    if slowdown <= 0.0:
        return durations
    _, ops, covered = overlaps(result)
    overhead = np.minimum(result.problem.arrays["op_overhead_ns"], base_duration_ns)
    device_share = np.divide(
        base_duration_ns - overhead,
        base_duration_ns,
        out=np.zeros(len(base_duration_ns), dtype=np.float64),
        where=base_duration_ns > 0,
    )
    extra = np.zeros(len(base_duration_ns), dtype=np.float64)
    np.maximum.at(extra, ops, covered * device_share[ops] * (slowdown / (1.0 + slowdown)))
    touched = extra > 0
    durations[touched] = base_duration_ns[touched] + np.round(extra[touched]).astype(np.int64)
    return durations
