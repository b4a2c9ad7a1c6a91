"""Every patch prism can apply, in one table (`--prism-list-patches`, the README, the drift tests).

Records bound to a live run (the virtual world, the group log) are built here against a placeholder
world: the table and the drift tests need their targets and reasons, not a run.
"""

from __future__ import annotations

from prism_megatron.megatron import control_flow, p2p, parallel_state, patches, shims_cpu
from prism_megatron.megatron.distributed import VirtualWorld


def all_patches() -> tuple[patches.AnyPatch, ...]:
    """Records in the order a CPU emulation applies them (Megatron-LM's last: only its script uses them)."""
    from prism_megatron.megatron import megatron_lm

    placeholder = VirtualWorld(
        world_size=1, virtual_rank=0, real_ranks=(0,), physical_rank=0, backend="prism"
    )
    return (
        *shims_cpu.MEGATRON_CORE_SHIMS,
        parallel_state.create_group_patch(virtual_backend="prism", log=parallel_state.GroupLog()),
        p2p.p2p_patch(placeholder),
        *control_flow.core_fixes(placeholder),
        *megatron_lm.all_records(),
    )


def table() -> str:
    return patches.table(all_patches())
