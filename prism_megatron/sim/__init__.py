"""Discrete-event simulation of an execution graph over a network model (core loop in C++).

from prism_megatron.sim import AlphaBetaCost, WhatIf, simulate, replay_schedules
result = simulate(graph, world, cost_fn)                 # one node per role: any W costs the same
result = simulate(graph, world, cost_fn, WhatIf(stragglers={17: 1.5}))   # every rank
result.iteration_time_ns; result.timeline(virtual_rank)
schedules = replay_schedules(result, real_ranks)         # what the replay engine loads
"""

from prism_megatron.sim.breakdown import RoleBreakdown, breakdown, rank_breakdown
from prism_megatron.sim.cost import AlphaBetaCost, CostFn, NetworkCost
from prism_megatron.sim.engine import OpTiming, SimResult, reference_core, simulate
from prism_megatron.sim.faults import DeadlockError, SimulationFault
from prism_megatron.sim.schedule import replay_schedules
from prism_megatron.sim.synthetic import PipelineSpec, layout_pipeline_graph, pipeline_graph
from prism_megatron.sim.whatif import WhatIf, parse_rank_factors

__all__ = [
    "AlphaBetaCost",
    "CostFn",
    "DeadlockError",
    "NetworkCost",
    "OpTiming",
    "PipelineSpec",
    "RoleBreakdown",
    "SimResult",
    "SimulationFault",
    "WhatIf",
    "breakdown",
    "layout_pipeline_graph",
    "parse_rank_factors",
    "pipeline_graph",
    "rank_breakdown",
    "reference_core",
    "replay_schedules",
    "simulate",
]
