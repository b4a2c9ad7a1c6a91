"""Build for the GPU check: prism_megatron._C with the backend, the replay engine and the clock.

Why: the lent GPU machine has another torch than the build machines, and a component that does not
build there must not hide the backend's GPU checks. Run from the repository root with setup.py's
arguments: ``python benchmarks/backend/gpu_build.py build_ext --inplace``; it builds from scratch in
build/prism-megatron-backend-only/ unless given ``--build-temp`` (benchmarks/gpu/partial_build.py).
"""

import glob
import os
import sys

sys.path.insert(0, os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__)))))

from benchmarks.gpu.partial_build import build  # the repository root is on the path now

if __name__ == "__main__":
    build("prism-megatron-backend-only", [*glob.glob("csrc/replay/*.cpp"), *glob.glob("csrc/backend/*.cpp")])
