"""Sequence parallelism, context parallelism and MoE with TP 2 on megatron-core's local layers, on CPU.

A tiny GPT (2 layers, hidden 64, sequence 32, dropout off) trains two iterations in real gloo
processes through the built-in entry, with each feature on and off where the maths says the two
must agree:
* sequence parallelism (TP 2) gives the losses and grad norms of the same TP 2 job without it, and
  issues what it issues on a GPU: the sequence all-gathers and reduce-scatters over TP instead of
  all-reduces, and one all-reduce per step of the sequence-parallel parameters' gradients (the norms
  and the row-parallel biases) that `finalize_model_grads` does only for marked parameters;
* context parallelism 2 (p2p ring) gives the losses and grad norms of one process over the whole
  sequence, with the ring's sends and receives;
* MoE with TP 2 (sequence parallelism, all-to-all dispatch; expert TP 2 and expert TP 1) gives the
  losses and grad norms of TP 1, all initialised whole (`--use-cpu-initialization`, so the weights do
  not depend on TP).
Then each job is emulated with rank 0 real and rank 1 virtual: its parameters, gradients and optimizer
state are the all-real rank 0's to the byte, and so is its peak with context parallelism; with TP 2
the all-real peak can be up to one tensor higher when gloo's threads keep it alive (see the test).
"""

from __future__ import annotations

import pytest
from launching import TINY_GPT, run_entry

from prism_megatron.megatron.entry import pretrain

pytestmark = pytest.mark.slow

CPU = (
    "--prism-device",
    "cpu",
    "--global-batch-size",
    "4",
    "--position-embedding-type",
    "rope",
    "--lr",
    "1e-3",
)
SP = ("--tensor-model-parallel-size", "2", "--sequence-parallel")
CP = ("--context-parallel-size", "2")
MOE = (
    "--num-experts", "4", "--moe-router-topk", "2", "--moe-ffn-hidden-size", "32", "--swiglu",
    "--normalization", "RMSNorm", "--disable-bias-linear", "--use-cpu-initialization",
)  # fmt: skip
MOE_TP2 = (*MOE, *SP, "--moe-token-dispatcher-type", "alltoall")
TIGHT = dict(rel=1e-5)

RUNS = {
    "sp": (2, SP),
    "no-sp": (2, ("--tensor-model-parallel-size", "2")),
    "cp2": (2, CP),
    "cp1": (1, ()),
    "moe-tp2": (2, MOE_TP2),
    "moe-tp2-etp1": (2, (*MOE_TP2, "--expert-tensor-parallel-size", "1")),
    "moe-tp1": (1, MOE),
}


@pytest.fixture(scope="module")
def real(tmp_path_factory):
    """Rank 0's results of each all-real run, run once for the module."""
    done: dict[str, dict] = {}

    def get(name: str) -> dict:
        if name not in done:
            nproc, flags = RUNS[name]
            done[name] = run_entry(tmp_path_factory.mktemp(name), nproc, *TINY_GPT, *CPU, *flags)[0]
        return done[name]

    return get


def losses(result: dict) -> list[float]:
    return [it["loss"] for it in result["iterations"]]


def grad_norms(result: dict) -> list[float]:
    return [it["grad_norm"] for it in result["iterations"]]


def op_counts(result: dict) -> dict[tuple[str, int], int]:
    """(collective, bytes) -> count, over the TP group (the 2-rank group) only."""
    groups = result["collectives"]["groups"]
    counts: dict[tuple[str, int], int] = {}
    for op, group, size in result["collectives"]["ops"]:
        if len(groups[group]) == 2:
            counts[(op, size)] = counts.get((op, size), 0) + 1
    return counts


