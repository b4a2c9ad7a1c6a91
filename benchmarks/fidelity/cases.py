"""The sleep-compute cases: three layouts, each with and without a straggler and overlapped grad reduce.

Every layout has W = 16 ranks (16 real processes in the ground truth). Per pipeline stage and
micro-batch, forward sleeps `FWD_MS` (split over the stage's layers and model chunks) and backward
twice that, so one iteration takes 1.3-2 s and the gloo traffic (sub-millisecond p2p, a few
milliseconds per data-parallel all-reduce on this machine's loopback) is small beside it. Long
sleeps and few micro-batches keep the ground truth honest: every step of every process costs some
CPU time that 16 processes on two cores delay each other in, and the longer the step, the smaller
that delay is beside it. A straggler is a virtual rank of another data-parallel
replica at another pipeline stage, 1.5 times slower: the real rank feels it only through its
pipeline peers and the data-parallel gradient reduction. Rank numbers follow Megatron's default
order tp-cp-ep-dp-pp (rank = tp + TP * (dp + DP * pp)).
"""

from __future__ import annotations

import dataclasses

from benchmarks.fidelity.workload import Job

FWD_MS = 60.0
STRAGGLER_FACTOR = 1.5


@dataclasses.dataclass(frozen=True, kw_only=True)
class Case:
    """One comparison: a real run of `job` against its emulation with `real_ranks` real."""

    name: str
    job: Job
    real_ranks: tuple[int, ...]
    kind: str = "sleep-compute"
    iterations: int = 6
    """Iterations of each run (--train-iters)."""
    warmup: int = 2
    """Leading iterations of each run left out of its median."""
    rounds: int = 5
    """Independent rounds: each runs the real job and its emulation (every cost model), fresh
    processes each, the real run first in even rounds and last in odd ones."""
    graph_of: str | None = None
    """Reuse the graph that case captured (this case is a what-if of its job: a straggler)."""
    capture_iters: int = 6
    """--prism-capture-iters (the first is warm-up; each span is the median of the rest)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class _Layout:
    name: str
    tp: int
    pp: int
    dp: int
    vpp: int | None
    num_layers: int
    fwd_ms: float
    num_microbatches: int
    real_ranks: tuple[int, ...]
    straggler: int


LAYOUTS = (
    _Layout(name="pp4-dp4", tp=1, pp=4, dp=4, vpp=None, num_layers=8, fwd_ms=FWD_MS / 2,
            num_microbatches=4, real_ranks=(4,), straggler=9),
    _Layout(name="pp8-vpp2-dp2", tp=1, pp=8, dp=2, vpp=2, num_layers=16, fwd_ms=FWD_MS / 2,
            num_microbatches=8, real_ranks=(2,), straggler=9),
    _Layout(name="tp2-pp4-dp2", tp=2, pp=4, dp=2, vpp=None, num_layers=4, fwd_ms=FWD_MS,
            num_microbatches=4, real_ranks=(4, 5), straggler=10),
)  # fmt: skip
"""pp4-dp4: real rank 4 (stage 1, replica 0), straggler 9 (stage 2, replica 1).
pp8-vpp2-dp2: real rank 2 (stage 1, replica 0), straggler 9 (stage 4, replica 1).
tp2-pp4-dp2: real ranks 4 and 5 (the TP pair of stage 1, replica 0: their TP all-reduces are real),
straggler 10 (stage 2, replica 1, TP rank 0)."""


def sleep_cases(layouts=LAYOUTS) -> list[Case]:
    """Every layout with and without overlapped grad reduce, with and without a straggler."""
    cases = []
    for layout in layouts:
        for overlap in (False, True):
            for straggler in (False, True):
                job = Job(
                    tp=layout.tp,
                    pp=layout.pp,
                    dp=layout.dp,
                    vpp=layout.vpp,
                    num_microbatches=layout.num_microbatches,
                    num_layers=layout.num_layers,
                    fwd_ms=layout.fwd_ms,
                    bwd_ms=2 * layout.fwd_ms,
                    overlap_grad_reduce=overlap,
                    stragglers=((layout.straggler, STRAGGLER_FACTOR),) if straggler else (),
                )
                base = layout.name + ("-overlap" if overlap else "")
                name = base + ("-straggler" if straggler else "")
                cases.append(Case(name=name, job=job, real_ranks=layout.real_ranks,
                                  graph_of=base if straggler else None))  # fmt: skip
    return cases


TINY_GPT = (
    "--num-layers", "4", "--hidden-size", "128", "--num-attention-heads", "4", "--seq-length", "128",
    "--vocab-size", "1024", "--micro-batch-size", "2", "--hidden-dropout", "0", "--attention-dropout", "0",
    "--train-iters", "1",
)  # fmt: skip
"""The built-in entry's GPT at a size whose step takes a few hundred ms on one core."""


def real_compute_cases(num_microbatches: int = 4) -> list[Case]:
    """Two real processes (PP2, DP2, TP2) against rank 1 real and rank 0 virtual.

    At most two processes compute at once, each on a core of its own (--prism-cpu-threads-per-rank's
    default here: one thread, one core by local rank), in the real run, the capture (one slice rank
    at a time) and the emulation alike. Eight iterations per round (six after warm-up)."""
    cases = []
    for name, tp, pp, dp in (("real-pp2", 1, 2, 1), ("real-dp2", 1, 1, 2), ("real-tp2", 2, 1, 1)):
        global_batch = 2 * num_microbatches * dp
        flags = (*TINY_GPT, "--global-batch-size", str(global_batch))
        job = Job(tp=tp, pp=pp, dp=dp, gpt_flags=flags)
        cases.append(Case(name=name, job=job, real_ranks=(1,), kind="real-compute", iterations=8, warmup=2))
    return cases


def smoke_case() -> Case:
    """The CI's case: PP2 x DP2, one real rank, a few short iterations, two rounds."""
    job = Job(tp=1, pp=2, dp=2, num_microbatches=4, num_layers=2, fwd_ms=20.0, bwd_ms=40.0)
    return Case(
        name="smoke-pp2-dp2", job=job, real_ranks=(2,), iterations=5, warmup=2, rounds=2, capture_iters=4
    )
