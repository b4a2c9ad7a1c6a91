"""Run Megatron-LM's own training script (e.g. `pretrain_gpt.py`), unmodified, as a prism real rank.

The launcher parses the `--prism-*` flags, installs the CPU device shim when the device is the CPU,
then `run_script` applies Megatron-LM's hooks (`prism_megatron.patches.training`), makes the
Megatron-LM checkout importable next to the installed megatron-core, and runs the script with `runpy`
as `__main__`.

On a modelled GPU (`--prism-device model:<gpu>`) the script runs its model, data, forward/backward and
optimizer step on the `ModelledDevice` (fake tensors, the GPU model's clock), entered where it calls
`setup_model_and_optimizer` (`patches.modelled_device.SCRIPT_DEVICE_BEGINS`), after Megatron's
initialisation, as the built-in entry enters it, and left when the script returns. The local spec's
attention is one fused attention (`megatron/layers/local_spec_attention.py`) and the norms fused
kernels (`TrainingRecord`), as in the built-in entry.
"""

from __future__ import annotations

import contextlib
import os
import runpy
import sys

from prism_megatron.megatron.run.modelled_device import ModelledDevice
from prism_megatron.megatron.run.runtime import Runtime, TrainingRecord
from prism_megatron.patches import local_layers
from prism_megatron.patches import modelled_device as modelled_patches
from prism_megatron.patches.training import cpu_records, emulation_records


def make_importable(script: str) -> None:
    """Put the script's checkout on sys.path after the installed megatron-core.

    The checkout's own `megatron/core` has no compiled dataset helpers; importing megatron.core from
    the installed wheel first and appending the checkout keeps the wheel's core and takes
    `megatron.training` (and the script's neighbours, such as gpt_builders) from the checkout.
    """
    import megatron.core  # noqa: F401  (the installed one, before the checkout is on the path)

    checkout = os.path.dirname(os.path.abspath(script))
    if checkout not in sys.path:
        sys.path.append(checkout)


def run_script(script: str, script_args: list[str], rt: Runtime) -> TrainingRecord:
    """Apply the hooks and run `script` as `__main__` with `script_args`; returns what training did."""
    make_importable(script)
    gpu = rt.config.emulation.modelled_gpu
    device = None if gpu is None else ModelledDevice(gpu)
    record = TrainingRecord(rt, modelled=device)
    if rt.device == "cpu":
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # validate_args asserts it for TP/CP > 1
        rt.apply(cpu_records())
        rt.apply(local_layers.records(modelled=device is not None))
    rt.apply(emulation_records(), run=rt, training_record=record)
    saved_argv = sys.argv
    sys.argv = [script, *script_args]
    try:
        with contextlib.ExitStack() as on_device:
            if device is not None:
                rt.apply(
                    modelled_patches.SCRIPT_DEVICE_BEGINS,
                    modelled_device_begins=_entering_once(on_device, device),
                )
            runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = saved_argv
    return record


def _entering_once(on_device: contextlib.ExitStack, device: ModelledDevice):
    """Enter the modelled device into `on_device` at the first call (the script may build twice)."""
    entered: list[bool] = []

    def begins() -> None:
        if not entered:
            on_device.enter_context(device.active())
            entered.append(True)

    return begins
