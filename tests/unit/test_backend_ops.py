"""The prism backend in one process at W=8192: every op, sync and async, follows the mirror policy.

This process is the only real rank, so every group has virtual members and every value is the
mirror policy's: a virtual member contributes exactly what this rank contributes.
"""

from __future__ import annotations

import warnings

import pytest
import torch
import torch.distributed as dist
import torch.distributed._functional_collectives as fc

from prism_megatron import backend, replay

WORLD = 8192
SELF = 5
TP = list(range(8))  # SELF is group rank 5 of this group


@pytest.fixture
def world():
    warnings.filterwarnings("ignore", category=FutureWarning)  # torch's renamed collectives
    activation = backend.activate(world_size=WORLD, virtual_rank=SELF, real_ranks=[SELF])
    yield activation
    backend.deactivate()


@pytest.fixture
def tp(world):
    return dist.new_group(TP)


def run(call, *, async_op):
    """Issue a collective sync or async; for async, wait on the returned work."""
    work = call(async_op)
    if async_op:
        assert work is not None
        work.wait()
        assert work.is_completed()


def test_activation_gives_a_world_of_w_ranks_with_this_virtual_rank(world):
    assert dist.is_initialized()
    assert dist.get_world_size() == WORLD
    assert dist.get_rank() == SELF
    assert backend.is_active()
    assert dist.get_backend() == "prism"


def test_deactivate_destroys_the_world_and_is_safe_twice():
    backend.activate(world_size=WORLD, virtual_rank=SELF, real_ranks=[SELF])
    backend.deactivate()
    backend.deactivate()
    assert not dist.is_initialized()
    assert not backend.is_active()
    assert "prism" not in dist.Backend.backend_list


def test_plain_and_explicit_new_group_are_prism_and_non_members_get_no_group(world):
    mine = dist.new_group([1, SELF, 9])
    explicit = dist.new_group([SELF, 77], backend="prism")
    other = dist.new_group([1, 2, 3])
    assert mine.size() == 3 and mine.rank() == 1
    assert dist.get_backend(mine) == "prism" and dist.get_backend(explicit) == "prism"
    assert other is dist.GroupMember.NON_GROUP_MEMBER


@pytest.mark.parametrize("async_op", [False, True])
@pytest.mark.parametrize(
    ("op", "value", "expected"),
    [
        (dist.ReduceOp.SUM, 3.0, 3.0 * WORLD),
        (dist.ReduceOp.AVG, 3.25, 3.25),
        (dist.ReduceOp.MAX, -2.0, -2.0),
        (dist.ReduceOp.MIN, 7.0, 7.0),
    ],
)
def test_all_reduce_on_the_world_mirrors_this_rank(world, op, value, expected, async_op):
    t = torch.full((5,), value)
    run(lambda a: dist.all_reduce(t, op=op, async_op=a), async_op=async_op)
    assert torch.equal(t, torch.full((5,), expected))


def test_all_reduce_product_and_bitwise_ops_repeat_the_local_value_n_times(world):
    group = dist.new_group([SELF, 6, 7])  # n = 3
    t = torch.tensor([2.0, -1.0])
    dist.all_reduce(t, op=dist.ReduceOp.PRODUCT, group=group)
    assert torch.equal(t, torch.tensor([8.0, -1.0]))
    x = torch.tensor([6, 5])
    dist.all_reduce(x, op=dist.ReduceOp.BXOR, group=group)  # odd count: unchanged
    assert torch.equal(x, torch.tensor([6, 5]))
    y = torch.tensor([6, 5])
    dist.all_reduce(y, op=dist.ReduceOp.BXOR, group=dist.new_group([SELF, 6]))  # even: zero
    assert torch.equal(y, torch.tensor([0, 0]))
    z = torch.tensor([6, 5])
    dist.all_reduce(z, op=dist.ReduceOp.BOR, group=group)
    assert torch.equal(z, torch.tensor([6, 5]))


