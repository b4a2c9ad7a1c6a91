"""Run Megatron-LM's own training script (e.g. `pretrain_gpt.py`), unmodified, as a prism real rank.

The launcher parses the `--prism-*` flags, installs the CPU device shim when the device is the CPU,
then `run_script` applies Megatron-LM's hooks (`prism_megatron.patches.training`), makes the
Megatron-LM checkout importable next to the installed megatron-core, and runs the script with `runpy`
as `__main__`.
"""

from __future__ import annotations

import os
import runpy
import sys

from prism_megatron.megatron.run.runtime import Runtime, TrainingRecord
from prism_megatron.patches import local_layers
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
    record = TrainingRecord(rt)
    if rt.device == "cpu":
        os.environ.setdefault("CUDA_DEVICE_MAX_CONNECTIONS", "1")  # validate_args asserts it for TP/CP > 1
        rt.apply(cpu_records())
        rt.apply(local_layers.records())
    rt.apply(emulation_records(), run=rt, training_record=record)
    saved_argv = sys.argv
    sys.argv = [script, *script_args]
    try:
        runpy.run_path(script, run_name="__main__")
    finally:
        sys.argv = saved_argv
    return record
