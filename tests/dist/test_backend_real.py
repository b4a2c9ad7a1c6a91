"""The prism backend across real processes (gloo): exact all-real groups, mirror-policy mixed groups.

Each test spawns real processes that each activate one virtual rank of a large world; the other
ranks are virtual. Workers assert; a failing assertion in any process fails the test.
"""

from __future__ import annotations

import datetime
import os
import warnings

import torch
import torch.distributed as dist

from prism_megatron import backend

TIMEOUT = datetime.timedelta(seconds=60)


def _quiet():
    warnings.filterwarnings("ignore", category=FutureWarning)


def _shared_store(physical_rank: int, num_processes: int) -> dist.Store:
    return dist.TCPStore(
        os.environ["MASTER_ADDR"],
        int(os.environ["MASTER_PORT"]),
        world_size=num_processes,
        is_master=physical_rank == 0,
        timeout=TIMEOUT,
        wait_for_workers=False,
    )


def _data(seed: int, *shape: int) -> torch.Tensor:
    return torch.randn(*shape, generator=torch.Generator().manual_seed(seed))


def _check_all_real_group_matches_gloo(group: dist.ProcessGroup, gloo, me: int, n: int) -> None:
    """Every op on an all-real prism group gives bit for bit what gloo gives on the same data."""
    for op in (dist.ReduceOp.SUM, dist.ReduceOp.MAX, dist.ReduceOp.MIN, dist.ReduceOp.PRODUCT):
        ours, theirs = _data(me, 37), _data(me, 37)
        dist.all_reduce(ours, op=op, group=group)
        gloo.allreduce(
            [theirs], dist.AllreduceOptions() if op == dist.ReduceOp.SUM else _reduce_opts(op)
        ).wait()
        assert torch.equal(ours, theirs), op
    avg, summed = _data(me, 5), _data(me, 5)
    dist.all_reduce(avg, op=dist.ReduceOp.AVG, group=group)
    gloo.allreduce([summed]).wait()
    assert torch.equal(avg, summed / n)

    x = _data(100 + me, 3, 2)
    ours, theirs = torch.empty(n * 3, 2), torch.empty(n * 3, 2)
    dist.all_gather_into_tensor(ours, x, group=group)
    gloo._allgather_base(theirs, x).wait()
    assert torch.equal(ours, theirs)

    big = _data(200 + me, n * 4)
    ours, theirs = torch.empty(4), torch.empty(4)
    dist.reduce_scatter_tensor(ours, big, group=group)
    gloo._reduce_scatter_base(theirs, big).wait()
    assert torch.equal(ours, theirs)

    in_splits = [(me + j) % 3 + 1 for j in range(n)]
    out_splits = [(j + me) % 3 + 1 for j in range(n)]  # what member j sends me: (me + j) % 3 + 1
    rows = _data(300 + me, sum(in_splits), 2)
    ours, theirs = torch.empty(sum(out_splits), 2), torch.empty(sum(out_splits), 2)
    dist.all_to_all_single(ours, rows, out_splits, in_splits, group=group)
    gloo.alltoall_base(theirs, rows, out_splits, in_splits).wait()
    assert torch.equal(ours, theirs)

    root_data = _data(400, 6) if me == 2 else torch.zeros(6)
    dist.broadcast(root_data, src=dist.get_global_rank(group, 2), group=group)
    assert torch.equal(root_data, _data(400, 6))


def _reduce_opts(op):
    opts = dist.AllreduceOptions()
    opts.reduceOp = op
    return opts


def _four_real_processes(physical_rank: int, num_processes: int) -> None:
    _quiet()
    world, real = 8192, [0, 1, 2, 3]
    me = real[physical_rank]
    store = _shared_store(physical_rank, num_processes)
    backend.activate(
        world_size=world, virtual_rank=me, real_ranks=real, real_store=dist.PrefixStore("prism/", store)
    )
    gloo = dist.ProcessGroupGloo(dist.PrefixStore("reference/", store), physical_rank, num_processes, TIMEOUT)
    try:
        all_real = dist.new_group(real)
        _check_all_real_group_matches_gloo(all_real, gloo, me, len(real))

        # Mixed: TP group [0..7], real 0-3; virtual 4-7 mirror their nearest real member, rank 3.
        tp = dist.new_group(list(range(8)))
        t = torch.full((3,), float(me + 1))
        dist.all_reduce(t, group=tp)
        assert torch.equal(t, torch.full((3,), 1.0 + 2 + 3 + 5 * 4))
        slots = torch.empty(8)
        dist.all_gather_into_tensor(slots, torch.tensor([float(me)]), group=tp)
        assert torch.equal(slots, torch.tensor([0.0, 1, 2, 3, 3, 3, 3, 3]))

        # The world: 4 real of 8192; ranks 4..8191 mirror rank 3.
        w = torch.full((2,), float(me + 1))
        dist.all_reduce(w)
        assert torch.equal(w, torch.full((2,), 1.0 + 2 + 3 + 4 * (world - 3)))

        # p2p between real processes inside the world.
        if me % 2 == 0:
            dist.send(torch.full((4,), float(me)), dst=me + 1)
        else:
            got = torch.empty(4)
            dist.recv(got, src=me - 1)
            assert torch.equal(got, torch.full((4,), float(me - 1)))
    finally:
        backend.deactivate()


