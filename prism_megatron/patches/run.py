"""The run a patch is bound to, as the patches see it: a protocol, so that no patch imports the run.

The run (`prism_megatron.megatron.run.runtime.Runtime`) applies the patches, so it sits a floor above
them; a patch that imported it would import back up. A record that needs the run names it in its
`needs` (`run`, `training_record`), the run binds itself when it applies the record
(`registry.bind`), and the patch uses only what these protocols declare.
"""

from __future__ import annotations

from collections.abc import Mapping
from typing import Any, Protocol

from prism_megatron.config import PrismConfig
from prism_megatron.megatron.job.target import ParallelSizes
from prism_megatron.passes.world import VirtualWorld


class Run(Protocol):
    """One real process's run (`Runtime`): its settings, its world, and the lifecycle steps that
    Megatron-LM's own training code reaches through the hooks."""

    config: PrismConfig
    device: str
    """'cpu' or 'cuda'."""
    sizes: ParallelSizes | None
    """The target job's parallel sizes; the argument hook sets them from Megatron-LM's flags."""
    world: VirtualWorld | None
    """The virtual world once brought up (None without emulation)."""

    @property
    def virtual_rank(self) -> int: ...

    def real_ranks(self) -> tuple[int, ...]:
        """The virtual ranks real processes run."""
        ...

    def world_is_real(self, virtual_rank: int) -> bool: ...

    def check_process_count(self, real_ranks: tuple[int, ...]) -> None:
        """ValueError unless one process per real rank was launched."""
        ...

    def bring_up(self) -> None:
        """Initialise torch.distributed (the virtual world when emulating)."""
        ...

    def before_model(self) -> None:
        """After Megatron's `initialize_model_parallel`: the p2p communicator and control-flow fixes."""
        ...


class StepRecord(Protocol):
    """What the `train_step` hook reports each training step to (`TrainingRecord`)."""

    def before_step(self, model: list, optimizer: Any) -> None: ...

    def after_step(self, step: Mapping[str, Any]) -> Any:
        """`step` holds the step's `loss` and `grad_norm`."""
        ...