def test_all_reduce_coalesced_and_coalescing_manager(world, tp):
    a, b = torch.ones(3), torch.full((2,), 2.0)
    dist.all_reduce_coalesced([a, b], group=tp)
    assert torch.equal(a, torch.full((3,), 8.0)) and torch.equal(b, torch.full((2,), 16.0))
    c, d = torch.ones(4), torch.ones(1)
    with dist._coalescing_manager(group=tp, async_ops=True) as cm:
        dist.all_reduce(c, group=tp)
        dist.all_reduce(d, group=tp)
    cm.wait()
    assert torch.equal(c, torch.full((4,), 8.0)) and torch.equal(d, torch.full((1,), 8.0))


@pytest.mark.parametrize("async_op", [False, True])
def test_broadcast_from_self_keeps_data_and_from_a_virtual_root_gives_zeros(world, tp, async_op):
    own = torch.arange(4.0)
    run(lambda a: dist.broadcast(own, src=SELF, group=tp, async_op=a), async_op=async_op)
    assert torch.equal(own, torch.arange(4.0))
    received = torch.full((4,), float("nan"))  # stands for torch.empty's garbage
    run(lambda a: dist.broadcast(received, src=0, group=tp, async_op=a), async_op=async_op)
    assert torch.equal(received, torch.zeros(4))


def test_broadcast_from_a_virtual_root_of_this_ranks_role_keeps_this_ranks_data():
    roles = [r % 8 for r in range(WORLD)]  # rank r has role r mod 8, like a TP rank
    backend.activate(world_size=WORLD, virtual_rank=SELF, real_ranks=[SELF], roles=roles)
    try:
        dp = dist.new_group(list(range(SELF, WORLD, 8)))  # every member has this rank's role
        t = torch.arange(3.0)
        dist.broadcast(t, src=SELF + 8, group=dp)
        assert torch.equal(t, torch.arange(3.0))
        tp = dist.new_group(TP)  # the root (rank 0) has a role no real member holds
        u = torch.arange(3.0)
        dist.broadcast(u, src=0, group=tp)
        assert torch.equal(u, torch.zeros(3))
    finally:
        backend.deactivate()


@pytest.mark.parametrize("async_op", [False, True])
def test_all_gather_copies_the_input_into_every_slot(world, tp, async_op):
    x = torch.tensor([1.0, 2.0])
    slots = [torch.empty(2) for _ in TP]
    run(lambda a: dist.all_gather(slots, x, group=tp, async_op=a), async_op=async_op)
    assert all(torch.equal(s, x) for s in slots)
    flat = torch.empty(16)
    run(lambda a: dist.all_gather_into_tensor(flat, x, group=tp, async_op=a), async_op=async_op)
    assert torch.equal(flat, x.repeat(8))
    stacked = torch.empty(8, 2)
    run(lambda a: dist.all_gather_into_tensor(stacked, x, group=tp, async_op=a), async_op=async_op)
    assert torch.equal(stacked, x.expand(8, 2))


@pytest.mark.parametrize("async_op", [False, True])
def test_in_place_all_gather_keeps_the_virtual_members_slots(world, tp, async_op):
    # The distributed optimizer gathers updated parameter shards in place: every slot is a
    # different slice of the model, so a virtual member's slot keeps its values instead of
    # receiving a copy of this rank's shard.
    buffer = torch.arange(16.0)
    before = buffer.clone()
    mine = buffer[10:12]  # this rank is group rank 5: slot 5
    mine.copy_(torch.tensor([-1.0, -2.0]))
    run(lambda a: dist.all_gather_into_tensor(buffer, mine, group=tp, async_op=a), async_op=async_op)
    expected = before.clone()
    expected[10:12] = torch.tensor([-1.0, -2.0])
    assert torch.equal(buffer, expected)


def test_all_gather_into_another_buffer_still_copies_even_from_a_slice_of_it(world, tp):
    # Only this rank's own slot counts as in place; a slice elsewhere is an ordinary input.
    buffer = torch.arange(16.0)
    source = buffer[0:2].clone()
    run(lambda a: dist.all_gather_into_tensor(buffer, buffer[0:2], group=tp, async_op=a), async_op=False)
    assert torch.equal(buffer, source.repeat(8))


