"""Context-parallel ring attention on a modelled GPU: the ring's exchanges as on a CPU, Transformer
Engine's kernels charged in place of the CPU's block-by-block maths."""

from __future__ import annotations

import pytest
import torch

from prism_megatron import gpu_model
from prism_megatron.gpu_model import fused
from prism_megatron.megatron.layers import attention_blocks, ring
from prism_megatron.megatron.run.modelled_device import ModelledDevice

CP, CHUNK, BATCH, HEADS, GROUPS, HEAD_DIM = 4, 64, 1, 8, 2, 32


def _ring(rank: int) -> ring.Ring:
    return ring.Ring(group=None, rank=rank, size=CP, next_rank=(rank + 1) % CP, prev_rank=(rank - 1) % CP,
                     batched=False)  # fmt: skip


def _run(rank: int, causal: bool, monkeypatch) -> tuple[list, list[torch.Tensor]]:
    """One forward and backward of this rank's ring (exchanges recorded, not sent): what it exchanged,
    and its output and gradients."""
    seen = []

    def recorded(the_ring, send, dst, recv, src):
        seen.append((dst, tuple(send.shape), src, tuple(recv.shape), send.dtype))
        return []

    monkeypatch.setattr(ring, "exchange", recorded)
    s = 2 * CHUNK
    q = torch.zeros(s, BATCH, HEADS, HEAD_DIM, dtype=torch.bfloat16, requires_grad=True)
    k, v = (
        torch.zeros(s, BATCH, GROUPS, HEAD_DIM, dtype=torch.bfloat16, requires_grad=True) for _ in range(2)
    )
    out = ring.RingAttention.apply(q, k, v, _ring(rank), 0.1, causal, 0.0, (0,) * CP)
    grads = torch.autograd.grad(out, (q, k, v), torch.ones_like(out))
    return seen, [out, *grads]


def _te_kernels(rank: int, causal: bool) -> tuple[list[tuple[int, int, bool, bool]], list[int]]:
    """Transformer Engine's kernels for one rank's ring, worked out from its step layout: the flash
    kernels (query rows, key rows, causal, backward) and the memory-bound kernels' bytes, in order."""
    s, half = 2 * CHUNK, CHUNK
    layout = []  # forward step i: (query rows, key rows, causal)
    for i in range(CP):
        if not causal:
            layout.append((s, s, False))
        elif i == 0:
            layout.append((s, s, True))
        elif i <= rank:
            layout.append((s, half, False))
        else:
            layout.append((half, s, False))
    lse, out = BATCH * HEADS * 4, BATCH * HEADS * HEAD_DIM * 2  # bytes per query row
    flash = [(rows, keys, mask, False) for rows, keys, mask in layout]
    memory = [lse * rows * (2 if i == 0 else 3) for i, (rows, _, _) in enumerate(layout)]
    memory += [out * rows * (2 if i == 0 else 3) + 2 * lse * rows for i, (rows, _, _) in enumerate(layout)]
    key_row = BATCH * GROUPS * HEAD_DIM * 2
    for i, (rows, keys, mask) in enumerate(reversed(layout)):
        flash.append((rows, keys, mask, True))
        moved = 2 if i == 0 else 3
        memory += [out * rows * moved, key_row * keys * moved, key_row * keys * moved]
    return flash, memory


@pytest.mark.parametrize("causal", [True, False])
@pytest.mark.parametrize("rank", [0, 1, CP - 1])
def test_a_modelled_ring_exchanges_as_on_a_cpu_and_charges_transformer_engines_kernels(
    rank, causal, monkeypatch
):
    cpu_exchanges, cpu_tensors = _run(rank, causal, monkeypatch)
    device = ModelledDevice("h100")
    flash, memory = [], []
    with device.active():
        block_kernel, memory_kernel = attention_blocks.block_kernel, attention_blocks.memory_kernel

        def flash_kernel(q_shape, k_shape, dtype, mask, *, backward):
            flash.append((q_shape[0], k_shape[0], mask.causal, backward))
            return block_kernel(q_shape, k_shape, dtype, mask, backward=backward)

        def memory_bound(num_bytes):
            memory.append(num_bytes)
            return memory_kernel(num_bytes)

        monkeypatch.setattr(attention_blocks, "block_kernel", flash_kernel)
        monkeypatch.setattr(attention_blocks, "memory_kernel", memory_bound)
        before = device.by_kind_ns()
        modelled_exchanges, modelled_tensors = _run(rank, causal, monkeypatch)
        after = device.by_kind_ns()
    # The same messages to the same peers, in the same order; the same outputs and gradients (shapes).
    assert modelled_exchanges == cpu_exchanges
    for fake, real in zip(modelled_tensors, cpu_tensors, strict=True):
        assert (fake.shape, fake.dtype) == (real.shape, real.dtype)
    # Transformer Engine's kernels, and the flash kernels' time is all the attention time charged.
    expected_flash, expected_memory = _te_kernels(rank, causal)
    assert flash == expected_flash
    assert memory == expected_memory
    attention = sum(
        gpu_model.attention_time(device.gpu, batch=BATCH, num_heads=HEADS, num_kv_heads=GROUPS, seq_q=rows,
                                 seq_kv=keys, head_dim=HEAD_DIM, causal=mask, dtype=torch.bfloat16,
                                 backward=backward)
        for rows, keys, mask, backward in expected_flash
    )  # fmt: skip
    assert after["attention"] - before.get("attention", 0) == attention
    assert after.get("gemm", 0) == before.get("gemm", 0)
    fused_memory = sum(fused.memory_kernel_time(device.gpu, num_bytes) for num_bytes in expected_memory)
    assert after["memory"] - before.get("memory", 0) >= fused_memory
