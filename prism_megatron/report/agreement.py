"""Does the emulation agree with its own simulation? Like compared with like, per real rank.

Each emulated iteration ran one replay schedule: the simulation of the job from the spans measured
so far (the closed loop re-simulates between iterations). The simulated iteration time of that
schedule is what the iteration should have taken, had every real rank run as measured and the
network cost what the simulation says; the difference, per iteration, is the emulation's error
against itself. Its median and spread over the iterations after warm-up say whether the tool
agrees with itself. The closed loop's last schedule (the simulation from the last measurements)
is reported beside it, as its own line: it is the job's predicted time, not a comparison.

Comparing the median emulated iteration with one simulation from the last few iterations' spans
would mix two things: compute drifts within a run, so the last schedule need not be the schedule
of the median iteration.

The same holds within one iteration: the schedule was simulated with the spans measured before it,
and a real rank's compute drifts from one iteration to the next while its virtual peers keep to
the schedule. So each iteration is also compared with its schedule replayed with the compute the
real ranks measured in that very iteration, and with what they measured of the ops among them
where those ran through the host (`passes/replayed.py`; a gloo exchange between two processes takes
0.4 to 8 ms from one iteration to the next on a shared machine): that difference is the emulation's
own error (ops completing later than the schedule says, host work inside ops); the difference
between the two comparisons is the drift of the measured inputs. The simulated time is the rank's own
finish in the schedule's simulation, as the emulated time is the rank's own start to end.

A third comparison is the schedule's expected time: the schedule replayed with each iteration it
was simulated from (the last three), the median of those replays (`ClosedLoop.expected_ns`). The
schedule's simulation takes one of those iterations' spans per real rank; the moves of the spans
from one iteration to the next, which the emulation takes one-sidedly (below), are in the expected
time and not in the simulation. It uses nothing of the iteration it is compared with. It is the
emulation held to its own rule with the inputs it had, not a prediction of the target job (that is
the simulation, and the closed loop's last schedule). On the demo it has taken about half of the
difference to the simulation (`benchmarks/results/2026-12-07-demo-expected-*.md`).

The drift of the compute is also given directly: each real rank's compute in the iteration against
the compute its schedule was simulated with. Where a real rank exchanges with virtual peers it need
not cancel out over iterations: a rank that computes more than its schedule assumed reaches its
next exchange with a virtual peer late and the lateness carries on, while one that computes less
waits there for the peer, which keeps to the schedule, and the time it saved is lost. On the 2-core
machine this project is built on, whose cores run the same work up to 1.7x slower for seconds at a
time (`benchmarks/host/speed.py`), the demo's iterations ran over their simulations in most
iterations and agreed with their replays (`benchmarks/results/2026-12-07-demo.md`).
"""

from __future__ import annotations

import dataclasses
import statistics
from collections.abc import Mapping
from typing import Any


