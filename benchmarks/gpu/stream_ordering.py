"""The consumer of a collective sees its result through stream order alone, with no host sync.

Why: under NCCL, `work.wait()` makes the caller's stream wait for the communication stream and
returns at once; a kernel issued after it reads the reduced data. The prism backend must keep that
contract while its stream holds the op until the virtual peers' arrival: the host must not block,
the consumer must not start before the op completes on the device, and it must read the result.

Each of NUM_OPS rounds: an iteration start, an async all-reduce of a 64 MiB tensor on a group with
three virtual peers that arrive ARRIVAL_MS after it (cost COST_MS), `work.wait()`, a consumer
(`y = t * 2`) and a mark on the caller's stream. Checked: the host's time from issue to after the
consumer (no sync: far under the arrival; the first round, which creates the backend, apart); the
consumer's mark on the device at or after arrival + cost; y equal to twice the reduced value. In a
control round without `work.wait()` the consumer must run before the op completes, or the check
could not tell stream order from a stream that waits anyway.

Run: ``python -m benchmarks.gpu.stream_ordering --out DIR [--device cuda|cpu]``; writes
DIR/stream_ordering.json and .md; exits 1 when a check failed.
"""

from __future__ import annotations

import argparse
import contextlib
import json
import os
import statistics
import sys
import time

import torch
import torch.distributed as dist

NAME = "stream_ordering"
WORLD = 16
SELF = 3
TP = (0, 1, 2, 3)
NUM_OPS = 20
ARRIVAL_MS = 20.0
COST_MS = 1.0
HOST_BOUND_MS = 5.0
"""The host's issue-to-consumer time must stay under this: a quarter of the device's wait."""
NUMEL = 16 * 2**20  # 64 MiB of float32
MS = 1_000_000


def _synchronize(device: str) -> None:
    if device == "cuda":
        torch.cuda.synchronize()
    else:
        from prism_megatron.replay import test_device

        test_device.synchronize()


def measure(device: str) -> dict:
    from prism_megatron import backend, replay
    from prism_megatron.replay import OpKind, ReplaySchedule, ScheduledOp, test_device, timeline

    tensor_device = "cuda" if device == "cuda" else "cpu"
    numel = NUMEL if device == "cuda" else 1024
    with contextlib.ExitStack() as stack:
        if device != "cuda":
            stack.enter_context(test_device.active_device())
        stack.enter_context(
            backend.activate(
                world_size=WORLD, virtual_rank=SELF, real_ranks=[SELF], device=device, timeout_s=30.0
            )
        )
        stack.callback(replay.reset)
        replay.set_mode("replay")
        op = ScheduledOp(
            OpKind.ALL_REDUCE, numel * 4, arrival_offset_ns=int(ARRIVAL_MS * MS), cost_ns=int(COST_MS * MS)
        )
        replay.load_schedule(
            ReplaySchedule(
                virtual_rank=SELF,
                collectives={TP: [op] * (NUM_OPS + 1)},
                p2p={},
                iteration_time_ns=int(4 * ARRIVAL_MS * MS),
            )
        )
        tp = dist.new_group(list(TP))
        rounds = []
        for _ in range(NUM_OPS):
            t = torch.ones(numel, device=tensor_device)
            _synchronize(device)
            start = replay.mark_iteration_start()
            host_begin = time.monotonic_ns()
            work = dist.all_reduce(t, group=tp, async_op=True)
            work.wait()
            y = t * 2
            after = timeline.mark()
            host_ms = (time.monotonic_ns() - host_begin) / MS
            start_ns, after_ns = timeline.resolve([start, after])
            _synchronize(device)
            rounds.append({"host_ms": host_ms, "consumer_after_start_ms": (after_ns - start_ns) / MS,
                           "right": bool((y == 2 * len(TP)).all())})  # fmt: skip
        # The same op without work.wait(): the consumer must run before the op completes, or the
        # rounds above could not tell stream order from a stream that waits anyway.
        t = torch.ones(numel, device=tensor_device)
        start = replay.mark_iteration_start()
        work = dist.all_reduce(t, group=tp, async_op=True)
        t.mul_(2)  # the consumer, unordered
        after = timeline.mark()
        start_ns, after_ns = timeline.resolve([start, after])
        _synchronize(device)
        control = {"consumer_after_start_ms": (after_ns - start_ns) / MS}
    return _judge(device, rounds, control)


def _judge(device: str, rounds: list[dict], control: dict | None) -> dict:
    host = [r["host_ms"] for r in rounds[1:]]  # the first round makes the group's backend and streams
    consumer = [r["consumer_after_start_ms"] for r in rounds]
    checks = {
        "host_never_waited": max(host) < HOST_BOUND_MS,
        "consumer_after_completion": min(consumer) >= ARRIVAL_MS + COST_MS,
        "consumer_read_result": all(r["right"] for r in rounds),
        "control_discriminates": control["consumer_after_start_ms"] < ARRIVAL_MS,
    }
    return {
        "device": device,
        "num_ops": len(rounds),
        "arrival_ms": ARRIVAL_MS,
        "cost_ms": COST_MS,
        "host_ms": {"median": statistics.median(host), "max": max(host), "first_round": rounds[0]["host_ms"]},
        "consumer_after_start_ms": {"min": min(consumer), "median": statistics.median(consumer)},
        "control": control,
        "checks": checks,
        # A dry run of run.sh (the CPU standing in, two shared cores) judges the order, not the host's time.
        "ok": all(
            ok
            for name, ok in checks.items()
            if name != "host_never_waited" or not os.environ.get("PRISM_GPU_DRY_RUN")
        ),
    }


def markdown(result: dict) -> str:
    host, consumer = result["host_ms"], result["consumer_after_start_ms"]
    lines = [
        f"## Stream order from a collective to its consumer ({result['device']})",
        "",
        f"{result['num_ops']} async all-reduces whose virtual peers arrive {result['arrival_ms']:g} ms after the "
        f"iteration start (cost {result['cost_ms']:g} ms), each waited with work.wait() and consumed at once.",
        "",
        f"Host, issue to consumer issued: median {host['median']:.3f} ms, max {host['max']:.3f} ms "
        f"(bound {HOST_BOUND_MS:g} ms). Consumer on the device after the start: min {consumer['min']:.3f} ms, "
        f"median {consumer['median']:.3f} ms (bound >= {result['arrival_ms'] + result['cost_ms']:g} ms).",
        "",
        "| check | holds |",
        "|---|---|",
        *(f"| {name} | {'yes' if ok else '**NO**'} |" for name, ok in result["checks"].items()),
        "",
    ]
    return "\n".join(lines)


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help=f"directory for {NAME}.json and .md")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda",
                        help="cuda: the GPU; cpu: the asynchronous test device")  # fmt: skip
    args = parser.parse_args(argv)
    if args.device == "cuda" and not torch.cuda.is_available():
        print(f"{NAME}: --device cuda needs a GPU", file=sys.stderr)
        return 2
    result = measure(args.device)
    os.makedirs(args.out, exist_ok=True)
    for name, text in ((f"{NAME}.json", json.dumps(result, indent=2)), (f"{NAME}.md", markdown(result))):
        with open(os.path.join(args.out, name), "w") as f:
            f.write(text)
    print(markdown(result))
    return 0 if result["ok"] else 1


if __name__ == "__main__":
    sys.exit(main())