def test_all_gather_coalesced_through_the_coalescing_manager(world, tp):
    x, y = torch.tensor([1.0]), torch.tensor([2.0, 3.0])
    ox, oy = torch.empty(8), torch.empty(16)
    with dist._coalescing_manager(group=tp, async_ops=True) as cm:
        dist.all_gather_into_tensor(ox, x, group=tp)
        dist.all_gather_into_tensor(oy, y, group=tp)
    cm.wait()
    assert torch.equal(ox, x.repeat(8)) and torch.equal(oy, y.repeat(8))


@pytest.mark.parametrize("async_op", [False, True])
def test_reduce_scatter_gives_n_times_the_local_chunk(world, tp, async_op):
    data = torch.arange(16.0)
    out = torch.empty(2)
    run(lambda a: dist.reduce_scatter_tensor(out, data, group=tp, async_op=a), async_op=async_op)
    assert torch.equal(out, 8 * data[10:12])  # this rank is group rank 5: chunk 5
    avg = torch.empty(2)
    run(
        lambda a: dist.reduce_scatter_tensor(avg, data, op=dist.ReduceOp.AVG, group=tp, async_op=a),
        async_op=async_op,
    )
    assert torch.equal(avg, data[10:12])
    pieces = [torch.full((3,), float(i)) for i in TP]
    listed = torch.empty(3)
    run(lambda a: dist.reduce_scatter(listed, pieces, group=tp, async_op=a), async_op=async_op)
    assert torch.equal(listed, torch.full((3,), 40.0))


def test_reduce_scatter_coalesced_through_the_coalescing_manager(world, tp):
    a, b = torch.arange(8.0), torch.arange(16.0)
    oa, ob = torch.empty(1), torch.empty(2)
    with dist._coalescing_manager(group=tp, async_ops=True) as cm:
        dist.reduce_scatter_tensor(oa, a, group=tp)
        dist.reduce_scatter_tensor(ob, b, group=tp)
    cm.wait()
    assert torch.equal(oa, torch.tensor([40.0])) and torch.equal(ob, 8 * b[10:12])


@pytest.mark.parametrize("async_op", [False, True])
def test_all_to_all_returns_the_local_block_addressed_to_each_member(world, tp, async_op):
    data = torch.arange(16.0)
    out = torch.empty(16)
    run(lambda a: dist.all_to_all_single(out, data, group=tp, async_op=a), async_op=async_op)
    assert torch.equal(out, data)
    in_splits = [1, 2, 0, 1, 3, 2, 1, 1]  # 11 rows
    out_splits = [1, 2, 1, 1, 3, 4, 0, 1]  # block 2: local block empty -> zeros; block 5 repeats
    rows = torch.arange(11.0).unsqueeze(1).repeat(1, 2)
    got = torch.empty(13, 2)
    run(
        lambda a: dist.all_to_all_single(got, rows, out_splits, in_splits, group=tp, async_op=a),
        async_op=async_op,
    )
    expected = torch.cat(
        [rows[0:1], rows[1:3], torch.zeros(1, 2), rows[3:4], rows[4:7], rows[7:9].repeat(2, 1), rows[10:11]]
    )
    assert torch.equal(got, expected)
    outs = [torch.empty(2) for _ in TP]
    ins = [torch.full((2,), float(i)) for i in TP]
    run(lambda a: dist.all_to_all(outs, ins, group=tp, async_op=a), async_op=async_op)
    assert all(torch.equal(o, i) for o, i in zip(outs, ins, strict=True))


def test_gather_scatter_and_reduce(world, tp):
    x = torch.tensor([4.0, 5.0])
    gathered = [torch.empty(2) for _ in TP]
    dist.gather(x, gathered, dst=SELF, group=tp)
    assert all(torch.equal(g, x) for g in gathered)
    dist.gather(x, None, dst=0, group=tp)  # a virtual root: nothing to check here but no hang
    out = torch.full((2,), float("nan"))
    dist.scatter(out, [torch.full((2,), float(i)) for i in TP], src=SELF, group=tp)
    assert torch.equal(out, torch.full((2,), 5.0))
    dist.scatter(out, None, src=0, group=tp)
    assert torch.equal(out, torch.zeros(2))
    r = torch.ones(3)
    dist.reduce(r, dst=SELF, group=tp)
    assert torch.equal(r, torch.full((3,), 8.0))
    s = torch.ones(3)
    dist.reduce(s, dst=0, group=tp)
    assert torch.equal(s, torch.ones(3))  # a non-root's buffer is left as it was


