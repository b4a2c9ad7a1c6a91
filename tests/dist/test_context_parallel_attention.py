"""Context-parallel attention on CPU equals attention over the whole sequence, forward and backward.

Each CP rank holds the two chunks of Megatron's load-balanced split (rank r: chunks r and 2CP-1-r) of
the same random queries, keys and values; the reference is plain softmax attention over the whole
sequence in float64 with autograd. Every communication type (`p2p` with the batched exchange of CP 2
and the separate one of CP 3 and 4, `a2a`, `allgather`, and `a2a+p2p` as 2 x 2) must give each rank
the reference's output rows and the reference's gradients of its own rows of q, k and v. Grouped-query
attention (4 query heads, 2 key/value groups) and a value head wider than the query head (as
multi-latent attention has) are included, causal and not. The p2p exchange is also checked for
Transformer Engine's peers and message sizes.
"""

from __future__ import annotations

import pytest
import torch
import torch.distributed as dist

from prism_megatron.megatron.layers import chunks, ring
from prism_megatron.megatron.layers.all_gather import AllGatherAttention
from prism_megatron.megatron.layers.all_to_all import AllToAllAttention
from prism_megatron.megatron.layers.ring import Ring, RingAttention

CHUNK, BATCH, HEADS, GROUPS, HEAD_DIM = 3, 2, 4, 2, 8
TOLERANCE = dict(rtol=1e-4, atol=1e-5)


def reference(q, k, v, causal: bool):
    """Whole-sequence attention (float64), GQA groups repeated to the heads."""
    repeat = q.shape[2] // k.shape[2]
    k, v = k.repeat_interleave(repeat, dim=2), v.repeat_interleave(repeat, dim=2)
    scores = torch.einsum("qbnd,kbnd->bnqk", q, k) / q.shape[-1] ** 0.5
    if causal:
        s = scores.shape[-1]
        scores = scores.masked_fill(~torch.ones(s, s, dtype=torch.bool).tril(), float("-inf"))
    return torch.einsum("bnqk,kbnd->qbnd", scores.softmax(-1), v)


def local_rows(x: torch.Tensor, cp_rank: int, cp_size: int) -> torch.Tensor:
    """This CP rank's two chunks of a whole-sequence tensor."""
    pieces = x.chunk(2 * cp_size)
    return torch.cat([pieces[c] for c in chunks.local_chunks(cp_rank, cp_size)])


def _inputs(cp_size: int, value_dim: int):
    generator = torch.Generator().manual_seed(7)
    s = 2 * cp_size * CHUNK
    q = torch.randn(s, BATCH, HEADS, HEAD_DIM, generator=generator, dtype=torch.float64)
    k = torch.randn(s, BATCH, GROUPS, HEAD_DIM, generator=generator, dtype=torch.float64)
    v = torch.randn(s, BATCH, GROUPS, value_dim, generator=generator, dtype=torch.float64)
    weight = torch.randn(s, BATCH, HEADS, value_dim, generator=generator, dtype=torch.float64)
    return q, k, v, weight


