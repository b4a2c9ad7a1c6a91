"""Smoke check of a built prism_megatron._C: activate the prism backend and run collectives on it.

Why: a build can compile and import and still crash the first time torch constructs a prism backend,
because only then do this module and torch's c10d bindings exchange ``c10d::Backend`` holders (the
GPU check of 2026-11-29 met a segmentation fault there). ``make cuda-check`` runs this against the
CUDA build it just made, and ``benchmarks/gpu/run.sh`` right after its build (with a native
backtrace and a malloc-checked rerun on a crash); everything runs on CPU tensors, so no GPU is
needed. Two checks:

- one process, the only real rank of W=8: all-reduce and a subgroup all-gather (mirror values);
- two processes, real ranks 0 and 4 of W=8: every group gets a real gloo sub-communicator, which
  torch hands to ``_C.backend.create_backend`` as a ProcessGroupGloo; an all-real group's
  all-reduce is exact.

Usage, from the repository root::

    python -X faulthandler -m tools.build_smoke [--native-dir DIR] [--single-process]

``--native-dir`` names the directory holding the ``_C`` module to check (for instance
``build/cuda-check/prism_megatron``); by default the package's own. Prints one line per check and
exits 0 when all pass.
"""

from __future__ import annotations

import argparse
import datetime
import os
import socket
import sys

import torch
import torch.distributed as dist
import torch.multiprocessing as mp

WORLD = 8
TWO_REAL = (0, 4)
TIMEOUT_S = 60.0


def use_native(native_dir: str | None):
    """Import prism_megatron._C from native_dir (searched before the package's own directory)."""
    import prism_megatron

    if native_dir is not None:
        native_dir = os.path.abspath(native_dir)
        if not os.path.isdir(native_dir):
            raise ValueError(f"--native-dir {native_dir} is not a directory")
        if "prism_megatron._C" in sys.modules:
            raise RuntimeError("prism_megatron._C was imported before --native-dir took effect")
        prism_megatron.__path__.insert(0, native_dir)
    from prism_megatron import _C

    if native_dir is not None and os.path.dirname(os.path.abspath(_C.__file__)) != native_dir:
        raise RuntimeError(f"imported {_C.__file__}, not the module in --native-dir {native_dir}")
    return _C


def check_single_process() -> str:
    from prism_megatron import backend

    with backend.activate(world_size=WORLD, virtual_rank=0, real_ranks=[0]):
        ones = torch.ones(4)
        dist.all_reduce(ones)
        assert torch.equal(ones, torch.full((4,), float(WORLD))), ones
        tp = dist.new_group([0, 1, 2, 3])
        gathered = [torch.empty(2) for _ in range(4)]
        dist.all_gather(gathered, torch.tensor([1.0, 2.0]), group=tp)
        assert all(torch.equal(g, torch.tensor([1.0, 2.0])) for g in gathered), gathered
    return "one process (W=8, real rank 0): all_reduce and subgroup all_gather ok"


def _two_process_worker(physical_rank: int, port: int, native_dir: str | None) -> None:
    use_native(native_dir)
    from prism_megatron import backend

    virtual_rank = TWO_REAL[physical_rank]
    store = dist.TCPStore(
        "127.0.0.1",
        port,
        world_size=len(TWO_REAL),
        is_master=physical_rank == 0,
        timeout=datetime.timedelta(seconds=TIMEOUT_S),
        wait_for_workers=False,
    )
    with backend.activate(
        world_size=WORLD,
        virtual_rank=virtual_rank,
        real_ranks=list(TWO_REAL),
        real_store=store,
        timeout_s=TIMEOUT_S,
    ):
        pair = dist.new_group(list(TWO_REAL))
        value = torch.full((4,), float(virtual_rank + 1))
        dist.all_reduce(value, group=pair)
        expected = float(sum(r + 1 for r in TWO_REAL))
        assert torch.equal(value, torch.full((4,), expected)), value


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]


def check_two_processes(native_dir: str | None) -> str:
    os.environ.setdefault("GLOO_SOCKET_IFNAME", "lo")
    mp.start_processes(
        _two_process_worker,
        args=(_free_port(), native_dir),
        nprocs=len(TWO_REAL),
        join=True,
        start_method="spawn",
    )
    return (
        f"two processes (W=8, real ranks {list(TWO_REAL)}): real gloo sub-communicators, exact all_reduce ok"
    )


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--native-dir", default=None, help="directory of the _C module to check")
    parser.add_argument("--single-process", action="store_true", help="skip the two-process check")
    args = parser.parse_args(argv)
    native = use_native(args.native_dir)
    print(
        f"torch {torch.__version__} ({torch.__file__}); {native.__file__} (with_cuda={native.with_cuda}, "
        f"built against torch {native.build_info.torch_version})",
        flush=True,
    )
    print(check_single_process(), flush=True)
    if not args.single_process:
        print(check_two_processes(args.native_dir), flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
