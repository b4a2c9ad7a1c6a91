"""A CPU rank's device: a fixed share of the machine, the same in every pass.

On a cluster each rank owns one GPU, whatever else runs on the node. A rank on the CPU device owns
whatever torch's intra-op pool and the scheduler give it, and that depends on the pass: the one
process of an emulation pass had both cores of a 2-core machine to itself while the two processes of
the all-real run shared them (a W = 2 PP2 tiny GPT: 1048 ms per iteration real, 588 ms emulated).
So each real process takes `EmulationConfig.resolved_cpu_threads` intra-op threads and, where it may
run on more cores than that, as many cores of its own, chosen by its local rank (the physical rank
on this machine), before any process group exists so that gloo's threads inherit the affinity.
`CpuShare.restore` gives back what the process had (tests run several passes in one process).
Where each local process gets cores no other one runs on (`CpuShare.own_cores`), its waits keep
the core: for real peers they poll instead of blocking, and where the program waits for a virtual
peer's time they yield and spin instead of sleeping (on a virtual machine the computation after a
sleep runs slower, so the emulated rank would compute slower than its capture did).

On a modelled GPU (`--prism-device model:<gpu>`) no process is pinned: its times are the GPU
model's, not the CPU's, so it has no share to keep fixed, and the capture passes that run at the same
time (each process alone, local rank 0) must not all be pinned to the same first core.
"""

from __future__ import annotations

import dataclasses
import os

import torch

from prism_megatron.config import EmulationConfig


@dataclasses.dataclass(frozen=True)
class CpuShare:
    """What one real process took: its intra-op threads and the cores it may run on."""

    threads: int
    cores: tuple[int, ...]
    """The cores it may run on afterwards (all it was allowed when it was not pinned)."""
    pinned: bool
    own_cores: bool = False
    """Pinned, and no other process of this machine's job (LOCAL_WORLD_SIZE) runs on its cores: it
    may wait for its peers without giving its core up (`prism_megatron.backend.activate`)."""
    previous_threads: int = 0
    previous_cores: tuple[int, ...] = ()

    def as_dict(self) -> dict[str, object]:
        return {
            "threads": self.threads,
            "cores": list(self.cores),
            "pinned": self.pinned,
            "own_cores": self.own_cores,
        }

    def restore(self) -> None:
        """The threads and cores the process had before `take` (safe to call twice)."""
        torch.set_num_threads(self.previous_threads)
        if self.pinned:
            os.sched_setaffinity(0, set(self.previous_cores))


def cores_for(allowed: list[int], local_rank: int, threads: int) -> tuple[int, ...] | None:
    """The `threads` cores of local rank `local_rank` among `allowed` (wrapping round when more ranks
    than cores), or None when the process may not use more cores than its threads anyway."""
    allowed = sorted(allowed)
    if len(allowed) <= threads:
        return None
    return tuple(sorted({allowed[(local_rank * threads + k) % len(allowed)] for k in range(threads)}))


def take(emulation: EmulationConfig, environ: dict[str, str] | None = None) -> CpuShare:
    """Set this process's intra-op threads and core affinity (see the module docstring)."""
    environ = os.environ if environ is None else environ
    allowed = sorted(os.sched_getaffinity(0)) if hasattr(os, "sched_getaffinity") else []
    threads = emulation.resolved_cpu_threads(len(allowed) or os.cpu_count() or 1)
    previous_threads = torch.get_num_threads()
    torch.set_num_threads(threads)
    pin = bool(allowed) and emulation.modelled_gpu is None
    cores = cores_for(allowed, int(environ.get("LOCAL_RANK", "0")), threads) if pin else None
    if cores is not None:
        os.sched_setaffinity(0, set(cores))
    local_processes = int(environ.get("LOCAL_WORLD_SIZE", "0") or 0)
    return CpuShare(
        threads=threads,
        cores=cores if cores is not None else tuple(allowed),
        pinned=cores is not None,
        own_cores=cores is not None and 0 < local_processes * threads <= len(allowed),
        previous_threads=previous_threads,
        previous_cores=tuple(allowed),
    )
