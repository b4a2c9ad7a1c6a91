"""Real ranks begin each iteration at one agreed time (emulation/agreed_start.py).

Two real processes share a gloo group, as two real ranks of one model-parallel group share their
real sub-communicator. Between iterations each does host work of its own length (what the closed
loop's re-simulation is: 1 ms on one, 6 ms on the other); each iteration is 2 ms of compute and an
all-reduce between them. With the agreement, their iterations start within 100 us of each other and
neither iteration holds the other's host work; without it (the control), the rank that finished its
host work first waits the difference inside the all-reduce.
"""

from __future__ import annotations

import json
import os
import statistics

import pytest
import torch
import torch.distributed as dist

from prism_megatron.passes.agreed_start import StartAgreement
from prism_megatron.replay import clock

REAL_RANKS = (0, 1024)
HOST_WORK_NS = (1_000_000, 6_000_000)
COMPUTE_NS = 2_000_000
NUM_ITERATIONS = 8


def _worker(physical_rank: int, num_processes: int, out_dir: str, agree: bool) -> None:
    store = dist.TCPStore(
        os.environ["MASTER_ADDR"], int(os.environ["MASTER_PORT"]), num_processes, physical_rank == 0
    )
    dist.init_process_group("gloo", store=dist.PrefixStore("pg", store), rank=physical_rank,
                            world_size=num_processes)  # fmt: skip
    agreement = StartAgreement(
        store=dist.PrefixStore("prism", store), real_ranks=REAL_RANKS, virtual_rank=REAL_RANKS[physical_rank]
    )
    clock.lower_timer_slack()  # as the activation does for every real rank's main thread
    tensor = torch.ones(16)
    dist.all_reduce(tensor)  # the connection is made before the first timed iteration
    records = []
    for _ in range(NUM_ITERATIONS):
        clock.wait_until_ns(clock.now_ns() + HOST_WORK_NS[physical_rank])  # the re-simulation
        if agree:
            start = agreement.agree()
            agreed_ns, start_ns = start.start_ns, start.start_ns + start.late_ns
        else:
            agreed_ns = start_ns = clock.now_ns()
        clock.wait_until_ns(start_ns + COMPUTE_NS)
        dist.all_reduce(tensor)
        records.append((start_ns, clock.now_ns(), agreed_ns))
    with open(os.path.join(out_dir, f"{physical_rank}.json"), "w", encoding="utf-8") as f:
        json.dump(records, f)
    dist.destroy_process_group()


def _run(run_processes, tmp_path, agree: bool) -> tuple[list[int], list[float], list[tuple[int, int]]]:
    """Per iteration: |start skew| between the ranks (ns); iteration times of the rank with less host
    work (ns); the start each rank was given."""
    run_processes(_worker, 2, str(tmp_path), agree, timeout_s=120)
    records = [json.loads((tmp_path / f"{r}.json").read_text()) for r in range(2)]
    skews = [abs(a[0] - b[0]) for a, b in zip(*records, strict=True)]
    times = [end - start for start, end, _ in records[0]]
    agreed = [(a[2], b[2]) for a, b in zip(*records, strict=True)]
    return skews, times, agreed


def test_two_real_ranks_are_given_one_start(run_processes, tmp_path):
    _, _, agreed = _run(run_processes, tmp_path, agree=True)
    assert all(a == b for a, b in agreed), f"agreed starts {agreed}"


@pytest.mark.skipif(
    os.environ.get("PRISM_TIMING_TESTS") != "1",
    reason="timing bounds for a quiet machine (PRISM_TIMING_TESTS=1): under load the kernel wakes a rank "
    "milliseconds late",
)
def test_two_real_ranks_wake_within_100_us_and_no_iteration_holds_host_work(run_processes, tmp_path):
    """On a quiet 2-core VM most starts are a few us apart; the host still deschedules a rank for a few
    hundred us now and then (the store's server thread, gloo's and the test runner's share the two
    cores), so one start in eight may be later, never by a scheduler slice."""
    skews, times, _ = _run(run_processes, tmp_path, agree=True)
    load = f"(1-minute load average {os.getloadavg()[0]:.1f})"
    assert sum(skew < 100_000 for skew in skews) >= len(skews) - 1, f"start skews {skews} ns {load}"
    assert max(skews) < 1_000_000, f"start skews {skews} ns {load}"
    # 2 ms of compute and one small all-reduce; the 5 ms difference in host work is in none of them.
    difference_ns = HOST_WORK_NS[1] - HOST_WORK_NS[0]
    assert statistics.median(times) < COMPUTE_NS + difference_ns / 2, f"iteration times {times} ns"


def test_without_the_agreement_the_earlier_rank_carries_the_others_host_work(run_processes, tmp_path):
    """The control: the measurement above sees the skew when nothing removes it."""
    skews, times, _ = _run(run_processes, tmp_path, agree=False)
    difference_ns = HOST_WORK_NS[1] - HOST_WORK_NS[0]
    assert statistics.median(skews) > difference_ns / 2, f"start skews {skews} ns"
    assert statistics.median(times) > COMPUTE_NS + difference_ns / 2, f"iteration times {times} ns"


def test_the_agreement_refuses_a_rank_that_is_not_real():
    with pytest.raises(ValueError, match=r"virtual rank 5 is not one of the real ranks \[0, 1024\]"):
        StartAgreement(store=dist.HashStore(), real_ranks=REAL_RANKS, virtual_rank=5)


def test_a_single_rank_agrees_with_itself_at_its_ready_time_plus_the_margin():
    agreement = StartAgreement(store=dist.HashStore(), real_ranks=(7,), virtual_rank=7)
    first = agreement.agree()
    second = agreement.agree(matched=True)
    assert first.start_ns == first.ready_ns + first.margin_ns and first.number == 0
    assert second.number == 1 and second.margin_ns < first.margin_ns  # timed after the first exchange
    assert second.all_matched and not first.all_matched
    assert clock.now_ns() >= second.start_ns
