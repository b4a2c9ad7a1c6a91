"""Every number of the fidelity suite as a distribution, and what competed for the cores meanwhile.

A case's error is measured once per round (the emulated rank's median iteration time against the
real run's of the same round); `spread` summarises the rounds by their median, inter-quartile range
and worst round, which is what the results and the targets quote. `LoadSampler` counts, while a run
goes on, how many processes the machine had runnable (``procs_running`` of /proc/stat, the case's
own included), so a result says what it was measured against.
"""

from __future__ import annotations

import os
import statistics
import threading
from collections.abc import Sequence

SAMPLE_S = 0.1


def quartiles(values: Sequence[float]) -> tuple[float, float, float]:
    """(first quartile, median, third quartile), linear between order statistics."""
    if len(values) == 1:
        return values[0], values[0], values[0]
    q1, q2, q3 = statistics.quantiles(values, n=4, method="inclusive")
    return q1, q2, q3


def spread(values: Sequence[float]) -> dict[str, float]:
    """Median, quartiles, inter-quartile range, worst (largest magnitude), min and max of `values`."""
    if not values:
        raise ValueError("spread of no values")
    q1, median, q3 = quartiles(list(values))
    return {
        "n": len(values),
        "median": median,
        "q1": q1,
        "q3": q3,
        "iqr": q3 - q1,
        "worst": max(values, key=abs),
        "min": min(values),
        "max": max(values),
    }


def relative_iqr_pct(values: Sequence[float]) -> float:
    """The inter-quartile range as a percentage of the median."""
    q1, median, q3 = quartiles(list(values))
    return 100.0 * (q3 - q1) / median


def procs_running() -> int | None:
    """Processes runnable on the machine right now (None where /proc/stat is not there)."""
    try:
        with open("/proc/stat", encoding="ascii") as f:
            for line in f:
                if line.startswith("procs_running"):
                    return int(line.split()[1])
    except OSError:
        return None
    return None


class LoadSampler:
    """Samples `procs_running` every `SAMPLE_S` in a thread while the block runs."""

    def __init__(self) -> None:
        self.samples: list[int] = []
        self._stop = threading.Event()
        self._thread = threading.Thread(target=self._run, daemon=True)

    def _run(self) -> None:
        while not self._stop.wait(SAMPLE_S):
            value = procs_running()
            if value is not None:
                self.samples.append(value)

    def __enter__(self) -> LoadSampler:
        self.load_before = os.getloadavg()[0]
        self._thread.start()
        return self

    def __exit__(self, *exc) -> None:
        self._stop.set()
        self._thread.join()
        self.load_after = os.getloadavg()[0]

    def summary(self, own_processes: int) -> dict[str, float | int | None]:
        """What competed: the case's own processes, the machine's runnable count (median and max of
        the samples, the sampling thread itself not counted) and the 1-minute load average."""
        runnable = [max(sample - 1, 0) for sample in self.samples]
        return {
            "own_processes": own_processes,
            "runnable_median": statistics.median(runnable) if runnable else None,
            "runnable_max": max(runnable) if runnable else None,
            "load_1min_before": self.load_before,
            "load_1min_after": self.load_after,
        }