@dataclasses.dataclass(frozen=True, kw_only=True)
class RankAgreement:
    """One real rank's emulated iterations against the simulation of the schedule each ran."""

    virtual_rank: int
    iterations: tuple[int, ...]
    """The iterations compared (after warm-up), numbered from 0 as in `iterations`."""
    emulated_s: tuple[float, ...]
    simulated_s: tuple[float, ...]
    """The rank's simulated time in the schedule each iteration ran."""
    closed_loop_final_s: float | None = None
    """The simulation from the last measurements (the schedule a next iteration would run)."""
    expected_s: tuple[float, ...] | None = None
    """The schedule each iteration ran, replayed with each iteration it was simulated from (the
    median of those replays; `ClosedLoop.expected_ns`): what the iteration should take given how
    the real ranks' compute moved in those iterations. None as `replayed_s`."""
    replayed_s: tuple[float, ...] | None = None
    """The schedule each iteration ran, replayed with the real ranks' compute of that iteration;
    None when a compared iteration has none (a run before it was recorded, or one that diverged)."""
    schedule_compute_s: tuple[float, ...] | None = None
    """This rank's compute in each iteration as the schedule it ran assumed it; None as `replayed_s`."""
    measured_compute_s: tuple[float, ...] | None = None
    """This rank's compute as measured in each iteration (a span that ended in a wait the schedule
    decided counts as assumed); None with `schedule_compute_s`."""
    captured_compute_s: float | None = None
    """This rank's compute in the graph as captured (another pass, at another time): the sum of its
    spans, each the median of that span over the capture's recorded iterations."""

    @property
    def differences_pct(self) -> tuple[float, ...]:
        """Per iteration: (emulated - simulated) / simulated, in percent."""
        return _differences(self.emulated_s, self.simulated_s)

    @property
    def median_pct(self) -> float:
        return statistics.median(self.differences_pct)

    @property
    def spread_pct(self) -> tuple[float, float]:
        """The smallest and largest per-iteration difference."""
        return min(self.differences_pct), max(self.differences_pct)

    @property
    def expected_differences_pct(self) -> tuple[float, ...] | None:
        """Per iteration: (emulated - expected) / expected, in percent."""
        return None if self.expected_s is None else _differences(self.emulated_s, self.expected_s)

    @property
    def expected_median_pct(self) -> float | None:
        return _median(self.expected_differences_pct)

    @property
    def expected_spread_pct(self) -> tuple[float, float] | None:
        return _spread(self.expected_differences_pct)

    @property
    def replayed_differences_pct(self) -> tuple[float, ...] | None:
        """Per iteration: (emulated - replayed) / replayed, in percent."""
        return None if self.replayed_s is None else _differences(self.emulated_s, self.replayed_s)

    @property
    def replayed_median_pct(self) -> float | None:
        return _median(self.replayed_differences_pct)

    @property
    def replayed_spread_pct(self) -> tuple[float, float] | None:
        return _spread(self.replayed_differences_pct)

    @property
    def compute_drift_pct(self) -> tuple[float, ...] | None:
        """Per iteration: (measured compute - the schedule's) / the schedule's, in percent."""
        if self.schedule_compute_s is None or self.measured_compute_s is None:
            return None
        return _differences(self.measured_compute_s, self.schedule_compute_s)

    @property
    def compute_drift_median_pct(self) -> float | None:
        return _median(self.compute_drift_pct)

    @property
    def compute_drift_spread_pct(self) -> tuple[float, float] | None:
        return _spread(self.compute_drift_pct)

    @property
    def compute_against_capture_pct(self) -> float | None:
        """The median of the measured compute over the compared iterations against the capture's, in
        percent. The capture's is a sum of per-span medians, which tends to lie below the median of
        sums, so part of a positive figure is that; the rest is how the compute moved between the
        two passes (one input of the emulated iteration: the costs of ops among real ranks are
        another)."""
        if self.measured_compute_s is None or not self.captured_compute_s:
            return None
        return (statistics.median(self.measured_compute_s) / self.captured_compute_s - 1) * 100

    @classmethod
    def from_phase(cls, virtual_rank: int, phase: Mapping[str, Any]) -> RankAgreement | None:
        """From a rank's `prism_phase` results (`EmulatePhase.summary`); None for a pass without
        simulated times, or without an iteration after warm-up."""
        emulated = phase.get("iteration_times_s") or []
        simulated = phase.get("simulated_iteration_times_s") or []
        replayed = phase.get("replayed_iteration_times_s") or []
        first = int(phase.get("num_warmup", 0))
        pairs = [
            (i, e, s)
            for i, (e, s) in enumerate(zip(emulated, simulated, strict=False))
            if i >= first and s > 0
        ]
        if not pairs:
            return None
        replays = [replayed[i] if i < len(replayed) else None for i, _, _ in pairs]
        expected = _at(phase.get("expected_iteration_times_s"), [i for i, _, _ in pairs])
        schedule, measured = _compute_pair(
            _at(phase.get("schedule_compute_s"), [i for i, _, _ in pairs]),
            _at(phase.get("measured_compute_s"), [i for i, _, _ in pairs]),
        )
        return cls(
            virtual_rank=virtual_rank,
            iterations=tuple(i for i, _, _ in pairs),
            emulated_s=tuple(float(e) for _, e, _ in pairs),
            simulated_s=tuple(float(s) for _, _, s in pairs),
            closed_loop_final_s=phase.get("closed_loop_final_s"),
            expected_s=expected if expected is not None and min(expected) > 0 else None,
            replayed_s=None if any(not r for r in replays) else tuple(float(r) for r in replays),
            schedule_compute_s=schedule,
            measured_compute_s=measured,
            captured_compute_s=phase.get("captured_compute_s"),
        )

    def to_json(self) -> dict[str, Any]:
        return {
            "iterations": list(self.iterations),
            "emulated_s": list(self.emulated_s),
            "simulated_s": list(self.simulated_s),
            "closed_loop_final_s": self.closed_loop_final_s,
            "median_difference_pct": self.median_pct,
            "min_difference_pct": self.spread_pct[0],
            "max_difference_pct": self.spread_pct[1],
            **_reference_json("expected", self.expected_s, self.expected_differences_pct),
            **_reference_json("replayed", self.replayed_s, self.replayed_differences_pct),
            **(
                {}
                if self.compute_drift_pct is None
                else {
                    "schedule_compute_s": list(self.schedule_compute_s),
                    "measured_compute_s": list(self.measured_compute_s),
                    "median_compute_drift_pct": self.compute_drift_median_pct,
                    "min_compute_drift_pct": self.compute_drift_spread_pct[0],
                    "max_compute_drift_pct": self.compute_drift_spread_pct[1],
                }
            ),
            **({} if self.captured_compute_s is None else {"captured_compute_s": self.captured_compute_s}),
        }

    @classmethod
    def from_json(cls, virtual_rank: int, entry: Mapping[str, Any]) -> RankAgreement:
        """One entry of report.json's `agreement` (the derived percentages are recomputed)."""
        schedule, measured = _compute_pair(
            _tuple(entry.get("schedule_compute_s")), _tuple(entry.get("measured_compute_s"))
        )
        return cls(
            virtual_rank=virtual_rank,
            iterations=tuple(entry["iterations"]),
            emulated_s=tuple(entry["emulated_s"]),
            simulated_s=tuple(entry["simulated_s"]),
            closed_loop_final_s=entry.get("closed_loop_final_s"),
            expected_s=_tuple(entry.get("expected_s")),
            replayed_s=_tuple(entry.get("replayed_s")),
            schedule_compute_s=schedule,
            measured_compute_s=measured,
            captured_compute_s=entry.get("captured_compute_s"),
        )


