"""Record the collectives a real rank issues: op, group members, size, in issue order.

Seen from the program's side, below every backend: torch.distributed dispatches each collective as a
`c10d::` op, so a dispatch mode sees the same sequence whether a real gloo world or the prism backend
serves it. That is what lets a test hold an emulated rank against the same rank of a real run, and
lets a report say which collectives a rank issued. Point-to-point ops are counted, not listed (the
pipeline interceptor serves most of them outside torch.distributed).

Sizes follow the nccl-tests convention the op log uses: the largest buffer the op touches (for a
list of tensors, their total).
"""

from __future__ import annotations

import collections
from typing import Any

import torch
import torch.distributed as dist
from torch.utils._python_dispatch import TorchDispatchMode

_P2P_OPS = {"send", "recv_", "recv_any_source_"}


def _group_members(args: tuple) -> tuple[int, ...] | None:
    for arg in args:
        if isinstance(arg, torch.ScriptObject) and "ProcessGroup" in arg._type().qualified_name():
            return tuple(dist.get_process_group_ranks(dist.ProcessGroup.unbox(arg)))
    return None


def _size_bytes(args: tuple) -> int:
    sizes = [0]
    for arg in args:
        if isinstance(arg, torch.Tensor):
            sizes.append(arg.numel() * arg.element_size())
        elif isinstance(arg, (list, tuple)):
            flat = [t for t in arg if isinstance(t, torch.Tensor)]
            flat += [
                t
                for inner in arg
                if isinstance(inner, (list, tuple))
                for t in inner
                if isinstance(t, torch.Tensor)
            ]
            sizes.append(sum(t.numel() * t.element_size() for t in flat))
    return max(sizes)


class CollectiveRecorder(TorchDispatchMode):
    """A dispatch mode that lists every c10d collective as (op, group index, size in bytes)."""

    def __init__(self) -> None:
        super().__init__()
        self.groups: list[tuple[int, ...]] = []
        self._group_index: dict[tuple[int, ...], int] = {}
        self.ops: list[tuple[str, int, int]] = []
        self.p2p_counts: collections.Counter[str] = collections.Counter()

    def __torch_dispatch__(self, func, types, args=(), kwargs=None):
        name = func._schema.name
        if name.startswith("c10d::"):
            self._record(name.removeprefix("c10d::"), args)
        return func(*args, **(kwargs or {}))

    def _record(self, op: str, args: tuple) -> None:
        if op in _P2P_OPS:
            self.p2p_counts[op] += 1
            return
        members = _group_members(args)
        if members is None:
            return
        index = self._group_index.setdefault(members, len(self.groups))
        if index == len(self.groups):
            self.groups.append(members)
        self.ops.append((op, index, _size_bytes(args)))

    def sequence(self) -> list[tuple[str, tuple[int, ...], int]]:
        """The ops with their groups spelled out (for comparisons)."""
        return [(op, self.groups[index], size) for op, index, size in self.ops]

    def as_dict(self) -> dict[str, Any]:
        return {
            "groups": [list(g) for g in self.groups],
            "ops": [list(op) for op in self.ops],
            "p2p_counts": dict(self.p2p_counts),
        }
