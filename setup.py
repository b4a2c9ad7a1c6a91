"""Builds prism_megatron._C from csrc/, and nothing else (metadata lives in pyproject.toml).

A CUDA build (CUDAExtension, csrc/**/*.cu included, PRISM_WITH_CUDA defined) when the installed
torch was built with CUDA and a CUDA toolkit is found; otherwise a CPU build (CppExtension) of the
.cpp sources alone. The choice never depends on a GPU being present: build hosts usually have none.
PRISM_FORCE_CPU=1 forces the CPU build. PRISM_NO_EXTENSION=1 installs the package without building the
extension (the Makefile installs dependencies that way, then builds the extension in place once).
"""

import glob
import os

import torch
from setuptools import setup
from torch.utils import cpp_extension

ROOT = os.path.dirname(os.path.abspath(__file__))
# -O2 -g0: the sysconfig default (-g -O3) costs ~30 s more per file on a 2-core machine.
# No -std: torch's build adds the standard its own headers need (C++20 from torch 2.14 on, whose ATen
# refuses C++17), and a second -std would override it.
CXX_FLAGS = ["-O2", "-g0"]
NVCC_FLAGS = ["-O2", "-gencode=arch=compute_90,code=sm_90"]


def _sources(pattern):
    return sorted(
        os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "csrc", "**", pattern), recursive=True)
    )


def _want_cuda():
    if os.environ.get("PRISM_FORCE_CPU") == "1":
        return False
    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


def _extension():
    include_dirs = [os.path.join(ROOT, "csrc")]
    if _want_cuda():
        return cpp_extension.CUDAExtension(
            "prism_megatron._C",
            _sources("*.cpp") + _sources("*.cu"),
            include_dirs=include_dirs,
            define_macros=[("PRISM_WITH_CUDA", "1")],
            extra_compile_args={"cxx": CXX_FLAGS, "nvcc": NVCC_FLAGS},
        )
    return cpp_extension.CppExtension(
        "prism_megatron._C",
        _sources("*.cpp"),
        include_dirs=include_dirs,
        extra_compile_args={"cxx": CXX_FLAGS},
    )


setup(
    ext_modules=[] if os.environ.get("PRISM_NO_EXTENSION") == "1" else [_extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
)
