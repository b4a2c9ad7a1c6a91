"""The target job as plain data, and what follows from its shape alone.

`TargetJob` (parallel sizes, schedule, batch, `ModelShape`) is made in one place, from Megatron's
flags by `prism_megatron.megatron.job.target.derive`; every other package reads it from here: the
run plan, the report, the model FLOPs, the memory plan. Pure: imports neither torch nor Megatron, so
it sits on a low floor and the report can use it.
"""

from prism_megatron.target.job import (
    ORDER_DEFAULT,
    ORDER_TP_PP_DP,
    ModelShape,
    ParallelSizes,
    Schedule,
    TargetJob,
    layout_of,
    padded_vocab_size,
)

__all__ = [
    "ORDER_DEFAULT",
    "ORDER_TP_PP_DP",
    "ModelShape",
    "ParallelSizes",
    "Schedule",
    "TargetJob",
    "layout_of",
    "padded_vocab_size",
]