def test_four_real_processes_all_real_groups_match_gloo_and_mixed_groups_mirror(run_processes):
    run_processes(_four_real_processes, 4)


def _two_real_processes_mixed(physical_rank: int, num_processes: int) -> None:
    _quiet()
    world, real = 8192, [0, 1]
    me = real[physical_rank]
    backend.activate(world_size=world, virtual_rank=me, real_ranks=real)  # store from MASTER_ADDR/PORT
    try:
        tp = dist.new_group(list(range(8)))  # real 0, 1; virtual 2..7 mirror rank 1 (counts 1, 7)
        x = torch.tensor([1.0, 10.0]) * (me + 1)
        a = x.clone()
        dist.all_reduce(a, group=tp)
        assert torch.equal(a, torch.tensor([1.0, 10.0]) * (1 + 7 * 2))
        m = x.clone()
        dist.all_reduce(m, op=dist.ReduceOp.AVG, group=tp)
        assert torch.allclose(m, torch.tensor([1.0, 10.0]) * 15 / 8)
        mx = torch.tensor([float(10 - me)])
        dist.all_reduce(mx, op=dist.ReduceOp.MAX, group=tp)
        assert torch.equal(mx, torch.tensor([10.0]))

        gathered = [torch.empty(2) for _ in range(8)]
        dist.all_gather(gathered, x, group=tp)
        assert torch.equal(gathered[0], torch.tensor([1.0, 10.0]))
        assert all(torch.equal(g, torch.tensor([2.0, 20.0])) for g in gathered[1:])

        chunks = torch.arange(16.0) * (me + 1)  # member i's chunk: [2i, 2i+1] * (me + 1)
        out = torch.empty(2)
        dist.reduce_scatter_tensor(out, chunks, group=tp)
        assert torch.equal(out, torch.arange(2.0 * me, 2.0 * me + 2) * 15)
        # Sequence parallelism's [s, b, h] reduce-scatter: the real part keeps the output's rows.
        sequence = torch.arange(16.0 * 3).view(16, 1, 3) * (me + 1)
        rows = torch.empty(2, 1, 3)
        dist.reduce_scatter_tensor(rows, sequence, group=tp)
        assert torch.equal(rows, torch.arange(6.0 * me, 6.0 * me + 6).view(2, 1, 3) * 15)

        blocks = torch.arange(8.0) + 100 * me  # block j goes to member j
        received = torch.empty(8)
        dist.all_to_all_single(received, blocks, group=tp)
        other = 1 - me
        expected = blocks.clone()  # virtual members send back what this rank sends them
        expected[other] = me + 100 * other  # the real peer's block addressed to me
        assert torch.equal(received, expected)

        b = torch.full((3,), float(me + 1))
        dist.broadcast(b, src=1, group=tp)  # a real root
        assert torch.equal(b, torch.full((3,), 2.0))
        c = torch.full((3,), float("nan"))
        dist.broadcast(c, src=4, group=tp)  # a virtual root, no roles known: zeros everywhere
        assert torch.equal(c, torch.zeros(3))

        # Async ops complete in any waiting order, each with its own value.
        tensors = [torch.full((2,), float(i + 1)) for i in range(3)]
        works = [dist.all_reduce(t, group=tp, async_op=True) for t in tensors]
        for work in reversed(works):
            work.wait()
        assert all(torch.equal(t, torch.full((2,), float(i + 1) * 8)) for i, t in enumerate(tensors))

        lone = dist.new_group([me, 4096 + me])  # only this process is real here
        y = torch.ones(2)
        dist.all_reduce(y, group=lone)
        assert torch.equal(y, torch.full((2,), 2.0))
    finally:
        backend.deactivate()


def test_two_real_processes_mixed_groups_combine_real_and_virtual_contributions(run_processes):
    run_processes(_two_real_processes_mixed, 2)
