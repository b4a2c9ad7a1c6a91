"""Activation: make this process virtual rank r of a W-rank world whose backend is ``prism``.

Nothing here runs at import. :func:`activate` registers the backend with torch.distributed,
configures the C++ side, and initialises the default process group; :func:`deactivate` undoes all of
it in reverse order and is safe to call twice.
"""

from __future__ import annotations

import atexit
import dataclasses
import datetime
import os
import sys
from collections.abc import Hashable, Sequence

import torch
import torch.distributed as dist

from prism_megatron import replay
from prism_megatron.backend.real_groups import DEVICES, RealSubgroups, store_from_env
from prism_megatron.replay import timeline
from prism_megatron.replay.cost import CostLines, CostModel

BACKEND_NAME = "prism"
DATA_POLICIES = ("mirror",)
_BARRIER_ENV = "TORCH_DIST_INIT_BARRIER"

_active: Activation | None = None


@dataclasses.dataclass(eq=False)
class Activation:
    """This process's place in the emulated world, from :func:`activate` to :meth:`deactivate`."""

    world_size: int
    virtual_rank: int
    real_ranks: tuple[int, ...]
    physical_rank: int
    device: str
    mode: str
    data_policy: str
    timeout_s: float
    check_consistency: bool
    _subgroups: RealSubgroups = dataclasses.field(repr=False)
    _cost_model: CostModel | None = dataclasses.field(repr=False)
    _saved_barrier_env: str | None = dataclasses.field(repr=False)
    _saved_excepthook: object = dataclasses.field(repr=False)
    _excepthook: object = dataclasses.field(repr=False)

    @property
    def num_real_subgroups(self) -> int:
        """How many real sub-communicators the groups created so far needed."""
        return self._subgroups.num_created

    def deactivate(self) -> None:
        """Destroy the process groups and undo the activation (safe twice)."""
        if _active is self:
            deactivate()

    def __enter__(self) -> Activation:
        return self

    def __exit__(self, *exc_info) -> None:
        self.deactivate()


def is_active() -> bool:
    return _active is not None


def active() -> Activation | None:
    """The current activation, if any."""
    return _active


def _check_arguments(
    world_size, virtual_rank, real_ranks, physical_rank, device, mode, data_policy, timeout_s
):
    if world_size < 1:
        raise ValueError(f"world_size must be >= 1, got {world_size}")
    if not real_ranks:
        raise ValueError("real_ranks must name at least this process's virtual rank")
    if len(set(real_ranks)) != len(real_ranks):
        raise ValueError(f"real_ranks must not repeat a rank, got {list(real_ranks)}")
    bad = [r for r in real_ranks if not 0 <= r < world_size]
    if bad:
        raise ValueError(f"real_ranks {bad} lie outside the world [0, {world_size})")
    if virtual_rank not in real_ranks:
        raise ValueError(f"virtual_rank {virtual_rank} must be one of real_ranks {list(real_ranks)}")
    if not 0 <= physical_rank < len(real_ranks):
        raise ValueError(f"physical_rank must lie in [0, {len(real_ranks)}), got {physical_rank}")
    if device not in DEVICES:
        raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
    if device == "cuda" and not (torch.cuda.is_available() and dist.is_nccl_available()):
        raise ValueError(
            "device='cuda' needs a CUDA build of torch with NCCL and a visible GPU; use device='cpu'"
        )
    if mode not in replay.MODES:
        raise ValueError(f"mode must be one of {replay.MODES}, got {mode!r}")
    if data_policy not in DATA_POLICIES:
        raise ValueError(f"data_policy must be one of {DATA_POLICIES}, got {data_policy!r}")
    if not timeout_s > 0:
        raise ValueError(f"timeout_s must be > 0, got {timeout_s}")


def _role_ids(roles: Sequence[Hashable] | None, world_size: int) -> list[int]:
    if roles is None:
        return []
    if len(roles) != world_size:
        raise ValueError(f"roles must give one role per virtual rank ({world_size}), got {len(roles)}")
    ids: dict[Hashable, int] = {}
    return [ids.setdefault(role, len(ids)) for role in roles]


def _register_backend() -> None:
    dist.Backend.register_backend(BACKEND_NAME, _create_backend, extended_api=True, devices=["cpu", "cuda"])


