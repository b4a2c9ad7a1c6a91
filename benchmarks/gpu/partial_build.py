"""Partial builds of prism_megatron._C for a lent GPU machine, from scratch in their own folder.

Why: the lent machine has another torch than the build machines, and a component that does not
build there must not hide the GPU checks of the others. A partial build compiles the module core,
the build facts and the chosen components' sources only; setup.py stays the one real build. It is a
CUDA build when torch has CUDA and a toolkit is found, else a CPU build.

Objects never come from elsewhere: without `--build-temp` in the arguments, the build uses
`build/<name>/`, emptied first, so objects left by setup.py's shared build folder, another partial
build or an earlier copy of the sources (a warm machine keeps ignored files) are never linked in.
"""

from __future__ import annotations

import os
import shutil
import sys

import torch
from setuptools import setup
from torch.utils import cpp_extension

CORE_SOURCES = ["csrc/module.cpp", "csrc/build_info.cpp"]
CUDA_SOURCES = ["csrc/replay/wait_kernel.cu"]
# As setup.py: no -std (torch adds the one its headers need), Hopper code only.
CXX_FLAGS = ["-O2", "-g0"]
NVCC_FLAGS = ["-O2", "-gencode=arch=compute_90,code=sm_90"]


def _extension(sources: list[str]):
    include_dirs = [os.path.abspath("csrc")]
    if torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None:
        return cpp_extension.CUDAExtension(
            "prism_megatron._C",
            sources + CUDA_SOURCES,
            include_dirs=include_dirs,
            define_macros=[("PRISM_WITH_CUDA", "1")],
            extra_compile_args={"cxx": CXX_FLAGS, "nvcc": NVCC_FLAGS},
        )
    return cpp_extension.CppExtension(
        "prism_megatron._C", sources, include_dirs=include_dirs, extra_compile_args={"cxx": CXX_FLAGS}
    )


def own_build_temp(name: str, argv: list[str]) -> list[str]:
    """`argv` with `--build-temp build/<name>` (emptied first) after `build_ext`, unless it names one."""
    if "build_ext" not in argv or any(
        arg in ("--build-temp", "-t") or arg.startswith("--build-temp=") for arg in argv
    ):
        return argv
    folder = os.path.join("build", name)
    shutil.rmtree(folder, ignore_errors=True)
    at = argv.index("build_ext") + 1
    return [*argv[:at], "--build-temp", folder, *argv[at:]]


def build(name: str, component_sources: list[str], argv: list[str] | None = None) -> None:
    """Run setup.py-style `argv` (default: this process's) on the core plus `component_sources`.

    Run from the repository root; `name` names the distribution and the default build folder.
    """
    if not os.path.isfile("csrc/module.cpp"):
        raise ValueError(f"run from the repository root (no csrc/module.cpp under {os.getcwd()})")
    args = own_build_temp(name, list(sys.argv[1:] if argv is None else argv))
    setup(
        name=name,
        script_args=args,
        ext_modules=[_extension(sorted(CORE_SOURCES + component_sources))],
        cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
    )
