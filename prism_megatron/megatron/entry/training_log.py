"""Megatron-LM's own words for the built-in entry: its iteration line and its TensorBoard / W&B scalars.

Why: users scrape Megatron's logs and read its TensorBoard tags; a run of the built-in entry must
look like a Megatron-LM run to those tools. The line follows `training_log` in
megatron/training/training.py (Megatron-LM core_v0.16.1) field for field:

     [2026-01-01 12:00:00.000000] iteration        5/      10 | consumed samples:           40 |
     elapsed time per iteration (ms): 291.4 | throughput per GPU (TFLOP/s/GPU): 0.0 | learning rate:
     1.000000E-04 | global batch size:     8 | lm loss: 1.041567E+01 | loss scale: 1.0 | grad norm:
     4.531 | number of skipped iterations:   0 | number of nan iterations:   0 |

(one line; throughput only with --log-throughput, lm loss only where the rank computes it: the last
pipeline stage). As in Megatron, the time and the loss are averages over the --log-interval
iterations since the last line, and the learning rate is constant (the entry has no schedule).

Which ranks: every real rank prints its own line (each real rank's log is one scrapeable Megatron log;
Megatron prints on rank W-1 only, which under emulation is usually virtual). The TensorBoard and W&B
writers belong to the last real rank (Megatron gives them to rank W-1), and write Megatron's tags:
learning-rate, batch-size, lm loss, loss-scale, grad-norm (each also "... vs samples"),
world-size (--log-world-size-to-tensorboard), iteration-time and throughput
(--log-timers-to-tensorboard; throughput with --log-throughput). Values are the emulated run's.
"""

from __future__ import annotations

import argparse
import datetime
import math
import os
from typing import Any


def add_arguments(parser: argparse.ArgumentParser) -> None:
    """Megatron-LM's logging flags (defaults as in its LoggerConfig, except --log-interval: 1 here)."""
    g = parser.add_argument_group("logging (Megatron-LM's flags)")
    g.add_argument("--log-throughput", action="store_true")
    g.add_argument("--tensorboard-dir", default=None)
    g.add_argument("--tensorboard-log-interval", type=int, default=1)
    g.add_argument("--tensorboard-queue-size", type=int, default=1000)
    g.add_argument("--log-timers-to-tensorboard", action="store_true")
    g.add_argument(
        "--no-log-loss-scale-to-tensorboard", action="store_false", dest="log_loss_scale_to_tensorboard"
    )
    g.add_argument("--log-world-size-to-tensorboard", action="store_true")
    g.add_argument("--wandb-project", default=None)
    g.add_argument("--wandb-exp-name", default=None)
    g.add_argument("--wandb-save-dir", default=None)
    g.add_argument("--wandb-entity", default=None)


def iteration_line(
    *,
    iteration: int,
    train_iters: int,
    consumed_samples: int,
    elapsed_s_per_iteration: float,
    throughput_tflops: float | None,
    learning_rate: float,
    global_batch_size: int,
    losses: dict[str, float],
    loss_scale: float,
    grad_norm: float | None,
    num_skipped: int,
    num_nan: int,
    now: datetime.datetime | None = None,
) -> str:
    """One line in Megatron-LM's format (see the module docstring)."""
    stamp = (now or datetime.datetime.now()).strftime("%Y-%m-%d %H:%M:%S.%f")
    line = f" [{stamp}]"
    line += f" iteration {iteration:8d}/{train_iters:8d} |"
    line += f" consumed samples: {consumed_samples:12d} |"
    line += f" elapsed time per iteration (ms): {elapsed_s_per_iteration * 1000.0:.1f} |"
    if throughput_tflops is not None:
        line += f" throughput per GPU (TFLOP/s/GPU): {throughput_tflops:.1f} |"
    line += f" learning rate: {learning_rate:.6E} |"
    line += f" global batch size: {global_batch_size:5d} |"
    for key, value in losses.items():
        if value > 0.0:  # Megatron prints only positive averages
            line += f" {key}: {value:.6E} |"
    line += f" loss scale: {loss_scale:.1f} |"
    if grad_norm is not None:
        line += f" grad norm: {grad_norm:.3f} |"
    line += f" number of skipped iterations: {num_skipped:3d} |"
    line += f" number of nan iterations: {num_nan:3d} |"
    return line