def _unregister_backend() -> None:
    """Remove what register_backend added (torch 2.13 keeps it in these Backend class tables)."""
    key = BACKEND_NAME.upper()
    getattr(dist.Backend, "_plugins", {}).pop(key, None)
    dist.Backend.backend_capability.pop(BACKEND_NAME, None)
    dist.Backend.backend_type_map.pop(BACKEND_NAME, None)
    if BACKEND_NAME in dist.Backend.backend_list:
        dist.Backend.backend_list.remove(BACKEND_NAME)
    if hasattr(dist.Backend, key):
        delattr(dist.Backend, key)


def _create_backend(common_opts, backend_options):
    """torch's creator hook: called once per group that contains this process."""
    from prism_megatron import _C

    activation = _active
    if activation is None:
        raise RuntimeError("the prism backend is not active: call prism_megatron.backend.activate() first")
    members = list(common_opts.global_ranks_in_group)
    if members:
        member_set = set(members)
        real_members = tuple(r for r in activation.real_ranks if r in member_set)
    else:  # the default group: every rank
        members = list(range(common_opts.group_size))
        real_members = activation.real_ranks
    real = activation._subgroups.create(real_members) if len(real_members) >= 2 else None
    if activation._cost_model is not None and len(real_members) < len(members):
        for kind in replay.OpKind:
            replay.set_group_cost(members, kind, activation._cost_model.cost_lines(kind, members))
    return _C.backend.create_backend(
        common_opts.group_rank, common_opts.group_size, members, str(common_opts.group_id), real
    )


def _install_excepthook() -> tuple[object, object]:
    """Dump the flight recorder when the process dies of an uncaught exception; (previous, ours)."""
    previous = sys.excepthook

    def dump_then_report(exc_type, exc, tb):
        sys.stderr.write(
            "prism: uncaught exception; flight recorder follows\n" + replay.flight_recorder_dump()
        )
        previous(exc_type, exc, tb)

    sys.excepthook = dump_then_report
    return previous, dump_then_report


