"""What a user sees of a failing command: its one line, not megatron-core's import notices."""

from __future__ import annotations

import os
import subprocess
import sys

JOB = ("--num-layers", "2", "--prism-emulate", "--prism-world-size", "8")


def _emulate_a_script_outside_megatron_lm(tmp_path, **env: str) -> subprocess.CompletedProcess:
    """`emulate` imports megatron-core's models and optimizer (which print the notices) before it finds
    that the script has no Megatron-LM beside it."""
    script = tmp_path / "train.py"
    script.write_text("print('not Megatron-LM')\n")
    environ = {k: v for k, v in os.environ.items() if k not in ("PYTHONWARNINGS", "PRISM_DEBUG")}
    return subprocess.run(
        [sys.executable, "-m", "prism_megatron.cli", "emulate", "--script", str(script), "--", *JOB],
        env={**environ, **env}, capture_output=True, text=True, timeout=120,
    )  # fmt: skip


def test_a_refusal_is_the_only_line_though_megatron_core_was_imported(tmp_path):
    done = _emulate_a_script_outside_megatron_lm(tmp_path)
    assert done.returncode == 2
    assert done.stderr.strip().count("\n") == 0, done.stderr
    assert "megatron.training is not importable" in done.stderr


def test_prism_debug_shows_megatron_cores_fallback_notices(tmp_path):
    done = _emulate_a_script_outside_megatron_lm(tmp_path, PRISM_DEBUG="1")
    assert "not installed" in done.stderr  # the notices the command hides otherwise
