"""The rank watchdog, one look at a time: a rank that stops moving is found within its timeout, says
where it was and leaves its stacks and flight recorder; progress of any kind keeps it quiet; a
peer's verdict makes every other rank leave its own stacks. (The end-to-end hang is in
tests/megatron/test_faults.py.)"""

from __future__ import annotations

import json
import os
import threading
import time

import pytest

from prism_megatron.passes import watchdog
from prism_megatron.passes.watchdog import RankWatchdog, Verdict

TIMEOUT_S = 20.0


def make(tmp_path, **kwargs) -> RankWatchdog:
    defaults = dict(
        out_dir=str(tmp_path), timeout_s=TIMEOUT_S, phase="capture", physical_rank=1, virtual_rank=8
    )
    return RankWatchdog(**{**defaults, **kwargs})


def stalled_at(dog: RankWatchdog, start_s: float, seconds: float) -> None:
    """Look at the rank every poll for `seconds` from `start_s` (nothing moves in between)."""
    now = start_s
    while now <= start_s + seconds:
        dog.look(now)
        now += dog.poll_s


def looked_at_while_the_main_thread_waits(dog: RankWatchdog, start_s: float, seconds: float) -> None:
    """As in a rank: the looks on a thread of their own while the main thread is stuck here."""
    looks = threading.Thread(target=stalled_at, args=(dog, start_s, seconds))
    looks.start()
    looks.join()


def test_a_rank_that_does_not_move_for_the_timeout_is_hung_and_says_where(tmp_path):
    dog = make(tmp_path)
    start = time.monotonic()
    stalled_at(dog, start, TIMEOUT_S - 2 * dog.poll_s)
    assert dog.hung_at_s is None, "not before the timeout"
    looked_at_while_the_main_thread_waits(dog, start + TIMEOUT_S - dog.poll_s, dog.poll_s)
    assert dog.hung_at_s is not None, "by the timeout, never after it"
    with open(tmp_path / "watchdog" / "rank-00008.hung.json", encoding="utf-8") as f:
        verdict = Verdict(**json.load(f))
    assert verdict.virtual_rank == 8 and verdict.physical_rank == 1 and verdict.phase == "capture"
    assert TIMEOUT_S - 1 <= verdict.stalled_s <= TIMEOUT_S + 1
    assert verdict.stage == "before its first iteration"
    assert verdict.where.startswith("threading.py:"), verdict.where
    assert verdict.where.endswith("in looked_at_while_the_main_thread_waits"), "the innermost frame of ours"
    stacks = (tmp_path / "watchdog" / "rank-00008.stacks.txt").read_text()
    assert "in looked_at_while_the_main_thread_waits" in stacks and "in stalled_at" in stacks, "every thread"
    assert (
        (tmp_path / "watchdog" / "rank-00008.flight-recorder.txt")
        .read_text()
        .startswith("prism flight recorder")
    )


def test_progress_of_any_kind_postpones_the_verdict(tmp_path):
    dog = make(tmp_path)
    start = time.monotonic()
    dog.look(start)
    for event in ("begin", "beat", "end"):
        time.sleep(0.01)
        dog.note(event)  # now, on the real clock: the stall counts from here
        stalled_at(dog, time.monotonic(), TIMEOUT_S - 2 * dog.poll_s)
        assert dog.hung_at_s is None, event
    assert (dog.iterations_begun, dog.iterations_ended, dog.beats) == (1, 1, 1)
    assert dog.verdict(1.0).stage == "after iteration 1"
    dog.note("begin")
    assert dog.verdict(1.0).stage == "in iteration 2"
    assert not os.path.exists(tmp_path / "watchdog")


def test_a_peers_verdict_makes_the_others_leave_their_stacks_too(tmp_path):
    hung, peer = make(tmp_path, virtual_rank=0, physical_rank=0), make(tmp_path)
    start = time.monotonic()
    stalled_at(hung, start, TIMEOUT_S)
    peer.note("begin")
    peer.look(time.monotonic())
    assert peer.dumped and peer.hung_at_s is None
    assert sorted(os.listdir(tmp_path / "watchdog")) == [
        "rank-00000.flight-recorder.txt", "rank-00000.hung.json", "rank-00000.stacks.txt",
        "rank-00008.flight-recorder.txt", "rank-00008.stacks.txt",
    ]  # fmt: skip
    assert watchdog.num_dumped(str(tmp_path)) == 2
    assert [v.virtual_rank for v in watchdog.verdicts(str(tmp_path))] == [0]


def test_verdicts_come_first_stalled_first(tmp_path):
    early, late = make(tmp_path, virtual_rank=8), make(tmp_path, virtual_rank=0, physical_rank=0)
    start = time.monotonic()
    stalled_at(early, start, TIMEOUT_S)
    late.note("begin")
    late.dumped = True  # it has seen the first verdict already
    stalled_at(late, time.monotonic(), TIMEOUT_S)
    assert [v.virtual_rank for v in watchdog.verdicts(str(tmp_path))] == [8, 0]


def test_a_process_whose_launcher_is_gone_says_so(tmp_path):
    dog = make(tmp_path, launcher_pid=os.getppid() + 1)
    assert "launcher" in dog._gone()
    assert make(tmp_path, launcher_pid=os.getppid())._gone() is None
    assert make(tmp_path, orchestrator_pid=os.getpid())._gone() is None


def test_the_last_op_is_the_newest_line_of_a_flight_recorder_dump():
    dump = (
        "prism flight recorder of virtual rank 3: last 2 of 9 ops, oldest first\n"
        "  #7 ALL_REDUCE on group 1 [0, 3] seq=2 bytes=8 dtype=Float sync all-real completed\n"
        "  #8 BROADCAST on group 1 [0, 3] seq=3 bytes=8 dtype=Float sync virtual-members pending\n"
    )
    assert watchdog.last_op(dump).startswith("#8 BROADCAST on group 1")
    assert watchdog.last_op("prism flight recorder of virtual rank 3: last 0 of 0 ops\n") is None


@pytest.mark.parametrize(
    "spec, physical, virtual", [("0,8", 1, 8), ("8,0", 0, 0), ("pp=0,1;tp=0", 0, None), (None, 0, None)]
)
def test_the_virtual_rank_is_known_early_when_the_ranks_are_a_plain_list(spec, physical, virtual):
    assert watchdog._listed_rank(spec, physical) == virtual