def test_sequence_parallelism_computes_the_step_without_it_and_communicates_as_on_gpus(real):
    with_sp, without = real("sp"), real("no-sp")
    assert losses(with_sp) == pytest.approx(losses(without), **TIGHT)
    assert grad_norms(with_sp) == pytest.approx(grad_norms(without), **TIGHT)
    sp_ops, plain_ops = op_counts(with_sp), op_counts(without)
    hidden, layers = 64, 2
    # The norms (two per layer and the final one, weight and bias) and the row-parallel biases.
    marked_bytes = 4 * ((2 * layers + 1) * 2 * hidden + 2 * layers * hidden)
    assert sp_ops[("allreduce_", marked_bytes)] == 2  # once per iteration
    assert ("allreduce_", marked_bytes) not in plain_ops
    sequence_bytes = 4 * 32 * hidden  # [s, b, h] float32 activations, gathered and scattered over TP
    # SP replaces each TP all-reduce of activations by a reduce-scatter of the sequence and adds the
    # all-gathers before the column-parallel linears; everything else the step issues over TP (0.19
    # adds a few small all-gathers of its own, in both runs) stays as it is.
    changed = {key for key in sp_ops.keys() | plain_ops.keys() if sp_ops.get(key) != plain_ops.get(key)}
    assert changed == {
        ("allreduce_", marked_bytes),
        ("allreduce_", sequence_bytes),
        ("_allgather_base_", sequence_bytes),
        ("_reduce_scatter_base_", sequence_bytes),
    }
    assert ("allreduce_", sequence_bytes) not in sp_ops
    assert sp_ops[("_reduce_scatter_base_", sequence_bytes)] == plain_ops[("allreduce_", sequence_bytes)]
    assert sp_ops[("_allgather_base_", sequence_bytes)] > 0


def test_context_parallel_attention_computes_the_whole_sequence_step(real):
    cp2, cp1 = real("cp2"), real("cp1")
    assert losses(cp2) == pytest.approx(losses(cp1), **TIGHT)
    assert grad_norms(cp2) == pytest.approx(grad_norms(cp1), rel=1e-4)
    # The ring: per layer and microbatch CP - 1 exchanges forward and CP backward (2 iterations of 4).
    exchanges = 2 * 4 * 2 * (1 + 2)
    assert cp2["collectives"]["p2p_counts"] == {"send": exchanges, "recv_": exchanges}


@pytest.mark.parametrize("name", ["moe-tp2", "moe-tp2-etp1"])
def test_moe_with_tensor_parallelism_computes_the_tp1_step(real, name):
    tp2, tp1 = real(name), real("moe-tp1")
    # Float tolerance: routing is the same, the expert GEMMs split and sum in another order (the
    # second step's grad norm, after an Adam step at lr 1e-3, differs by 1e-4 with expert TP 1).
    assert losses(tp2) == pytest.approx(losses(tp1), rel=1e-4)
    assert grad_norms(tp2) == pytest.approx(grad_norms(tp1), rel=5e-4)


@pytest.mark.parametrize("name", ["sp", "cp2", "moe-tp2"])
def test_one_real_rank_among_virtual_ones_allocates_what_the_all_real_rank_does(real, tmp_path, name):
    _, flags = RUNS[name]
    emulation = ("--prism-emulate", "--prism-world-size", "2", "--prism-ranks", "0")
    emulated = pretrain.run([*TINY_GPT, *CPU, *flags, *emulation, "--prism-out", str(tmp_path)])
    all_real = real(name)
    assert emulated["backend"] == "prism" and all_real["backend"] == "gloo"
    for category in ("parameters", "gradients", "optimizer_state"):
        assert emulated["memory"]["at_peak_bytes"][category] == all_real["memory"]["at_peak_bytes"][category]
    # gloo's reduce-scatter clones its input and splits the clone when the program waits; the
    # tracker no longer counts such a backend buffer (a view of a storage no tracked op made), so
    # the peaks are equal to the byte in most runs. What is left: gloo's worker threads drop their
    # references to a finished op's tensors at a moment of their own, which now and then keeps
    # one alive across the peak of an all-real run (5200 B above the emulated rank in 1 of 3 SP
    # runs); at most one [s, b, h] float32 tensor (8 KiB here). Context parallelism allocates none.
    allowance = 0 if name == "cp2" else 4 * 32 * 64
    assert 0 <= all_real["memory"]["peak_bytes"] - emulated["memory"]["peak_bytes"] <= allowance