class TrainingLogger:
    """Prints the iteration line every --log-interval iterations; the last real rank also writes scalars."""

    def __init__(
        self, args: argparse.Namespace, *, world_size: int, writes_scalars: bool, flops: float | None
    ):
        """
        Args:
            world_size: W, the target job's GPUs (throughput is per GPU of the whole job).
            writes_scalars: this is the last real rank, whose writers Megatron's rank W-1 would hold.
            flops: model FLOPs of one iteration (for the throughput), None when unknown.
        """
        self.args = args
        self.world_size = world_size
        self.flops = flops
        self._interval: list[dict[str, Any]] = []
        self.tensorboard = _tensorboard_writer(args) if writes_scalars else None
        self.wandb = _wandb_run(args) if writes_scalars else None

    def step(self, iteration: int, step: dict[str, Any], *, loss_scale: float = 1.0) -> str | None:
        """Record iteration `iteration` (1-based, as Megatron counts); return the line when printed."""
        args = self.args
        self._interval.append(step)
        samples = iteration * args.global_batch_size
        writes = self.tensorboard is not None or self.wandb is not None
        if writes and iteration % args.tensorboard_log_interval == 0:
            self._scalars(iteration, samples, step, loss_scale)
        if iteration % args.log_interval and iteration != args.train_iters:
            return None
        interval, self._interval = self._interval, []
        elapsed = sum(s["time_s"] for s in interval) / len(interval)
        if args.log_timers_to_tensorboard:
            self._scalar("iteration-time", elapsed, iteration)
            if args.log_throughput and self.flops is not None:
                self._scalar("throughput", self._throughput(elapsed), iteration)
        losses = [s["loss"] for s in interval if s.get("loss") is not None]
        line = iteration_line(
            iteration=iteration,
            train_iters=args.train_iters,
            consumed_samples=samples,
            elapsed_s_per_iteration=elapsed,
            throughput_tflops=self._throughput(elapsed) if args.log_throughput else None,
            learning_rate=args.lr,
            global_batch_size=args.global_batch_size,
            losses={"lm loss": sum(losses) / len(losses)} if losses else {},
            loss_scale=loss_scale,
            grad_norm=step.get("grad_norm"),
            num_skipped=sum(1 for s in interval if not s.get("update_successful", True)),
            num_nan=sum(1 for s in interval if s.get("loss") is not None and not math.isfinite(s["loss"])),
        )
        print(line, flush=True)
        return line

    def _throughput(self, seconds: float) -> float | None:
        if self.flops is None or seconds <= 0:
            return None
        return self.flops / (seconds * 1e12 * self.world_size)

    def _scalars(self, iteration: int, samples: int, step: dict[str, Any], loss_scale: float) -> None:
        args = self.args
        self._scalar("learning-rate", args.lr, iteration, samples)
        self._scalar("batch-size", args.global_batch_size, iteration, samples)
        if step.get("loss") is not None:
            self._scalar("lm loss", step["loss"], iteration, samples)
        if args.log_loss_scale_to_tensorboard:
            self._scalar("loss-scale", loss_scale, iteration, samples)
        if args.log_world_size_to_tensorboard:
            self._scalar("world-size", self.world_size, iteration, samples)
        if step.get("grad_norm") is not None:
            self._scalar("grad-norm", step["grad_norm"], iteration, samples)
        if self.wandb is not None:
            self.wandb.log({"samples vs steps": samples}, iteration)

    def _scalar(self, tag: str, value: float, iteration: int, samples: int | None = None) -> None:
        """Megatron's pair: the tag against the iteration and, for most, "<tag> vs samples"."""
        if self.tensorboard is not None:
            self.tensorboard.add_scalar(tag, value, iteration)
            if samples is not None:
                self.tensorboard.add_scalar(f"{tag} vs samples", value, samples)
        if self.wandb is not None:
            self.wandb.log({tag: value}, iteration)

    def close(self) -> None:
        if self.tensorboard is not None:
            self.tensorboard.close()
        if self.wandb is not None:
            self.wandb.finish()


def _tensorboard_writer(args: argparse.Namespace):
    if not args.tensorboard_dir:
        return None
    try:
        from torch.utils.tensorboard import SummaryWriter
    except ModuleNotFoundError:  # Megatron's own warning, word for word
        print(
            "WARNING: TensorBoard writing requested but is not available (are you using PyTorch 1.1.0 or "
            "later?), no TensorBoard logs will be written.",
            flush=True,
        )
        return None
    print("> setting tensorboard ...", flush=True)
    return SummaryWriter(log_dir=args.tensorboard_dir, max_queue=args.tensorboard_queue_size)


def _wandb_run(args: argparse.Namespace):
    if not args.wandb_project:
        return None
    if not args.wandb_exp_name:
        raise ValueError(
            "--wandb-project needs --wandb-exp-name (Megatron-LM: 'Please specify the wandb experiment name!')"
        )
    try:
        import wandb
    except ModuleNotFoundError as exc:
        raise ValueError(
            "--wandb-project needs the wandb package; pip install wandb, or drop the flag"
        ) from exc
    save_dir = args.wandb_save_dir or os.path.join(os.getcwd(), "wandb")
    os.makedirs(save_dir, exist_ok=True)
    return wandb.init(
        dir=save_dir,
        name=args.wandb_exp_name,
        project=args.wandb_project,
        entity=args.wandb_entity or None,
        config=vars(args),
    )
