"""How much of a change between two runs their captures alone explain, when each emulated its own graph.

A run's virtual peers replay the execution graph it captured, and the simulated iteration time is
that graph simulated over the network model, with no real rank in it. Two runs of one job that each
captured their graph (on a machine whose load differed between them, say) carry two different
captures: the difference of their simulated iteration times is what the captures alone would change,
and its share of the measured change says how much of that change is theirs rather than the real
ranks'. The verdict is not changed by it; the output says it beside the verdict.
"""

from __future__ import annotations

import dataclasses

from prism_megatron.compare.metrics import RunMetrics

_NEGLIGIBLE = 1e-3
"""A measured change below this fraction of the iteration is "did not move" (no share is computed)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class CaptureShare:
    measured_change_s: float
    """B - A of the measured iteration time."""
    simulated_change_s: float
    """B - A of the simulated iteration time (each run's own graph)."""
    iteration_a_s: float
    share_pct: float | None
    """simulated_change / measured_change in %; None when the measured time did not move."""

    def sentence(self) -> str:
        sim_ms, sim_pct = self.simulated_change_s * 1e3, 100 * self.simulated_change_s / self.iteration_a_s
        measured_ms = self.measured_change_s * 1e3
        measured_pct = 100 * self.measured_change_s / self.iteration_a_s
        head = (
            "The runs emulated different execution graphs (each captured its own): simulated from its own "
            f"graph alone, B's iteration differs from A's by {sim_ms:+.3f} ms ({sim_pct:+.2f} % of A's "
            "iteration time)"
        )
        if self.share_pct is None:
            return f"{head}; the measured iteration time did not move ({measured_ms:+.3f} ms)."
        return (
            f"{head}; the measured iteration time moved {measured_ms:+.3f} ms ({measured_pct:+.2f} %), so "
            f"the captures alone explain {self.share_pct:.0f} % of the change."
        )


def capture_share(run_a: RunMetrics, run_b: RunMetrics) -> CaptureShare | None:
    """None unless both runs kept their graph, the graphs differ and both have both iteration times."""
    if not run_a.graph_sha256 or not run_b.graph_sha256 or run_a.graph_sha256 == run_b.graph_sha256:
        return None
    metrics = [run.metrics.get(key) for run in (run_a, run_b) for key in ("iteration", "simulated")]
    if any(m is None for m in metrics) or not metrics[0].value:
        return None
    iteration_a, simulated_a, iteration_b, simulated_b = (m.value for m in metrics)
    measured = iteration_b - iteration_a
    simulated = simulated_b - simulated_a
    moved = abs(measured) >= _NEGLIGIBLE * iteration_a
    return CaptureShare(
        measured_change_s=measured,
        simulated_change_s=simulated,
        iteration_a_s=iteration_a,
        share_pct=100 * simulated / measured if moved else None,
    )
