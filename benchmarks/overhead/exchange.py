"""One pipeline exchange: through the prism interceptor with a virtual neighbour, and over real gloo.

Why: a real rank's pipeline exchange with a virtual stage must cost the host no more than the real
exchange it stands for, or the emulated rank runs behind its real self at every step. Both sides
call megatron-core's own entry point (`P2PCommunicator.send_backward_recv_forward` on the last of
two pipeline stages: send a gradient back, receive the next activation), with the same shape and
dtype, on one core each:

* interceptor: one process, virtual rank 1 of a W = 2, PP = 2 job (rank 0 virtual), set up as the
  emulation pass sets it up (`prism_megatron.megatron.run.runtime`, which also gives it its share of
  the machine: one thread, a core of its own), virtual peers instant, so what is timed is the
  interceptor's own host work;
* gloo: two real processes (both stages) exchanging in lockstep through megatron-core's own
  communicator, as the all-real run does; rank 1's calls are timed.

Each measures `num_calls` calls after a warm-up, in `repetitions` separate rounds; the result is
each round's median (us) and the median of those.

Run: ``python -m benchmarks.overhead.exchange [--calls N] [--repetitions R] [--profile]``
(``--profile`` prints cProfile's top entries of the interceptor's calls).
"""

from __future__ import annotations

import os

os.environ.setdefault("OMP_NUM_THREADS", "1")

import argparse
import statistics
import sys
import time
import warnings

SHAPES = {"512 B": (8, 1, 16), "128 KiB": (128, 2, 128)}
"""The sleep model's activation, and the tiny GPT's (sequence 128, micro-batch 2, hidden 128)."""
WARMUP_CALLS = 50


def _communicator(*, emulate: bool):
    """megatron-core's communicator for the last of two stages, after the set-up of the pass."""
    import torch
    from megatron.core import ModelParallelConfig, parallel_state
    from megatron.core.pipeline_parallel import schedules

    from prism_megatron.config import EmulationConfig, PrismConfig
    from prism_megatron.megatron.run import runtime

    emulation = EmulationConfig(
        emulate=emulate, world_size=2 if emulate else None, ranks="1" if emulate else None, device="cpu"
    )
    rt = runtime.Runtime.start(PrismConfig(emulation=emulation))
    rt.sizes = runtime.ParallelSizes(pp=2)
    rt.bring_up()
    parallel_state.initialize_model_parallel(pipeline_model_parallel_size=2, create_gloo_process_groups=False)
    rt.before_model()
    config = ModelParallelConfig(pipeline_model_parallel_size=2, pipeline_dtype=torch.float32)
    group = parallel_state.get_pipeline_model_parallel_group()
    return rt, schedules.P2PCommunicator(pp_group=group, config=config)


def _timed_calls(call, num_calls: int) -> list[float]:
    for _ in range(WARMUP_CALLS):
        call()
    samples = []
    for _ in range(num_calls):
        begin = time.perf_counter_ns()
        call()
        samples.append((time.perf_counter_ns() - begin) / 1e3)
    return samples


def measure(request: tuple[str, int, bool]) -> dict[str, float]:
    """In a forked process: median us per call for each shape (`request`: side, calls, profile)."""
    import torch
    from megatron.core import parallel_state

    side, num_calls, profile = request
    rt, communicator = _communicator(emulate=side == "interceptor")
    last_stage = side == "interceptor" or int(os.environ["RANK"]) == 1
    medians = {}
    try:
        for name, shape in SHAPES.items():
            call = _exchange(communicator, torch.zeros(shape), shape, last_stage=last_stage)
            if profile and side == "interceptor":
                _profile(call, num_calls)
            medians[name] = statistics.median(_timed_calls(call, num_calls))
    finally:
        parallel_state.destroy_model_parallel()
        rt.close()
    return medians


def _exchange(communicator, tensor, shape, *, last_stage: bool):
    """One steady-state exchange of 1F1B: the last stage sends a gradient back and receives the next
    activation; the first sends an activation and receives a gradient."""
    if last_stage:
        return lambda: communicator.send_backward_recv_forward(tensor, shape, is_first_stage=False)
    return lambda: communicator.send_forward_recv_backward(tensor, shape, is_last_stage=False)


def _profile(call, num_calls: int) -> None:
    import cProfile
    import pstats

    profiler = cProfile.Profile()
    profiler.enable()
    for _ in range(num_calls):
        call()
    profiler.disable()
    pstats.Stats(profiler, stream=sys.stderr).sort_stats("tottime").print_stats(18)


def run(num_calls: int, repetitions: int, profile: bool = False) -> dict:
    """Both sides, `repetitions` rounds each (alternating); medians in us by side and shape."""
    from benchmarks.fidelity.processes import run_processes

    rounds: dict[str, list[dict[str, float]]] = {"interceptor": [], "gloo": []}
    for repetition in range(repetitions):
        (interceptor,) = run_processes(measure, [("interceptor", num_calls, profile and repetition == 0)])
        rounds["interceptor"].append(interceptor)
        rounds["gloo"].append(run_processes(measure, [("gloo", num_calls, False)] * 2)[1])
    summary = {}
    for side, per_round in rounds.items():
        summary[side] = {
            name: {
                "rounds_us": [r[name] for r in per_round],
                "median_us": statistics.median(r[name] for r in per_round),
            }
            for name in SHAPES
        }
    ratio = {
        name: summary["interceptor"][name]["median_us"] / summary["gloo"][name]["median_us"]
        for name in SHAPES
    }
    return {
        "calls_per_round": num_calls,
        "repetitions": repetitions,
        "sides": summary,
        "ratio": ratio,
        "load_average_1min": os.getloadavg()[0],
    }


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--calls", type=int, default=2000, help="timed calls per round (default 2000)")
    parser.add_argument("--repetitions", type=int, default=5, help="rounds per side (default 5)")
    parser.add_argument("--profile", action="store_true", help="cProfile the interceptor's first round")
    args = parser.parse_args(argv)
    warnings.filterwarnings("ignore")
    import megatron.core  # noqa: F401  (once here; the forked processes inherit it)

    load_before = os.getloadavg()[0]
    record = run(args.calls, args.repetitions, args.profile)
    print(f"load average (1 min) before {load_before:.1f}, after {record['load_average_1min']:.1f}")
    for side, shapes in record["sides"].items():
        for name, row in shapes.items():
            rounds = ", ".join(f"{v:.1f}" for v in row["rounds_us"])
            print(f"{side:>11} {name:>8}: median {row['median_us']:.1f} us (rounds {rounds})")
    for name, ratio in record["ratio"].items():
        print(f"interceptor / gloo, {name}: {ratio:.2f}x")
    return 0


if __name__ == "__main__":
    sys.exit(main())
