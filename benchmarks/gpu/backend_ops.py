"""Every op family of the prism backend on a device, with one and with two real processes.

Why: a real rank's ops take the device path on CUDA tensors (they complete on the backend's stream,
Work.wait() makes the caller's stream wait). This stage creates the backend on the device and runs one
op of each family on a group with virtual members and, with two real processes sharing the device
(gloo sub-communicators: NCCL refuses a duplicate GPU), on an all-real group and with p2p between
the real ranks. Every result, read after synchronising the device, must equal what the host path
gives for the same ops on CPU tensors in the same process.

``--device cuda`` runs it on the GPU; ``--device cpu`` runs the same device path on the asynchronous
test device (`prism_megatron.replay.test_device`), so the stage itself is checked without a GPU.

Run: ``python -m benchmarks.gpu.backend_ops --out DIR [--device cuda|cpu]``; writes
DIR/backend_ops.json and .md.
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import sys
import traceback
import warnings

import torch
import torch.distributed as dist

NAME = "backend_ops"
WORLD = 8
REAL_SETS = {1: (1,), 2: (1, 5)}
"""Real ranks per process count: in the pair, one real member in each half of the world."""
TIMEOUT = datetime.timedelta(seconds=60)


def every_family(me: int, real: tuple[int, ...], device: str) -> dict[str, torch.Tensor]:
    """One op of each family on a mixed group (and, with two real ranks, an all-real pair and p2p
    between them); results by name, as issued (read them after synchronising the device)."""
    groups = [("mixed", dist.new_group([0, 1, 4, 5]), 4)]
    if len(real) == 2:
        groups.insert(0, ("pair", dist.new_group(list(real)), 2))
    out: dict[str, torch.Tensor] = {}
    for name, group, size in groups:
        x = torch.arange(6.0, device=device) + 10 * me
        t = x.clone()
        dist.all_reduce(t, group=group)
        out[f"{name}/all_reduce"] = t
        gathered = torch.empty(6 * size, device=device)
        dist.all_gather_into_tensor(gathered, x, group=group)
        out[f"{name}/all_gather"] = gathered
        chunk = torch.empty(2, device=device)
        dist.reduce_scatter_tensor(chunk, torch.arange(2.0 * size, device=device) + me, group=group)
        out[f"{name}/reduce_scatter"] = chunk
        b = x.clone()
        dist.broadcast(b, src=real[0], group=group)
        out[f"{name}/broadcast"] = b
        a2a = torch.empty(2 * size, device=device)
        dist.all_to_all_single(a2a, torch.arange(2.0 * size, device=device) + 100 * me, group=group)
        out[f"{name}/all_to_all"] = a2a
        work = dist.all_reduce(torch.ones(3, device=device) * (me + 1), group=group, async_op=True)
        work.wait()
        out[f"{name}/async_all_reduce"] = work.result()[0]
        dist.barrier(group=group)
    virtual_peer = 0 if me != 0 else 2
    received = torch.full((4,), float("nan"), device=device)
    dist.recv(received, src=virtual_peer)
    out["p2p/recv_from_virtual"] = received
    if len(real) == 2:
        peer = real[1 - real.index(me)]
        sent, got = torch.arange(4.0, device=device) + me, torch.empty(4, device=device)
        ops = [dist.P2POp(dist.isend, sent, peer), dist.P2POp(dist.irecv, got, peer)]
        for work in dist.batch_isend_irecv(ops):
            work.wait()
        out["p2p/exchange_real"] = got
    return out


def _store(physical_rank: int, num_processes: int) -> dist.Store:
    """The processes' one store (each run below takes a prefix of it: one server, one port)."""
    if num_processes == 1:
        return dist.HashStore()
    return dist.TCPStore(os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), world_size=num_processes,
                         is_master=physical_rank == 0, timeout=TIMEOUT, wait_for_workers=False)  # fmt: skip