def activate(
    *,
    world_size: int,
    virtual_rank: int,
    real_ranks: Sequence[int],
    physical_rank: int | None = None,
    real_store: dist.Store | None = None,
    device: str = "cpu",
    mode: str = "instant",
    data_policy: str = "mirror",
    timeout_s: float = 300.0,
    default_cost: CostLines | None = None,
    check_consistency: bool = True,
    roles: Sequence[Hashable] | None = None,
    cost_model: CostModel | None = None,
    poll_real_waits: bool = False,
) -> Activation:
    """Make this process virtual rank ``virtual_rank`` of a ``world_size``-rank job on ``prism``.

    Args:
        world_size: W, the target job's world size.
        virtual_rank: the rank this process plays; one of ``real_ranks``.
        real_ranks: every virtual rank that some real process plays (the same list everywhere).
        physical_rank: this process's index among the real processes; default its position in
            ``sorted(real_ranks)``.
        real_store: rendezvous store of the real processes; None builds one from MASTER_ADDR /
            MASTER_PORT (a HashStore when this is the only real process).
        device: "cpu" (real parts on gloo) or "cuda" (NCCL).
        mode: "instant" (virtual peers arrive at once) or "replay" (as the loaded schedule says).
        data_policy: what virtual members contribute; "mirror" (see the package docstring).
        timeout_s: a wait longer than this raises with the flight recorder's dump.
        default_cost: cost lines for groups without their own (None: zero cost).
        check_consistency: compare (op, bytes, dtype, seq) among a group's real members before each
            collective, so a mismatch raises instead of hanging or corrupting data.
        roles: one hashable role per virtual rank (Megatron's role of each rank); lets a virtual
            member's data come from a real member of the same role.
        cost_model: an object with ``cost_lines(kind, members)`` (the network model); consulted for
            each group with virtual members as it is created.
        poll_real_waits: wait for the real parts of ops (gloo among real members) by polling with
            sched_yield instead of blocking: a peer's completion is seen sooner (two pinned processes,
            a 4-byte all-reduce: p50 0.9 -> 0.4 ms); and where the program waits for a virtual peer's
            time, yield and spin instead of sleeping (`replay.wait_until_ns`): on a virtual machine
            the computation after a sleep runs slower (one real rank of the demo's job: its compute a
            median 1.41x its capture's with sleeping waits, 1.09x without;
            `benchmarks/fidelity/emulated_compute.py`). Only for a process with cores of its own:
            where processes share cores it takes the others' CPU.

    Raises:
        ValueError: on a bad argument, when torch.distributed is already initialised, or when
            TORCH_DISTRIBUTED_DEBUG=DETAIL would wrap every group in a checker that needs W ranks.
    """
    global _active
    real_sorted = tuple(sorted(int(r) for r in real_ranks))
    if physical_rank is None and virtual_rank in real_sorted:
        physical_rank = real_sorted.index(virtual_rank)
    _check_arguments(
        world_size, virtual_rank, list(real_ranks), physical_rank, device, mode, data_policy, timeout_s
    )
    if _active is not None:
        raise ValueError("prism is already active in this process: deactivate() first")
    if dist.is_initialized():
        raise ValueError(
            "torch.distributed is already initialised: destroy its process group before activate()"
        )
    if dist.get_debug_level() == dist.DebugLevel.DETAIL:
        raise ValueError(
            "TORCH_DISTRIBUTED_DEBUG=DETAIL wraps every group in a gloo checker that needs all W ranks; "
            "unset it (prism checks consistency among real ranks itself: check_consistency=True)"
        )
    role_ids = _role_ids(roles, world_size)
    store = (
        real_store
        if real_store is not None
        else store_from_env(physical_rank=physical_rank, num_real=len(real_sorted), timeout_s=timeout_s)
    )

    from prism_megatron import _C

    _close_release_gate_at_exit(_C)
    replay.reset()  # a fresh engine and op log: sequence numbers count from this activation
    _C.backend.clear_device_failure()  # a device run that failed before does not fail this one
    _C.backend.set_consistency_deferred(False)  # checked before every real op until a pass defers
    _C.backend.set_poll_real_waits(bool(poll_real_waits))
    timeline.use_cuda(device == "cuda")
    timeline.set_timeout_s(timeout_s)
    _C.backend.configure(
        world_size,
        virtual_rank,
        physical_rank,
        list(real_sorted),
        role_ids,
        float(timeout_s),
        check_consistency,
    )
    replay.set_mode(mode)
    replay.set_default_cost(default_cost or ())
    _C.clock.lower_timer_slack()
    saved_env = os.environ.get(_BARRIER_ENV)
    os.environ[_BARRIER_ENV] = "0"  # a store barrier over W ranks would wait forever
    saved_hook, hook = _install_excepthook()
    _active = Activation(
        world_size=world_size,
        virtual_rank=virtual_rank,
        real_ranks=real_sorted,
        physical_rank=physical_rank,
        device=device,
        mode=mode,
        data_policy=data_policy,
        timeout_s=float(timeout_s),
        check_consistency=check_consistency,
        _subgroups=RealSubgroups(store=store, virtual_rank=virtual_rank, device=device, timeout_s=timeout_s),
        _cost_model=cost_model,
        _saved_barrier_env=saved_env,
        _saved_excepthook=saved_hook,
        _excepthook=hook,
    )
    try:
        _register_backend()
        dist.init_process_group(
            backend=BACKEND_NAME,
            store=dist.HashStore(),  # torch's own keys stay process-local; real parts use `store`
            rank=virtual_rank,
            world_size=world_size,
            timeout=datetime.timedelta(seconds=timeout_s),
        )
    except BaseException:
        deactivate()
        raise
    return _active


def deactivate() -> None:
    """Destroy every process group, unregister ``prism`` and reset the engine (safe twice)."""
    global _active
    activation = _active
    if activation is None:
        return
    from prism_megatron import _C

    try:
        if dist.is_initialized():
            dist.destroy_process_group()
    finally:
        _active = None
        activation._subgroups.shutdown()
        _unregister_backend()
        _C.backend.clear()
        timeline.use_cuda(False)
        replay.reset(keep_log=True)  # the flight recorder stays readable after a failure
        if activation._saved_barrier_env is None:
            os.environ.pop(_BARRIER_ENV, None)
        else:
            os.environ[_BARRIER_ENV] = activation._saved_barrier_env
        if sys.excepthook is activation._excepthook:
            sys.excepthook = activation._saved_excepthook


_exit_gate_registered = False


def _close_release_gate_at_exit(_C) -> None:
    """Once per process: before the interpreter finalizes, the backend's own threads stop freeing
    tensors (a free that needs the GIL then would abort the exiting process: csrc/backend/exit_guard.h)."""
    global _exit_gate_registered
    if not _exit_gate_registered:
        atexit.register(_C.backend.close_release_gate)
        _exit_gate_registered = True
