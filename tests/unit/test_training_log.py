"""Megatron-LM's iteration line and TensorBoard tags, as the built-in entry writes them."""

import argparse
import datetime
import re

import pytest

from prism_megatron.megatron.entry.training_log import TrainingLogger, add_arguments, iteration_line

# The line Megatron-LM's training_log (core_v0.16.1) prints for these values, written out by hand.
EXPECTED = (
    " [2026-01-02 03:04:05.000006] iteration        5/      10 | consumed samples:           40 |"
    " elapsed time per iteration (ms): 291.4 | throughput per GPU (TFLOP/s/GPU): 12.3 |"
    " learning rate: 1.000000E-04 | global batch size:     8 | lm loss: 1.041567E+01 |"
    " loss scale: 1.0 | grad norm: 4.532 | number of skipped iterations:   0 |"
    " number of nan iterations:   0 |"
)
# What log scrapers match (Megatron-LM's own tools/ and common dashboards parse these fields).
SCRAPER = re.compile(
    r"iteration\s+(\d+)/\s*(\d+) \| consumed samples:\s+(\d+) \| elapsed time per iteration \(ms\): ([\d.]+) \|"
    r"(?: throughput per GPU \(TFLOP/s/GPU\): ([\d.]+) \|)? learning rate: ([\dE.+-]+) \|"
    r" global batch size:\s+(\d+) \|(?: lm loss: ([\dE.+-]+) \|)? loss scale: ([\d.]+) \|"
)


def _args(tmp_path=None, **overrides):
    parser = argparse.ArgumentParser()
    add_arguments(parser)
    args = parser.parse_args([])
    args.lr, args.global_batch_size, args.train_iters, args.log_interval = 1e-4, 8, 4, 2
    if tmp_path is not None:
        args.tensorboard_dir = str(tmp_path / "tb")
    for key, value in overrides.items():
        setattr(args, key, value)
    return args


def test_the_line_is_megatron_lms_format_field_for_field():
    line = iteration_line(
        iteration=5,
        train_iters=10,
        consumed_samples=40,
        elapsed_s_per_iteration=0.29141,
        throughput_tflops=12.3,
        learning_rate=1e-4,
        global_batch_size=8,
        losses={"lm loss": 10.41567},
        loss_scale=1.0,
        grad_norm=4.5317,
        num_skipped=0,
        num_nan=0,
        now=datetime.datetime(2026, 1, 2, 3, 4, 5, 6),
    )
    assert line == EXPECTED
    match = SCRAPER.search(line)
    assert match and match.group(4) == "291.4" and match.group(8) == "1.041567E+01"


def test_the_logger_averages_over_the_log_interval_and_leaves_out_what_the_rank_lacks(capsys):
    logger = TrainingLogger(_args(), world_size=8, writes_scalars=False, flops=None)
    steps = [
        {"loss": None, "grad_norm": 2.0, "update_successful": True, "time_s": 0.1},
        {"loss": None, "grad_norm": 3.0, "update_successful": False, "time_s": 0.3},
    ]
    assert logger.step(1, steps[0]) is None  # --log-interval 2
    line = logger.step(2, steps[1])
    assert line is not None and line in capsys.readouterr().out
    assert "elapsed time per iteration (ms): 200.0 |" in line
    assert "lm loss" not in line and "throughput" not in line  # not the last stage; no --log-throughput
    assert "grad norm: 3.000 |" in line and "number of skipped iterations:   1 |" in line
    assert SCRAPER.search(line).group(1, 2, 3) == ("2", "4", "16")


def test_the_last_real_rank_writes_megatrons_tensorboard_tags(tmp_path, capsys):
    pytest.importorskip("tensorboard")
    from tensorboard.backend.event_processing.event_accumulator import EventAccumulator

    args = _args(tmp_path, log_throughput=True, log_timers_to_tensorboard=True, log_interval=1)
    logger = TrainingLogger(args, world_size=8, writes_scalars=True, flops=8e12)
    for iteration in range(1, 5):
        logger.step(
            iteration, {"loss": 10.0 - iteration, "grad_norm": 1.5, "update_successful": True, "time_s": 0.5}
        )
    logger.close()
    events = EventAccumulator(str(tmp_path / "tb"))
    events.Reload()
    tags = set(events.Tags()["scalars"])
    megatron = {
        "learning-rate", "learning-rate vs samples", "batch-size", "batch-size vs samples", "lm loss",
        "lm loss vs samples", "loss-scale", "loss-scale vs samples", "grad-norm", "grad-norm vs samples",
        "iteration-time", "throughput",
    }  # fmt: skip
    assert megatron <= tags
    assert [(e.step, e.value) for e in events.Scalars("lm loss")] == [(1, 9.0), (2, 8.0), (3, 7.0), (4, 6.0)]
    assert [e.step for e in events.Scalars("lm loss vs samples")] == [8, 16, 24, 32]
    # 8e12 FLOPs per iteration / (0.5 s x 8 GPUs) = 2 TFLOP/s per GPU
    assert events.Scalars("throughput")[0].value == pytest.approx(2.0)
    assert events.Scalars("iteration-time")[0].value == pytest.approx(0.5)


def test_other_ranks_write_no_event_file(tmp_path, capsys):
    logger = TrainingLogger(_args(tmp_path), world_size=8, writes_scalars=False, flops=None)
    logger.step(2, {"loss": 1.0, "grad_norm": 1.0, "update_successful": True, "time_s": 0.1})
    logger.close()
    assert not (tmp_path / "tb").exists()


def test_wandb_without_an_experiment_name_is_refused_as_megatron_does(tmp_path):
    with pytest.raises(ValueError, match="--wandb-project needs --wandb-exp-name"):
        TrainingLogger(_args(wandb_project="p"), world_size=8, writes_scalars=True, flops=None)
