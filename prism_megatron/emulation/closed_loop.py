"""The closed loop: the next iteration's replay schedule follows what the real rank just measured.

Each real rank simulates the job from the execution graph and loads its own replay schedule before
the first iteration. After every emulated iteration past warm-up it folds the compute spans it
measured into its role's durations (`Problem.with_compute_durations`; the median of the last few
iterations, so one noisy iteration does not steer the next), re-simulates (one node per role
unless a what-if makes ranks differ: milliseconds) and loads the new schedule. Its virtual peers of
the same role (its data-parallel peers, every rank that behaves like it) then run as it ran, and
every other role's virtual ranks react to that through the simulated dependencies.

A rank folds its own role only: it measures nothing of the other real ranks' roles, which keep
their captured durations in its simulation (they talk to it for real anyway).
"""

from __future__ import annotations

import collections
import dataclasses
import os
import statistics
from collections.abc import Mapping, Sequence

from prism_megatron.emulation import files
from prism_megatron.emulation.schedule_index import ScheduleIndex
from prism_megatron.graph import ExecutionGraph, LayoutWorld, Op, load_graph
from prism_megatron.graph.capture import RankCapture, build_graph, compute_durations, first_difference
from prism_megatron.graph.io import GRAPH_FILE
from prism_megatron.replay.schedule import ReplaySchedule
from prism_megatron.sim import NetworkCost, WhatIf
from prism_megatron.sim.engine import SimResult, run_problem
from prism_megatron.sim.problem import build_problem
from prism_megatron.topology import Layout

DEFAULT_WINDOW = 3


def layout_kwargs(layout: Layout) -> dict[str, object]:
    """The layout as the keyword arguments a graph's metadata stores."""
    names = ("world_size", "tp", "pp", "cp", "ep", "etp", "vpp", "order", "untie_embeddings")
    return {name: getattr(layout, name) for name in names}


def network_cost(cluster: str) -> NetworkCost:
    """The cost of every communication op on the cluster (a preset name or a spec file)."""
    from prism_megatron.network import CostModel, load_cluster

    return NetworkCost(CostModel(load_cluster(cluster)))


def load_or_build_graph(
    path: str, layout: Layout, *, extra: Mapping[str, object] | None = None
) -> ExecutionGraph:
    """The graph in `path`: a graph directory, or a folder of capture files (built here).

    Raises:
        ValueError: nothing usable there, or a graph of another job (its layout differs).
    """
    if os.path.isfile(os.path.join(path, GRAPH_FILE)) or path.endswith(".json"):
        graph = load_graph(path)
        if dict(graph.metadata.layout) != layout_kwargs(layout):
            raise ValueError(
                f"--prism-graph {path} describes the job {dict(graph.metadata.layout)}, not this one "
                f"{layout_kwargs(layout)}; capture again or pass the matching flags"
            )
        return graph
    captures = [RankCapture.load(p) for p in files.capture_paths(path)]
    if not captures:
        raise ValueError(f"--prism-graph {path}: neither {GRAPH_FILE} nor capture-*.json files are there")
    return build_graph(captures, LayoutWorld(layout), layout_kwargs(layout), extra=extra)


@dataclasses.dataclass
class ClosedLoop:
    """One real rank's simulation of the job, re-run with what the rank measures.

    Build with `ClosedLoop.start(...)`; `schedule()` is what the replay engine loads next.
    """

    base: object
    """The `Problem` built from the graph (durations as captured)."""
    result: SimResult
    role: str
    virtual_rank: int
    real_ranks: tuple[int, ...]
    graph_streams: Mapping[str, Sequence[Op]]
    measured: collections.deque
    index: ScheduleIndex
    num_folded: int = 0

    @classmethod
    def start(
        cls,
        graph: ExecutionGraph,
        world: LayoutWorld,
        cost_fn,
        *,
        virtual_rank: int,
        real_ranks: Sequence[int],
        what_if: WhatIf | None = None,
        window: int = DEFAULT_WINDOW,
    ) -> ClosedLoop:
        base = build_problem(graph, world, cost_fn, what_if)
        role = world.roles()[int(world.role_ids()[virtual_rank])]
        result = run_problem(base)
        return cls(
            base=base,
            result=result,
            role=role,
            virtual_rank=virtual_rank,
            real_ranks=tuple(real_ranks),
            graph_streams=graph.roles[role].streams,
            measured=collections.deque(maxlen=window),
            index=ScheduleIndex(result, virtual_rank, tuple(real_ranks)),
        )

    def schedule(self) -> ReplaySchedule:
        return self.index.schedule(self.result)

    @property
    def iteration_time_ns(self) -> int:
        return self.result.iteration_time_ns

    def fold(self, streams: Mapping[str, Sequence[Op]]) -> str | None:
        """Fold one measured iteration (`graph.capture.iteration_streams`) and re-simulate.

        Returns None when folded, else why not (the iteration issued other ops than the graph).
        """
        difference = first_difference(self.graph_streams, streams)
        if difference is not None:
            return f"the iteration's ops differ from the graph's at {difference}"
        self.measured.append(compute_durations(streams))
        durations = [round(statistics.median(values)) for values in zip(*self.measured, strict=True)]
        problem = self.base.with_compute_durations({self.role: durations})
        self.result = run_problem(problem)
        self.num_folded += 1
        return None
