"""More than 32 real parts of two real ranks sharing one GPU: every op completes, with the right values.

Why: two real ranks on one GPU talk over gloo, so each op with a real part is a job for the backend's
helper thread, which waits for gloo and releases the communication stream through a host flag. While
the helper's stream came from torch's pool of 32 streams per device, one job in 32 drew the
communication stream itself and waited on itself until the watchdog fired. This stage issues 48
rounds, each an all-reduce on the all-real pair, one on a group with virtual members and one
coalesced all-reduce on the pair (megatron-core's gradient sync, which gloo refuses on CUDA tensors
without the backend's host staging), and checks every value after the device ran them.

``--device cuda``: both processes on cuda:0. ``--device cpu``: the same path on the test device.

Run: ``python -m benchmarks.gpu.shared_gpu_jobs --out DIR [--device cuda|cpu]``; writes
DIR/shared_gpu_jobs.json and .md; exits 1 when an op failed, hung or gave a wrong value.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
import traceback
import warnings

import torch
import torch.distributed as dist

from benchmarks.gpu.backend_ops import _store

NAME = "shared_gpu_jobs"
WORLD = 8
REAL = (1, 5)
MIXED = (0, 1, 4, 5)
NUM_ROUNDS = 48
"""Three helper-thread jobs a round (two on the pair, one on the mixed group): 144, well past 32."""
TIMEOUT_S = 30.0


def rounds(me: int, device: str) -> dict[str, object]:
    """NUM_ROUNDS rounds of the three ops; the values after the device ran them, and the time."""
    from torch.distributed.distributed_c10d import _coalescing_manager

    pair, mixed = dist.new_group(list(REAL)), dist.new_group(list(MIXED))
    wrong = []
    begin = time.monotonic()
    for number in range(NUM_ROUNDS):
        a = torch.full((1024,), float(me + number), device=device)
        dist.all_reduce(a, group=pair)
        m = torch.full((256,), 1.0, device=device)
        dist.all_reduce(m, group=mixed)
        grads = [torch.full((300,), float(me), device=device), torch.full((7,), 2.0, device=device)]
        with _coalescing_manager(pair, async_ops=True) as manager:
            for g in grads:
                dist.all_reduce(g, group=pair, async_op=True)
        manager.wait()
        if device == "cuda":
            torch.cuda.synchronize()
        else:
            from prism_megatron.replay import test_device

            test_device.synchronize()
        expected = {
            "pair": float(sum(r + number for r in REAL)),
            "mixed": float(len(MIXED)),  # every member contributes 1: real by gloo, virtual by mirror
            "coalesced": float(sum(REAL)),
            "coalesced_small": 4.0,
        }
        got = {"pair": a, "mixed": m, "coalesced": grads[0], "coalesced_small": grads[1]}
        wrong += [f"round {number} {k}" for k, v in got.items() if not bool((v == expected[k]).all())]
    return {"rounds": NUM_ROUNDS, "wrong": wrong, "seconds": time.monotonic() - begin}


def process_main(physical_rank: int, device: str, out_dir: str) -> None:
    from prism_megatron import backend
    from prism_megatron.replay import test_device

    warnings.filterwarnings("ignore")
    record: dict[str, object] = {"physical_rank": physical_rank}
    store = _store(physical_rank, len(REAL))
    try:
        if device == "cuda":
            torch.cuda.set_device(0)  # both real processes share the one GPU
        else:
            test_device.activate()
        with backend.activate(world_size=WORLD, virtual_rank=REAL[physical_rank], real_ranks=list(REAL),
                              real_store=dist.PrefixStore("jobs/", store), device=device,
                              timeout_s=TIMEOUT_S):  # fmt: skip
            record.update(rounds(REAL[physical_rank], "cuda" if device == "cuda" else "cpu"))
        record["ok"] = not record["wrong"]
    except Exception:
        record["ok"] = False
        record["error"] = traceback.format_exc()
    finally:
        if device != "cuda":
            test_device.deactivate()
        store.set(f"done/{physical_rank}", "1")
        store.wait([f"done/{r}" for r in range(len(REAL))])
    with open(os.path.join(out_dir, f"process-{physical_rank}.json"), "w") as f:
        json.dump(record, f, indent=2)


def _entry(physical_rank: int, port: int, device: str, out_dir: str) -> None:
    os.environ["MASTER_ADDR"] = "127.0.0.1"
    os.environ["MASTER_PORT"] = str(port)
    process_main(physical_rank, device, out_dir)


def measure(device: str, out_dir: str) -> dict:
    import torch.multiprocessing as mp

    from benchmarks.fidelity.processes import free_port

    mp.start_processes(_entry, args=(free_port(), device, out_dir), nprocs=len(REAL), join=True,
                       start_method="spawn")  # fmt: skip
    records = []
    for physical_rank in range(len(REAL)):
        with open(os.path.join(out_dir, f"process-{physical_rank}.json")) as f:
            records.append(json.load(f))
    return {
        "device": device,
        "real_ranks": list(REAL),
        "rounds": NUM_ROUNDS,
        "helper_jobs_per_process": 3 * NUM_ROUNDS,
        "seconds": max(r.get("seconds", 0.0) for r in records),
        "wrong": sorted({w for r in records for w in r.get("wrong", [])}),
        "errors": [r["error"] for r in records if "error" in r],
        "ok": all(r["ok"] for r in records),
    }


def markdown(result: dict) -> str:
    lines = [
        f"## Two real ranks sharing one device: {result['helper_jobs_per_process']} helper jobs ({result['device']})",
        "",
        f"{result['rounds']} rounds (pair all-reduce, mixed-group all-reduce, coalesced pair all-reduce) "
        f"in {result['seconds']:.1f} s: **{'all right' if result['ok'] else 'FAILED'}**.",
    ]
    if result["wrong"]:
        lines += ["", "Wrong values: " + ", ".join(result["wrong"][:20])]
    for error in result["errors"]:
        lines += ["", "```", error.strip()[-2000:], "```"]
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
    for name, text in ((f"{NAME}.json", json.dumps(result, indent=2)), (f"{NAME}.md", markdown(result))):
        with open(os.path.join(args.out, name), "w") as f:
            f.write(text)
    print(markdown(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
