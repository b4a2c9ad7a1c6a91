"""GEMM time by shape: output tiles, waves over the SMs, a per-tile fixed cost, and a memory roof.

A cuBLAS-class GEMM splits C (m x n, per batch) into output tiles; each SM computes one tile at a
time, looping over k. So, in ns:

    tiles   = ceil(m / Tm) * ceil(n / Tn) * batch
    waves   = ceil(tiles / num_sms)                            (wave quantisation)
    compute = waves * 2 * Tm * Tn * (k + k0) / r_sm            (tile quantisation, short-k cost)
    memory  = (m*k + k*n + m*n) * batch * elem_size / (hbm_bw * hbm_efficiency)
    time    = max(fixed + max(compute, memory), 2*m*n*k*batch / MAMF)

Tm x Tn is 128 x 256 in either orientation (the tile Hopper and Blackwell CUTLASS/cuBLAS kernels
use for large BF16 problems); a problem too small to fill one wave with it may use 128 x 128. `k0`
is the tile's prologue and epilogue (pipeline fill, writing C) in units of k, and r_sm the per-SM
throughput inside the k loop. A problem with fewer tiles than SMs may split k over idle SMs
(split-k, as cuBLAS does) and pay for the FP32 partial sums. Small m shows up as a wasted tile row and, for very small m, as the
memory roof (the weight must still be read once).

The three unknowns r_sm, k0 and `fixed` (launch, set-up and drain of one GEMM) are not chosen: they
are solved so that the formula reproduces three published kernel measurements (constants.py): the
MAMF (best measured matmul throughput) at the shape it was measured at, a large short-k GEMM and the
smallest GEMM of OpenXLA's measured table. The MAMF is also a ceiling: it is the best throughput of
a brute-force search over shapes, so no shape is charged less than 2 m n k / MAMF (shapes whose
tiles fill the SMs exactly would otherwise beat it). FP16 runs at the BF16 rate;
FP32 is charged at TF32 (BF16 rate x TF32/BF16 peak), an assumption: it holds where TF32 matmuls
are allowed, and Megatron's FP32 work is mostly memory-bound anyway; FP8's r_sm is solved from the
FP8 MAMF at its own shape.
"""

from __future__ import annotations

import dataclasses
import functools
import math

import torch

from prism_megatron.gpu_model.specs import GpuSpec

LARGE_TILES = ((128, 256), (256, 128))
SMALL_TILE = (128, 128)
FP32_BYTES = 4

FP8_DTYPES = frozenset(
    getattr(torch, name)
    for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, name)
)


@dataclasses.dataclass(frozen=True, kw_only=True)
class GemmCalibration:
    """What the anchor measurements fix for one GPU."""

    bf16_flops_per_sm_s: float
    """r_sm: FLOP/s one SM sustains inside the k loop of a large BF16 tile."""
    k_overhead: float
    """k0: a tile's fixed cost, in units of k."""
    fixed_ns: float
    """A GEMM's fixed cost (launch, setup, the last tile's drain), in ns."""


def _tile(gpu: GpuSpec, m: int, n: int, batch: int) -> tuple[int, int, int]:
    """(Tm, Tn, waves) with the least tile work, as a heuristic-driven GEMM library picks."""
    best = None
    for tm, tn in LARGE_TILES:
        tiles = math.ceil(m / tm) * math.ceil(n / tn) * batch
        waves = math.ceil(tiles / gpu.num_sms)
        work = waves * tm * tn
        if best is None or work < best[0]:
            best = (work, tm, tn, waves, tiles)
    if best[4] < gpu.num_sms:
        tm, tn = SMALL_TILE
        tiles = math.ceil(m / tm) * math.ceil(n / tn) * batch
        waves = math.ceil(tiles / gpu.num_sms)
        if waves * tm * tn < best[0]:
            return tm, tn, waves
    return best[1], best[2], best[3]


def _work(gpu: GpuSpec, m: int, n: int, k: int) -> tuple[float, float]:
    """(c * k, c) with c = 2 * Tm * Tn * waves: the formula's time is fixed + (c*k + c*k0) / r_sm."""
    tm, tn, waves = _tile(gpu, m, n, 1)
    c = 2 * tm * tn * waves
    return c * k, c