def _run_on(
    device: str, physical_rank: int, real: tuple[int, ...], base_store: dist.Store
) -> dict[str, torch.Tensor]:
    from prism_megatron import backend
    from prism_megatron.replay import test_device

    me = real[physical_rank]
    on_test_device = device == "test"
    tensor_device = "cpu" if device in ("host", "test") else "cuda"
    if on_test_device:
        test_device.activate()
    store = dist.PrefixStore(f"{device}/", base_store)
    try:
        with backend.activate(world_size=WORLD, virtual_rank=me, real_ranks=list(real), real_store=store,
                              device="cuda" if tensor_device == "cuda" else "cpu", timeout_s=60.0):  # fmt: skip
            results = every_family(me, real, tensor_device)
            if tensor_device == "cuda":
                torch.cuda.synchronize()
            if on_test_device:
                test_device.synchronize()
            return {k: v.detach().cpu().clone() for k, v in results.items()}
    finally:
        if on_test_device:
            test_device.deactivate()


def process_main(physical_rank: int, num_processes: int, device: str, out_dir: str) -> None:
    """One real process: the families on the device, then on the host; the comparison to a file."""
    warnings.filterwarnings("ignore")
    real = REAL_SETS[num_processes]
    record: dict[str, object] = {"physical_rank": physical_rank, "num_processes": num_processes}
    try:
        if device == "cuda":
            torch.cuda.set_device(0)  # every real process shares the one GPU
        store = _store(physical_rank, num_processes)
        on_device = _run_on("test" if device == "cpu" else "cuda", physical_rank, real, store)
        on_host = _run_on("host", physical_rank, real, store)
        if num_processes > 1:  # the store's server (physical rank 0) outlives every client's use
            store.set(f"done/{physical_rank}", "1")
            store.wait([f"done/{r}" for r in range(num_processes)])
        record["ops"] = {
            name: {"ok": bool(torch.equal(on_device[name], on_host[name])),
                   "device": on_device[name].tolist(), "host": on_host[name].tolist()}
            for name in on_host
        }  # fmt: skip
        record["created"] = True
    except Exception:
        record["created"] = False
        record["error"] = traceback.format_exc()
    with open(os.path.join(out_dir, f"process-{num_processes}-{physical_rank}.json"), "w") as f:
        json.dump(record, f, indent=2)


def _entry(physical_rank: int, num_processes: int, port: int, device: str, out_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    process_main(physical_rank, num_processes, device, out_dir)


def measure(device: str, out_dir: str) -> dict:
    import torch.multiprocessing as mp

    from benchmarks.fidelity.processes import free_port

    runs = {}
    for num_processes in (1, 2):
        mp.start_processes(_entry, args=(num_processes, free_port(), device, out_dir), nprocs=num_processes,
                           join=True, start_method="spawn")  # fmt: skip
        records = []
        for physical_rank in range(num_processes):
            path = os.path.join(out_dir, f"process-{num_processes}-{physical_rank}.json")
            with open(path) as f:
                records.append(json.load(f))
        failed_ops = sorted({name for r in records for name, op in r.get("ops", {}).items() if not op["ok"]})
        runs[str(num_processes)] = {
            "created": all(r["created"] for r in records),
            "ops": sorted({name for r in records for name in r.get("ops", {})}),
            "failed_ops": failed_ops,
            "errors": [r["error"] for r in records if "error" in r],
            "ok": all(r["created"] for r in records) and not failed_ops,
        }
    return {"device": device, "runs": runs, "ok": all(run["ok"] for run in runs.values())}


def markdown(result: dict) -> str:
    lines = [f"## Backend op families on the device ({result['device']})", "",
             "| real processes | backend created | op families | mismatches |", "|---:|---|---:|---|"]  # fmt: skip
    for n, run in result["runs"].items():
        lines.append(f"| {n} | {'yes' if run['created'] else 'NO'} | {len(run['ops'])} | "
                     f"{', '.join(run['failed_ops']) or 'none'} |")  # fmt: skip
    for n, run in result["runs"].items():
        for error in run["errors"]:
            lines += ["", f"{n} process(es) failed:", "", "```", error.strip()[-2000:], "```"]
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help=f"directory for {NAME}.json and .md")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda: the GPU; cpu: the same device path on the asynchronous test device")  # fmt: skip
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"{NAME}: --device cuda needs a GPU", file=sys.stderr)
        return 2
    os.makedirs(args.out, exist_ok=True)
    result = measure(args.device, args.out)
    with open(os.path.join(args.out, f"{NAME}.json"), "w") as f:
        json.dump(result, f, indent=2)
    text = markdown(result)
    with open(os.path.join(args.out, f"{NAME}.md"), "w") as f:
        f.write(text)
    print(text)
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
