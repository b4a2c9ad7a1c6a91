"""The fp16 overflow fix: under emulation a rank that finds inf/NaN in its grads still takes the step.

Its virtual peers answer the overflow flag with the rank's own, so without the fix one pipeline stage
skips the step while another takes it, and their graphs disagree on the step's collectives. The fix
wraps megatron-core's own `MixedPrecisionOptimizer.prepare_grads`, run here on a stand-in optimizer
whose scaler is megatron-core's dynamic scaling rule on CPU tensors: the scale backs off exactly as
megatron-core's would (one update per step), and the non-finite grads are zeroed.
"""

from __future__ import annotations

import math

import pytest
import torch
from megatron.core.optimizer.optimizer import MixedPrecisionOptimizer

from prism_megatron.patches import control_flow
from prism_megatron.patches.control_flow import _overflow_fix


class _World:
    """Virtual rank 0 real, its model-parallel peer 1 real or virtual."""

    def __init__(self, peer_real: bool) -> None:
        self.real = {0, 1} if peer_real else {0}

    def is_real(self, rank: int) -> bool:
        return rank in self.real


@pytest.fixture(autouse=True)
def _model_parallel_group_of_two(monkeypatch):
    monkeypatch.setattr(control_flow.dist, "get_process_group_ranks", lambda group: [0, 1])


class _DynamicScaler:
    """megatron-core's `DynamicGradScaler.update`, on a Python float."""

    def __init__(self, scale: float, *, growth_interval: int, hysteresis: int) -> None:
        self.scale, self.growth_interval, self.hysteresis = scale, growth_interval, hysteresis
        self.growth_tracker, self.hysteresis_tracker = 0, hysteresis
        self.inv_scale = torch.tensor([1.0 / scale])

    def update(self, found_inf: bool) -> None:
        if found_inf:
            self.growth_tracker = 0
            self.hysteresis_tracker -= 1
            if self.hysteresis_tracker <= 0:
                self.scale *= 0.5
        else:
            self.growth_tracker += 1
            if self.growth_tracker == self.growth_interval:
                self.growth_tracker = 0
                self.hysteresis_tracker = self.hysteresis
                self.scale *= 2.0


class _Optimizer:
    """What `prepare_grads` touches of a MixedPrecisionOptimizer, the main grads already unscaled."""

    def __init__(self, grads: list[torch.Tensor], scaler: _DynamicScaler) -> None:
        self.grads = grads
        self.grad_scaler = scaler
        self.is_stub_optimizer = False
        self.config = type("Config", (), {"barrier_with_L1_time": False, "timers": None})()
        self.found_inf = torch.zeros(1)

    def _copy_model_grads_to_main_grads(self) -> None:
        pass

    def get_grad_stats_parallel_group(self):
        return None

    def _collect_main_grad_data_for_unscaling(self) -> list[torch.Tensor]:
        return self.grads

    def _unscale_main_grads_and_check_for_nan(self) -> bool:
        return any(not bool(torch.isfinite(g).all()) for g in self.grads)


def _prepare(optimizer: _Optimizer, *, peer_real: bool = False) -> bool:
    fixed = _overflow_fix(MixedPrecisionOptimizer.prepare_grads, world=_World(peer_real))
    return fixed(optimizer)


def test_an_overflow_zeroes_the_non_finite_grads_backs_the_scale_off_once_and_takes_the_step():
    scaler = _DynamicScaler(2.0**16, growth_interval=1000, hysteresis=1)
    optimizer = _Optimizer([torch.tensor([1.0, math.inf, -2.0]), torch.tensor([math.nan, 0.5])], scaler)
    assert _prepare(optimizer) is False
    assert optimizer.grads[0].tolist() == [1.0, 0.0, -2.0]
    assert optimizer.grads[1].tolist() == [0.0, 0.5]
    assert (scaler.scale, scaler.growth_tracker, scaler.hysteresis_tracker) == (2.0**15, 0, 0)


def test_with_a_growth_interval_of_one_the_back_off_is_not_undone():
    scaler = _DynamicScaler(2.0**16, growth_interval=1, hysteresis=1)
    assert _prepare(_Optimizer([torch.tensor([math.inf])], scaler)) is False
    assert scaler.scale == 2.0**15


def test_finite_grads_pass_through_untouched_and_the_scaler_counts_a_good_step():
    scaler = _DynamicScaler(2.0**16, growth_interval=1000, hysteresis=2)
    optimizer = _Optimizer([torch.tensor([1.0, -2.0])], scaler)
    assert _prepare(optimizer) is False
    assert optimizer.grads[0].tolist() == [1.0, -2.0]
    assert (scaler.scale, scaler.growth_tracker) == (2.0**16, 1)


def test_with_every_member_of_the_group_real_megatrons_skip_stands():
    scaler = _DynamicScaler(2.0**16, growth_interval=1000, hysteresis=1)
    optimizer = _Optimizer([torch.tensor([1.0, math.inf])], scaler)
    assert _prepare(optimizer, peer_real=True) is True
    assert optimizer.grads[0][1].item() == math.inf
    assert scaler.scale == 2.0**15
