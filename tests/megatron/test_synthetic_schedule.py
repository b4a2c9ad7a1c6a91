"""The synthetic interleaved schedule is megatron-core's: its warm-up count and its schedule table.

megatron-core's `get_pp_rank_microbatches` and `get_schedule_table` run on CPU without a process
group (the communicator only answers the pipeline size and rank), so the order each stage runs is
built here from megatron-core's own numbers: forwards k < warm-up first, then one forward and one
backward at a time, then the remaining backwards; the k-th backward runs the mirror chunk of the
table's k-th entry on the oldest microbatch that chunk has not yet run backward (its FIFO of
activations).
"""

from __future__ import annotations

import types

import pytest

from prism_megatron.sim.synthetic import schedule_order

schedules = pytest.importorskip("megatron.core.pipeline_parallel.schedules")


def _communicator(pp: int, stage: int, vpp: int):
    group = types.SimpleNamespace(size=lambda: pp, rank=lambda: stage)
    return types.SimpleNamespace(pp_group=group, virtual_pipeline_model_parallel_size=vpp)


def megatron_order(stage: int, pp: int, m: int, vpp: int) -> list[tuple[str, int, int]]:
    total, _, warmup, _ = schedules.get_pp_rank_microbatches(
        m, vpp, pp, p2p_communicator=_communicator(pp, stage, vpp)
    )
    table = schedules.get_schedule_table(m, vpp, pp)
    backward_done = [0] * vpp
    forwards_of_chunk: list[list[int]] = [[] for _ in range(vpp)]

    def forward(k):
        microbatch, chunk = table[k]
        forwards_of_chunk[chunk].append(microbatch)
        return "F", chunk, microbatch

    def backward(k):
        chunk = vpp - 1 - table[k][1]
        microbatch = forwards_of_chunk[chunk][backward_done[chunk]]
        backward_done[chunk] += 1
        return "B", chunk, microbatch

    order = [forward(k) for k in range(warmup)]
    for i in range(total - warmup):
        order += [forward(warmup + i), backward(i)]
    return order + [backward(k) for k in range(total - warmup, total)]


@pytest.mark.parametrize("pp", [2, 4, 8])
@pytest.mark.parametrize("microbatches_per_stage", [1, 2])
@pytest.mark.parametrize("vpp", [2, 3])
def test_interleaved_order_is_megatron_cores_on_every_stage(pp, microbatches_per_stage, vpp):
    m = pp * microbatches_per_stage
    for stage in range(pp):
        assert schedule_order(stage, pp, m, vpp) == megatron_order(stage, pp, m, vpp), (pp, m, vpp, stage)


@pytest.mark.parametrize("pp", [2, 4, 8])
def test_with_as_many_microbatches_as_stages_only_the_first_half_warms_up_fully(pp):
    full = [
        stage
        for stage in range(pp)
        if [kind for kind, _, _ in schedule_order(stage, pp, pp, 2)][: 2 * pp] == ["F"] * (2 * pp)
    ]
    assert full == list(range(pp // 2))