def _run_local(comm: str, q, k, v, causal: bool):
    world, rank = dist.get_world_size(), dist.get_rank()
    scale = HEAD_DIM**-0.5
    everyone = list(range(world))
    if comm == "p2p":
        return RingAttention.apply(
            q, k, v, Ring.of(dist.group.WORLD, everyone), scale, causal, 0.0, (0,) * world
        )
    if comm == "a2a":
        return AllToAllAttention.apply(q, k, v, dist.group.WORLD, scale, causal, 0.0, 0)
    if comm == "allgather":
        return AllGatherAttention.apply(q, k, v, dist.group.WORLD, scale, causal, 0.0, (0, 0))
    a2a_groups = [dist.new_group([0, 1]), dist.new_group([2, 3])]  # every rank creates every group
    p2p_groups = [dist.new_group([0, 2]), dist.new_group([1, 3])]
    a2a, p2p = a2a_groups[rank // 2], p2p_groups[rank % 2]
    the_ring = Ring.of(p2p, everyone, stride=2, offset=rank % 2)
    return RingAttention.apply(q, k, v, the_ring, scale, causal, 0.0, (0, 0), a2a)


def _check(comm: str, cp_rank: int, cp_size: int, causal: bool, value_dim: int) -> None:
    q, k, v, weight = (x.requires_grad_() for x in _inputs(cp_size, value_dim))
    (reference(q, k, v, causal) * weight).sum().backward()
    mine = [local_rows(x.detach(), cp_rank, cp_size).float().requires_grad_() for x in (q, k, v)]
    out = _run_local(comm, *mine, causal)
    expected_out = local_rows(reference(q, k, v, causal).detach(), cp_rank, cp_size)
    case = f"{comm} CP {cp_size} causal={causal} value dim {value_dim}"
    torch.testing.assert_close(out.double(), expected_out, **TOLERANCE, msg=lambda m: f"{case}, output: {m}")
    (out * local_rows(weight, cp_rank, cp_size).float()).sum().backward()
    for name, full, local in zip("qkv", (q, k, v), mine, strict=True):
        expected = local_rows(full.grad, cp_rank, cp_size)
        torch.testing.assert_close(
            local.grad.double(), expected, **TOLERANCE, msg=lambda m, n=name: f"{case}, d{n}: {m}"
        )


def _worker(physical_rank, num_processes, cases):
    dist.init_process_group("gloo", rank=physical_rank, world_size=num_processes)
    try:
        for comm, causal, value_dim in cases:
            _check(comm, physical_rank, num_processes, causal, value_dim)
    finally:
        dist.destroy_process_group()


# CP size -> (comm type, causal, value head size); one set of processes per CP size (starting processes
# that import torch is the slow part).
CASES = {
    2: [("p2p", True, HEAD_DIM), ("p2p", False, HEAD_DIM), ("a2a", True, HEAD_DIM), ("a2a", False, HEAD_DIM),
        ("allgather", True, HEAD_DIM), ("allgather", False, HEAD_DIM)],
    3: [("p2p", True, HEAD_DIM), ("p2p", False, HEAD_DIM), ("allgather", True, HEAD_DIM)],
    4: [("p2p", True, 2 * HEAD_DIM), ("a2a+p2p", True, HEAD_DIM)],
}  # fmt: skip


@pytest.mark.parametrize("cp", sorted(CASES), ids=lambda cp: f"cp{cp}")
def test_every_comm_type_equals_whole_sequence_attention_forward_and_backward(run_processes, cp):
    run_processes(_worker, cp, CASES[cp], timeout_s=600)


def _record_exchanges(physical_rank, num_processes, log_path):
    """Run one ring attention and log every exchange (peers, element counts) of this rank."""
    dist.init_process_group("gloo", rank=physical_rank, world_size=num_processes)
    try:
        seen = []
        original = ring.exchange

        def logged(the_ring, send, dst, recv, src):
            seen.append((dst, send.numel(), src, recv.numel(), the_ring.batched))
            return original(the_ring, send, dst, recv, src)

        ring.exchange = logged
        q, k, v, _ = _inputs(num_processes, HEAD_DIM)
        mine = [local_rows(x, physical_rank, num_processes).float().requires_grad_() for x in (q, k, v)]
        the_ring = Ring.of(dist.group.WORLD, list(range(num_processes)))
        RingAttention.apply(*mine, the_ring, 0.3, True, 0.0, (0,) * num_processes).sum().backward()
        torch.save(seen, f"{log_path}.{physical_rank}")
    finally:
        dist.destroy_process_group()


@pytest.mark.parametrize("cp", [2, 4])
def test_the_ring_sends_what_transformer_engine_sends_to_the_same_peers(run_processes, tmp_path, cp):
    run_processes(_record_exchanges, cp, str(tmp_path / "log"), timeout_s=600)
    kv = 2 * (2 * CHUNK) * BATCH * GROUPS * HEAD_DIM  # this rank's k and v, flattened together
    for rank in range(cp):
        seen = torch.load(tmp_path / f"log.{rank}")
        forward, backward = seen[: cp - 1], seen[cp - 1 :]
        nxt, prev = (rank + 1) % cp, (rank - 1) % cp
        assert forward == [(nxt, kv, prev, kv, cp == 2)] * (cp - 1)
        middle = [(prev, 2 * kv, nxt, 2 * kv, cp == 2)] * (cp - 2)
        assert backward == [(prev, kv, nxt, kv, cp == 2), *middle, (prev, kv, nxt, kv, cp == 2)]
