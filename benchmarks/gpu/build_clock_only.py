"""Fallback build for the GPU run: prism_megatron._C with the clock component alone.

Why: the GPU checks of the wait kernel must not be lost when another component fails to build on the
lent machine (its torch differs from the build machines'). Run from the repository root, with
setup.py's arguments: ``python benchmarks/gpu/build_clock_only.py build_ext --inplace``; it builds
from scratch in build/prism-megatron-clock-only/ unless given ``--build-temp`` (partial_build.py).
"""

import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.gpu.partial_build import build  # the repository root is on the path now

SOURCES = ["csrc/replay/clock.cpp", "csrc/replay/clock_bindings.cpp"]

if __name__ == "__main__":
    build("prism-megatron-clock-only", SOURCES)