def test_barrier_sync_and_async(world, tp):
    dist.barrier()
    dist.barrier(group=tp, async_op=True).wait()


def test_send_recv_with_a_virtual_peer(world):
    dist.send(torch.ones(3), dst=6)
    buf = torch.full((3,), float("nan"), requires_grad=True)  # Megatron's recv buffers need grad
    dist.recv(buf, src=6)
    assert torch.equal(buf.detach(), torch.zeros(3))
    out, back = torch.ones(2), torch.full((2,), float("nan"))
    works = dist.batch_isend_irecv([dist.P2POp(dist.isend, out, 6), dist.P2POp(dist.irecv, back, 4)])
    for work in works:
        work.wait()
    assert torch.equal(back, torch.zeros(2))


def test_functional_collectives(world, tp):
    x = torch.arange(4.0)
    assert torch.equal(fc.all_reduce(x, "sum", tp).wait(), 8 * x)
    assert torch.equal(fc.all_gather_tensor(x, 0, tp).wait(), x.repeat(8))
    assert torch.equal(
        fc.reduce_scatter_tensor(torch.arange(16.0), "sum", 0, tp).wait(), 8 * torch.arange(10.0, 12.0)
    )
    assert torch.equal(fc.all_to_all_single(torch.arange(8.0), None, None, tp).wait(), torch.arange(8.0))
    assert torch.equal(fc.broadcast(x, 0, tp).wait(), torch.zeros(4))


def test_coalesced_functional_collectives(world, tp):
    x, y = torch.arange(2.0), torch.arange(3.0)
    summed = fc.all_reduce_coalesced([x, y], "sum", tp)
    assert torch.equal(summed[0], 8 * x) and torch.equal(summed[1], 8 * y)
    gathered = fc.all_gather_into_tensor_coalesced([x, y], tp)
    assert torch.equal(gathered[0], x.repeat(8)) and torch.equal(gathered[1], y.repeat(8))
    scattered = fc.reduce_scatter_tensor_coalesced([torch.arange(8.0), torch.arange(16.0)], "sum", [0, 0], tp)
    assert torch.equal(scattered[0], torch.tensor([40.0])) and torch.equal(
        scattered[1], 8 * torch.arange(10.0, 12.0)
    )


def test_unsupported_requests_raise_at_issue_with_what_is_valid(world, tp):
    with pytest.raises(RuntimeError, match="SUM, AVG, PRODUCT"):
        dist.all_reduce(torch.ones(2), op=dist._make_nccl_premul_sum(2.0), group=tp)
    with pytest.raises(RuntimeError, match="name the source rank"):
        dist.recv(torch.ones(2))


def test_every_op_is_logged_with_a_per_group_sequence_number(world, tp):
    replay.start_recording()
    dist.all_reduce(torch.ones(2), group=tp)
    dist.all_reduce(torch.ones(2))
    dist.broadcast(torch.ones(3), src=SELF, group=tp, async_op=True).wait()
    events = replay.stop_recording()
    assert [(e.kind, len(e.group), e.seq) for e in events] == [
        (replay.OpKind.ALL_REDUCE, 8, 0),
        (replay.OpKind.ALL_REDUCE, WORLD, 0),
        (replay.OpKind.BROADCAST, 8, 1),
    ]
    assert events[0].group == tuple(TP) and events[2].async_op and not events[0].async_op
    assert all(e.has_virtual and e.issue_ns <= e.start_ns <= e.complete_ns for e in events)
    dump = replay.flight_recorder_dump()
    assert "BROADCAST" in dump and "seq=1" in dump and "virtual rank 5" in dump
