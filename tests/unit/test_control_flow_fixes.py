"""The fp16 overflow fix: under emulation a rank that finds inf/NaN in its grads still takes the step.

Its virtual peers answer the overflow flag with the rank's own, so without the fix one pipeline stage
skips the step while another takes it, and their graphs disagree on the step's collectives.
"""

from __future__ import annotations

import math

import torch

from prism_megatron.patches.control_flow import _overflow_fix


class _Scaler:
    def __init__(self) -> None:
        self.updates: list[bool] = []

    def update(self, found_inf: bool) -> None:
        self.updates.append(found_inf)


class _Optimizer:
    """What the fix touches of megatron-core's MixedPrecisionOptimizer."""

    def __init__(self, grads: list[torch.Tensor]) -> None:
        self.grads = grads
        self.grad_scaler = _Scaler()
        self.is_stub_optimizer = False

    def _collect_main_grad_data_for_unscaling(self) -> list[torch.Tensor]:
        return self.grads


def _original(self) -> bool:
    """Megatron's check: True when any unscaled grad is not finite."""
    return any(not bool(torch.isfinite(g).all()) for g in self.grads)


def test_an_overflow_zeroes_the_non_finite_grads_backs_the_scale_off_and_takes_the_step():
    fixed = _overflow_fix(_original, world=None)
    optimizer = _Optimizer([torch.tensor([1.0, math.inf, -2.0]), torch.tensor([math.nan, 0.5])])
    assert fixed(optimizer) is False
    assert optimizer.grads[0].tolist() == [1.0, 0.0, -2.0]
    assert optimizer.grads[1].tolist() == [0.0, 0.5]
    assert optimizer.grad_scaler.updates == [True]


def test_finite_grads_pass_through_untouched():
    fixed = _overflow_fix(_original, world=None)
    optimizer = _Optimizer([torch.tensor([1.0, -2.0])])
    assert fixed(optimizer) is False
    assert optimizer.grads[0].tolist() == [1.0, -2.0]
    assert optimizer.grad_scaler.updates == []
