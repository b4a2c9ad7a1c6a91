"""The emulated rank's replay schedule, static or closed-loop, as the emulation pass keeps it.

The emulation pass of the project (`prism_megatron.emulation.rank.EmulatePhase`) does not load one
schedule for the whole run: after each iteration past warm-up it folds the compute spans the real
rank measured into its role's durations, re-simulates and loads the schedule that follows
(`prism_megatron.emulation.closed_loop`). The suite runs its emulated ranks the same way, with the
same `ClosedLoop`, over its own graph and calibrated costs; `static` keeps the first schedule
throughout (to compare the two).
"""

from __future__ import annotations

import dataclasses
from typing import Any

NUM_WARMUP = 1
"""Iterations not folded (as the emulation pass: first-touch and allocation effects)."""


@dataclasses.dataclass
class ReplayInputs:
    """What an emulated rank needs to keep its schedule: the simulation's inputs."""

    graph: Any
    layout_kwargs: dict
    cost_fn: Any
    stragglers: dict[int, float]
    real_ranks: tuple[int, ...]
    static: bool = False


class Replay:
    """Loads this rank's schedule, and after each iteration folds what it measured (unless static)."""

    def __init__(self, inputs: ReplayInputs, virtual_rank: int) -> None:
        import prism_megatron.replay as replay
        from prism_megatron.emulation.closed_loop import ClosedLoop
        from prism_megatron.graph import LayoutWorld
        from prism_megatron.graph.capture import GroupNames
        from prism_megatron.sim import WhatIf
        from prism_megatron.topology import Layout

        world = LayoutWorld(Layout(**inputs.layout_kwargs))
        self.static = inputs.static
        self.names = GroupNames(world, virtual_rank)
        what_if = WhatIf(stragglers=inputs.stragglers) if inputs.stragglers else None
        self.virtual_rank = virtual_rank
        self.loop = ClosedLoop.start(
            inputs.graph, world, inputs.cost_fn, virtual_rank=virtual_rank, real_ranks=inputs.real_ranks,
            what_if=what_if,
        )  # fmt: skip
        self.loaded = self.loop.schedule()
        self.num_folded = 0
        self.not_folded: dict[int, str] = {}
        replay.set_mode("replay")
        replay.load_schedule(self.loaded)

    def after_iteration(self, number: int, start_ns: int, end_ns: int, events, calls) -> None:
        """Fold iteration `number` (its events and pipeline calls) and load the next schedule."""
        import prism_megatron.replay as replay
        from prism_megatron.emulation.closed_loop import blocked_waits
        from prism_megatron.graph.capture import CapturedIteration, iteration_streams

        if self.static or number < NUM_WARMUP:
            return
        iteration = CapturedIteration(start_ns, end_ns, tuple(events), tuple(calls))
        posted: dict = {}
        streams = iteration_streams(iteration, self.names, posted=posted)
        keep = blocked_waits(iteration, streams, posted, self.loaded)
        reason = self.loop.fold(streams, keep)
        if reason is not None:
            self.not_folded[number] = reason
            return
        self.num_folded += 1
        self.loaded = self.loop.schedule()
        replay.load_schedule(self.loaded)

    def summary(self) -> dict:
        return {
            "closed_loop": not self.static,
            "num_folded": self.num_folded,
            "not_folded": {str(k): v for k, v in self.not_folded.items()},
            "final_simulated_ms": self.loop.iteration_time_ns / 1e6,
            "final_rank_simulated_ms": self.loop.result.finish_ns(self.virtual_rank) / 1e6,
        }
