"""Build for the GPU check: prism_megatron._C with the backend, the replay engine and the clock.

Why: the lent GPU machine has another torch than the build machines, and a component that does not
build there must not hide the backend's GPU checks. This builds the module from the module core,
build facts, clock, replay engine and backend sources only; setup.py stays the one real build. Run
from the repository root with setup.py's arguments: ``python benchmarks/backend/gpu_build.py
build_ext --inplace``. A CUDA build when torch has CUDA and a toolkit is found, else a CPU build.
"""

import glob
import os

import torch
from setuptools import setup
from torch.utils import cpp_extension

SOURCES = sorted(
    [
        "csrc/module.cpp",
        "csrc/build_info.cpp",
        *glob.glob("csrc/replay/*.cpp"),
        *glob.glob("csrc/backend/*.cpp"),
    ]
)
CUDA_SOURCES = ["csrc/replay/wait_kernel.cu"]
# As setup.py: no -std (torch adds the one its headers need), Hopper code only.
CXX_FLAGS = ["-O2", "-g0"]
NVCC_FLAGS = ["-O2", "-gencode=arch=compute_90,code=sm_90"]


def _extension():
    if torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None:
        return cpp_extension.CUDAExtension(
            "prism_megatron._C",
            SOURCES + CUDA_SOURCES,
            include_dirs=[os.path.abspath("csrc")],
            define_macros=[("PRISM_WITH_CUDA", "1")],
            extra_compile_args={"cxx": CXX_FLAGS, "nvcc": NVCC_FLAGS},
        )
    return cpp_extension.CppExtension(
        "prism_megatron._C",
        SOURCES,
        include_dirs=[os.path.abspath("csrc")],
        extra_compile_args={"cxx": CXX_FLAGS},
    )


if __name__ == "__main__":
    setup(
        name="prism-megatron-backend-only",
        ext_modules=[_extension()],
        cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
    )
