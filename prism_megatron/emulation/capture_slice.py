"""Which ranks the capture pass runs: one per class of roles that run the same program.

The classes come from the job (`topology.equivalence.role_classes` over the flags' `JobModel`);
each class's representative role is captured by its smallest rank. A pass runs `nproc` processes,
so the last pass may have places to spare: they capture a second member of the classes whose
members run in different orders (middle stages of a pipeline) and then of the largest (the member
whose schedule differs most from the representative's: the most distant warm-up), which confirms
the class op for op when the graph is built and pools its spans, at no extra pass. With
`--prism-capture-all-roles` every role is its own class, as before.

A class of interleaved middle stages is led by the stage with the fewest warm-up microbatches,
which holds the fewest activations; its member with the most (the first middle stage) is always
captured too, in a pass of its own where none is spare: the report's peak memory then has the
class's highest (a run on a modelled GPU is how a user finds which stage runs out of memory), and
the derived order is confirmed op for op on every such run.
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence

from prism_megatron.megatron.job.program import job_model
from prism_megatron.topology import Layout, RoleClass, role_classes


def _confirmer(role_class: RoleClass) -> str:
    """The member that checks the class hardest: the warm-up furthest from the representative's
    (under 1F1B the fewest, under the interleaved schedule the most), else the second."""
    others = role_class.members[1:]
    if role_class.warmup is None:
        return others[0]
    own = role_class.warmup[role_class.representative]
    return min(
        others, key=lambda member: (-abs(role_class.warmup[member] - own), role_class.members.index(member))
    )


def capture_ranks(layout: Layout, classes: Sequence[RoleClass], nproc: int) -> tuple[int, ...]:
    """The representatives' ranks, ascending, then confirming members in the last pass's spare places."""
    by_name = {role.name: role for role in layout.roles()}
    ranks = sorted(layout.representative(by_name[c.representative]) for c in classes)
    ranks += sorted(layout.representative(by_name[_confirmer(c)]) for c in classes if c.chunks is not None)
    spare = -len(ranks) % nproc
    # Derived orders first (the graph reorders their steps: the most to confirm), then the largest.
    shared = sorted(
        (c for c in classes if len(c.members) > 1 and c.chunks is None),
        key=lambda c: (c.warmup is None, -len(c.members)),
    )
    extra = [layout.representative(by_name[_confirmer(c)]) for c in shared[:spare]]
    return tuple(ranks) + tuple(extra)


def with_slice(plan, argv: Sequence[str]):
    """The plan with its role classes and the capture's ranks (`RunPlan.role_classes`, `slice_ranks`);
    `argv`: the flag list the plan's job came from (for the flags `job_model` cannot model)."""
    model = job_model(plan.job, argv)
    classes = role_classes(plan.layout, model, capture_all=plan.config.capture.capture_all_roles)
    return dataclasses.replace(
        plan, role_classes=classes, slice_ranks=capture_ranks(plan.layout, classes, plan.nproc)
    )