def _solve3(rows: list[tuple[float, float, float]], rhs: list[float]) -> tuple[float, float, float]:
    """Cramer's rule for three linear equations (the calibration's, well conditioned by design)."""

    def det(a):
        return (
            a[0][0] * (a[1][1] * a[2][2] - a[1][2] * a[2][1])
            - a[0][1] * (a[1][0] * a[2][2] - a[1][2] * a[2][0])
            + a[0][2] * (a[1][0] * a[2][1] - a[1][1] * a[2][0])
        )

    d = det(rows)
    out = []
    for col in range(3):
        replaced = [list(r) for r in rows]
        for i in range(3):
            replaced[i][col] = rhs[i]
        out.append(det(replaced) / d)
    return out[0], out[1], out[2]


@functools.cache
def calibration(gpu: GpuSpec) -> GemmCalibration:
    """Solve fixed_ns, r_sm and k0 from the anchor measurements.

    Each anchor (m, n, k, measured t) gives one linear equation in (fixed_ns, 1/r_sm, k0/r_sm):
    t = fixed_ns + c*k * (1/r_sm) + c * (k0/r_sm). The MAMF shape, a large short-k GEMM and the
    smallest measured GEMM give three. A GPU without a short-k measurement reuses H100's k0 and
    solves the other two from its own MAMF and smallest GEMM; one without either (A100) reuses
    H100's k0 and fixed cost and solves r_sm from its MAMF alone.
    """
    mamf_shape = (gpu.mamf_bf16_m, gpu.mamf_bf16_n, gpu.mamf_bf16_k)
    t_mamf = 2 * math.prod(mamf_shape) / gpu.mamf_bf16_flops_per_s * 1e9
    a_mamf = _work(gpu, *mamf_shape)
    small_shape = (gpu.gemm_anchor_m, gpu.gemm_anchor_n, gpu.gemm_anchor_k)
    if gpu.gemm_short_k_flops_per_s > 0:
        short_shape = (gpu.gemm_short_k_m, gpu.gemm_short_k_n, gpu.gemm_short_k_k)
        t_short = 2 * math.prod(short_shape) / gpu.gemm_short_k_flops_per_s * 1e9
        rows = [(1.0, *a) for a in (a_mamf, _work(gpu, *short_shape), _work(gpu, *small_shape))]
        fixed, inv_rate, k0_over_rate = _solve3(rows, [t_mamf, t_short, gpu.gemm_anchor_ns])
        k0 = k0_over_rate / inv_rate
    else:
        from prism_megatron.gpu_model.specs import gpu_spec

        hopper = calibration(gpu_spec("h100"))
        k0 = hopper.k_overhead
        w_mamf = a_mamf[0] + a_mamf[1] * k0
        if gpu.gemm_anchor_ns > 0:
            # t = fixed + (c*k + c*k0) / r for the two own anchors: two equations in fixed and 1/r.
            a_small = _work(gpu, *small_shape)
            w_small = a_small[0] + a_small[1] * k0
            inv_rate = (t_mamf - gpu.gemm_anchor_ns) / (w_mamf - w_small)
            fixed = t_mamf - w_mamf * inv_rate
        else:
            fixed = hopper.fixed_ns
            inv_rate = (t_mamf - fixed) / w_mamf
    if not (inv_rate > 0 and k0 >= 0 and fixed >= 0):
        raise ValueError(
            f"the GEMM anchors of {gpu.name} do not give a physical calibration; check constants.py"
        )
    return GemmCalibration(bf16_flops_per_sm_s=1e9 / inv_rate, k_overhead=k0, fixed_ns=fixed)


@functools.cache
def fp8_rate_scale(gpu: GpuSpec) -> float:
    """r_sm of FP8 over r_sm of BF16: FP8's r_sm is solved, like BF16's, so that the formula (with
    the same fixed cost and k0) reproduces the FP8 MAMF at the shape it was measured at."""
    cal = calibration(gpu)
    shape = (gpu.mamf_fp8_m, gpu.mamf_fp8_n, gpu.mamf_fp8_k)
    t_ns = 2 * math.prod(shape) / gpu.mamf_fp8_flops_per_s * 1e9 - cal.fixed_ns
    c_k, c = _work(gpu, *shape)
    fp8_rate = (c_k + c * cal.k_overhead) / t_ns * 1e9
    return fp8_rate / cal.bf16_flops_per_sm_s


