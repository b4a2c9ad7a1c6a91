"""Every patch prism can apply, in one table (`--prism-list-patches`, the README, the drift tests).

Records bound to a live run (the virtual world, the group log) are built here against a placeholder
world: the table and the drift tests need their targets and reasons, not a run.
"""

from __future__ import annotations

from prism_megatron.megatron.run.world import VirtualWorld
from prism_megatron.patches import control_flow, cpu_shim, parallel_state, pipeline, registry, versions


def all_patches() -> tuple[registry.AnyPatch, ...]:
    """Records in the order a CPU emulation applies them (Megatron-LM's last: only its script uses them)."""
    from prism_megatron.patches import training

    placeholder = VirtualWorld(
        world_size=1, virtual_rank=0, real_ranks=(0,), physical_rank=0, backend="prism"
    )
    return (
        *cpu_shim.MEGATRON_CORE_SHIMS,
        parallel_state.create_group_patch(virtual_backend="prism", log=parallel_state.GroupLog()),
        pipeline.p2p_patch(placeholder),
        *control_flow.core_fixes(placeholder),
        *training.all_records(),
    )


def table() -> str:
    """Every patch record, then the layer-spec substitutions of the built-in entry."""
    from prism_megatron.megatron.entry import parallel_spec

    return registry.table((*all_patches(), *parallel_spec.SUBSTITUTIONS))


def check_installed(*, allow_untested: bool) -> None:
    """Refuse an installed megatron-core that no variant was verified on (one line, `ValueError`),
    before any process starts; with `allow_untested`, warn instead."""
    versions.select(all_patches(), allow_untested=allow_untested)