def _at(values: Any, positions: list[int]) -> tuple[float, ...] | None:
    """values[i] for each position; None when any is missing (an older run, an iteration that
    diverged from the graph)."""
    if not values or any(i >= len(values) or values[i] is None for i in positions):
        return None
    return tuple(float(values[i]) for i in positions)


def _compute_pair(
    schedule: tuple[float, ...] | None, measured: tuple[float, ...] | None
) -> tuple[tuple[float, ...] | None, tuple[float, ...] | None]:
    """Both, or neither: one without the other, lists of unequal length, or a schedule that assumed
    no compute (no percentage to give) give neither."""
    if (
        schedule is None
        or measured is None
        or len(schedule) != len(measured)
        or min(schedule, default=0) <= 0
    ):
        return None, None
    return schedule, measured


def _tuple(values: Any) -> tuple[float, ...] | None:
    return None if values is None else tuple(float(v) for v in values)


def _differences(emulated_s: tuple[float, ...], reference_s: tuple[float, ...]) -> tuple[float, ...]:
    return tuple((e - r) / r * 100 for e, r in zip(emulated_s, reference_s, strict=True))


def _reference_json(
    name: str, reference_s: tuple[float, ...] | None, differences: tuple[float, ...] | None
) -> dict[str, Any]:
    """report.json's entries of one optional reference (`<name>_s` and the median, smallest and
    largest difference against it); none without it."""
    if reference_s is None or differences is None:
        return {}
    low, high = _spread(differences)
    return {
        f"{name}_s": list(reference_s),
        f"median_{name}_difference_pct": _median(differences),
        f"min_{name}_difference_pct": low,
        f"max_{name}_difference_pct": high,
    }


def _median(values: tuple[float, ...] | None) -> float | None:
    return None if values is None else statistics.median(values)


def _spread(values: tuple[float, ...] | None) -> tuple[float, float] | None:
    """The smallest and largest of `values` (None without them)."""
    return None if values is None else (min(values), max(values))


def agreements(results: Mapping[int, Mapping[str, Any]]) -> tuple[RankAgreement, ...]:
    """Every real rank's agreement, from the ranks' results files, by virtual rank."""
    found = (
        RankAgreement.from_phase(v, data.get("prism_phase") or {}) for v, data in sorted(results.items())
    )
    return tuple(a for a in found if a is not None)


_COMPARED = {
    "simulated": lambda a: (a.median_pct, a.spread_pct),
    "expected": lambda a: (a.expected_median_pct, a.expected_spread_pct),
    "replayed": lambda a: (a.replayed_median_pct, a.replayed_spread_pct),
    "compute": lambda a: (a.compute_drift_median_pct, a.compute_drift_spread_pct),
}
COMPARISONS = tuple(_COMPARED)
"""What `describe` can set the emulated iterations against (and "compute", the rank's compute
against its schedule's)."""


def describe(agreement: RankAgreement, against: str = "simulated") -> str:
    """'+0.42 % (-1.10 .. +2.31 %, 5 iterations)': the median and the range of the per-iteration
    differences against the schedule's simulation ("simulated"), its expected time ("expected"), its
    replay with the iteration's own measurements ("replayed"), or the rank's measured compute against
    the schedule's ("compute"); '-' when there is none."""
    if against not in _COMPARED:
        raise ValueError(f"describe: against must be one of {COMPARISONS}, got {against!r}")
    median, spread = _COMPARED[against](agreement)
    if median is None or spread is None:
        return "-"
    low, high = spread
    return (
        f"{median:+.2f} % ({low:+.2f} .. {high:+.2f} %, "
        f"{len(agreement.iterations)} iteration{'s' if len(agreement.iterations) != 1 else ''})"
    )