def dtype_rate_scale(gpu: GpuSpec, dtype: torch.dtype) -> float:
    """Throughput of `dtype` relative to BF16 on `gpu`.

    Raises:
        ValueError: an FP8 GEMM on a GPU without FP8 tensor cores.
    """
    if dtype in FP8_DTYPES:
        if gpu.mamf_fp8_flops_per_s <= 0:
            raise ValueError(
                f"{gpu.display_name} has no FP8 tensor cores: an FP8 GEMM cannot be modelled on it"
            )
        return fp8_rate_scale(gpu)
    if dtype in (torch.float32, torch.float64):
        return gpu.tf32_flops_per_s / gpu.bf16_flops_per_s
    return gpu.fp16_flops_per_s / gpu.bf16_flops_per_s if dtype == torch.float16 else 1.0


@functools.cache
def gemm_time(
    gpu: GpuSpec, m: int, n: int, k: int, dtype: torch.dtype, *, batch: int = 1, accumulate_fp32: bool = False
) -> int:
    """Device time in ns of `batch` GEMMs (m x k) @ (k x n) in `dtype` on `gpu`.

    With `accumulate_fp32` the GEMM adds its product into an FP32 output (C = A B + C, beta 1: the
    weight-gradient GEMM of Megatron's gradient accumulation fusion): the memory roof reads and
    writes C in FP32 (8 bytes per element) instead of writing it once in `dtype`."""
    if min(m, n, k, batch) <= 0:
        return round(calibration(gpu).fixed_ns) if min(m, n, batch) > 0 else 0
    cal = calibration(gpu)
    tm, tn, waves = _tile(gpu, m, n, batch)
    rate = cal.bf16_flops_per_sm_s * dtype_rate_scale(gpu, dtype)
    tiles = math.ceil(m / tm) * math.ceil(n / tn) * batch
    compute_ns = min(
        waves_k * 2 * tm * tn * (math.ceil(k / split) + cal.k_overhead) / rate * 1e9 + reduce_ns
        for split, waves_k, reduce_ns in _splits(gpu, m, n, k, batch, tiles, waves)
    )
    size = dtype.itemsize
    c_bytes = 2 * FP32_BYTES if accumulate_fp32 else size
    memory_ns = ((m * k + k * n) * size + m * n * c_bytes) * batch / gpu.achievable_hbm_bytes_per_s * 1e9
    fastest_ns = 2 * m * n * k * batch / max_achievable_flops_per_s(gpu, dtype) * 1e9
    return round(max(cal.fixed_ns + max(compute_ns, memory_ns), fastest_ns))


def max_achievable_flops_per_s(gpu: GpuSpec, dtype: torch.dtype) -> float:
    """The fastest any GEMM in `dtype` runs: the MAMF, the best throughput of a brute-force search
    over shapes (constants.py), so no shape is modelled faster than every shape measured. The tile
    and wave terms alone would let a shape whose tiles fill the SMs exactly beat the MAMF's own
    shape, which fills them less well (GPT 462B's and Llama 3 405B's layer GEMMs: up to 830
    TFLOP/s on an H100 against the MAMF's 794.5). FP16 and FP32 scale BF16's as their peaks do."""
    if dtype in FP8_DTYPES:
        dtype_rate_scale(gpu, dtype)  # refuses a GPU without FP8
        return gpu.mamf_fp8_flops_per_s
    return gpu.mamf_bf16_flops_per_s * dtype_rate_scale(gpu, dtype)


def _splits(gpu: GpuSpec, m: int, n: int, k: int, batch: int, tiles: int, waves: int):
    """(split, waves, extra ns) for split-k choices: a GEMM whose tiles leave SMs idle may split k
    over up to num_sms // tiles SMs per tile and add the FP32 partial sums after (written and read
    once through HBM, one more launch). Every split is offered whatever k is, so that the best
    time never drops as k grows; each slice still pays the per-tile cost k0, which keeps short-k
    splits unattractive."""
    yield 1, waves, 0.0
    for split in range(2, gpu.num_sms // tiles + 1):
        reduce_ns = 2 * split * m * n * batch * 4 / gpu.achievable_hbm_bytes_per_s * 1e9 + gpu.launch_ns
        yield split, 1, reduce_ns
