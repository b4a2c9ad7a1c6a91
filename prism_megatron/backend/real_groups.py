"""Real sub-communicators: the part of a prism group that runs among real processes.

A prism group with two or more real members needs a real communicator among them, built on a store
the real processes share:

* CPU tensors: gloo.
* CUDA tensors, the group's real members on distinct GPUs: NCCL.
* CUDA tensors, two or more of the group's real members on one GPU (several real ranks sharing a
  device: memory ground truth, small tests): gloo on the CUDA tensors. NCCL refuses a communicator
  with a duplicate device. gloo stages the data through the host; the backend issues its part in
  program order and a helper thread waits for it, while the backend's stream waits on a host flag
  (`csrc/backend/device_path.cpp`), so the program's thread still never blocks where NCCL would not.
  Each process publishes its device (host name and GPU UUID) in the store at activation; a group
  compares its members' before choosing. Only real members of a group create it
(torch calls the backend's creator only in member processes), and every real member of a group is a
member process, so they all create it, in the same order as Megatron creates groups everywhere. The
store prefix is derived from the sorted real-member list and a per-list counter, so it is the same
in every real process without any exchange.
"""

from __future__ import annotations

import datetime
import hashlib
import os
import socket

import torch
import torch.distributed as dist

DEVICES = ("cpu", "cuda")


def store_from_env(*, physical_rank: int, num_real: int, timeout_s: float) -> dist.Store:
    """The real processes' rendezvous store, as torchrun's environment describes it.

    One real process: a process-local HashStore. Otherwise a TCPStore at MASTER_ADDR:MASTER_PORT:
    under torchrun (TORCHELASTIC_USE_AGENT_STORE=True) a client of the agent's store, elsewhere
    hosted by physical rank 0. Keys live under ``prism/`` so they never meet torch's own.
    """
    if num_real == 1:
        return dist.HashStore()
    missing = [name for name in ("MASTER_ADDR", "MASTER_PORT") if not os.environ.get(name)]
    if missing:
        raise ValueError(
            f"activate(real_store=None) with {num_real} real processes reads MASTER_ADDR and MASTER_PORT "
            f"(as torchrun sets them); {', '.join(missing)} unset: set them or pass real_store"
        )
    try:
        port = int(os.environ["MASTER_PORT"])
    except ValueError as exc:
        raise ValueError(f"MASTER_PORT must be a port number, got {os.environ['MASTER_PORT']!r}") from exc
    agent_store = os.environ.get("TORCHELASTIC_USE_AGENT_STORE") == "True"
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"],
        port,
        world_size=num_real,
        is_master=physical_rank == 0 and not agent_store,
        timeout=datetime.timedelta(seconds=timeout_s),
        wait_for_workers=False,
    )
    return dist.PrefixStore("prism/", store)


class RealSubgroups:
    """Creates the real communicators of prism groups for one activation."""

    def __init__(self, *, store: dist.Store, virtual_rank: int, device: str, timeout_s: float) -> None:
        if device not in DEVICES:
            raise ValueError(f"device must be one of {DEVICES}, got {device!r}")
        self._store = store
        self._virtual_rank = virtual_rank
        self._device = device
        self._timeout = datetime.timedelta(seconds=timeout_s)
        self._created_per_list: dict[tuple[int, ...], int] = {}
        self._backends: list[dist.ProcessGroup] = []
        self._devices: dict[int, str] = {}
        self.kinds: dict[tuple[int, ...], str] = {}
        """The kind of communicator ("gloo" or "nccl") made for each real-member list."""
        if device == "cuda":
            self._store.set(_device_key(virtual_rank), device_identity())

    @property
    def num_created(self) -> int:
        return len(self._backends)

    def create(self, real_members: tuple[int, ...]):
        """A communicator among ``real_members`` (sorted virtual ranks, this process among them).

        Its rank of each member is the member's index in ``real_members``. Blocks until every member
        has created it.
        """
        count = self._created_per_list.get(real_members, 0) + 1
        self._created_per_list[real_members] = count
        digest = hashlib.sha1(",".join(map(str, real_members)).encode()).hexdigest()[:16]
        store = dist.PrefixStore(f"real/{len(real_members)}-{digest}/{count}/", self._store)
        rank = real_members.index(self._virtual_rank)
        if self._device == "cpu" or self.share_a_device(real_members):
            backend = dist.ProcessGroupGloo(store, rank, len(real_members), self._timeout)
            self.kinds[real_members] = "gloo"
        else:
            self.kinds[real_members] = "nccl"
            options = dist.ProcessGroupNCCL.Options()
            options._timeout = self._timeout
            backend = dist.ProcessGroupNCCL(store, rank, len(real_members), options)
        self._backends.append(backend)
        return backend

    def share_a_device(self, real_members: tuple[int, ...]) -> bool:
        """Whether two of these real members run on one GPU (waits until each has published it)."""
        identities = [self._device_of(member) for member in real_members]
        return len(set(identities)) < len(identities)

    def _device_of(self, virtual_rank: int) -> str:
        if virtual_rank not in self._devices:
            self._devices[virtual_rank] = self._store.get(_device_key(virtual_rank)).decode()
        return self._devices[virtual_rank]

    def shutdown(self) -> None:
        """Release every communicator this object created (safe twice)."""
        for backend in self._backends:
            shutdown = getattr(backend, "shutdown", None)
            if shutdown is not None:
                shutdown()
        self._backends.clear()


def device_identity() -> str:
    """This process's GPU, the same string in every process that uses it: host name and GPU UUID."""
    index = torch.cuda.current_device()
    uuid = getattr(torch.cuda.get_device_properties(index), "uuid", None)
    return f"{socket.gethostname()}/{uuid if uuid is not None else index}"


def _device_key(virtual_rank: int) -> str:
    return f"device/{virtual_rank}"
