"""Builds prism_megatron._C from csrc/, and nothing else (metadata lives in pyproject.toml).

A CUDA build (CUDAExtension, csrc/**/*.cu included, PRISM_WITH_CUDA defined) when the installed
torch was built with CUDA and a CUDA toolkit is found; otherwise a CPU build (CppExtension) of the
.cpp sources alone. The choice never depends on a GPU being present: build hosts usually have none.
PRISM_FORCE_CPU=1 forces the CPU build. PRISM_NO_EXTENSION=1 installs the package without building the
extension (the Makefile installs dependencies that way, then builds the extension in place once).

For the builds of tools/native_build.py (every GPU build; forced, from empty folders):
PRISM_SOURCES, a space-separated list of csrc/ paths, builds the module core (module.cpp,
build_info.cpp) and these sources only (a partial build: a component that does not compile under
another torch must not hide the others); PRISM_DEBUG_SYMBOLS=1 compiles with -g1 (function names and
line tables for a native backtrace, at little cost in build time).

Every build records the full version of the torch it compiles against; the module refuses to load
under any other torch (csrc/module.cpp).
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
CXX_FLAGS = ["-O2", "-g1" if os.environ.get("PRISM_DEBUG_SYMBOLS") == "1" else "-g0"]
NVCC_FLAGS = ["-O2", "-gencode=arch=compute_90,code=sm_90"]
CORE_SOURCES = ["csrc/module.cpp", "csrc/build_info.cpp"]
# A string macro: torch's ninja build quotes each flag for the shell, so the quotes reach the compiler.
DEFINES = [("PRISM_BUILD_TORCH_VERSION", f'"{torch.__version__}"')]


def _sources(pattern):
    """csrc/**/<pattern> relative to the root; under PRISM_SOURCES the core and those only (.cu: all)."""
    found = sorted(
        os.path.relpath(p, ROOT) for p in glob.glob(os.path.join(ROOT, "csrc", "**", pattern), recursive=True)
    )
    chosen = os.environ.get("PRISM_SOURCES")
    if chosen is None or pattern == "*.cu":  # the wait kernel: every CUDA build needs it
        return found
    missing = [p for p in chosen.split() if not os.path.isfile(os.path.join(ROOT, p))]
    if missing:
        raise SystemExit(
            f"PRISM_SOURCES names {missing}: no such file under {ROOT} (give paths like csrc/replay/clock.cpp)"
        )
    wanted = set(CORE_SOURCES) | set(chosen.split())
    return [p for p in found if p in wanted]


def _want_cuda():
    if os.environ.get("PRISM_FORCE_CPU") == "1":
        return False
    return torch.version.cuda is not None and cpp_extension.CUDA_HOME is not None


def _extension():
    include_dirs = [os.path.join(ROOT, "csrc")]
    # setuptools skips an extension whose module is newer than its sources, and counts only these
    # and `depends` as sources: without the headers, a header-only change left the old module.
    depends = sorted(
        os.path.relpath(p, ROOT)
        for ext in ("*.h", "*.cuh")
        for p in glob.glob(os.path.join(ROOT, "csrc", "**", ext), recursive=True)
    )
    if _want_cuda():
        return cpp_extension.CUDAExtension(
            "prism_megatron._C",
            _sources("*.cpp") + _sources("*.cu"),
            include_dirs=include_dirs,
            depends=depends,
            define_macros=[*DEFINES, ("PRISM_WITH_CUDA", "1")],
            extra_compile_args={"cxx": CXX_FLAGS, "nvcc": NVCC_FLAGS},
        )
    return cpp_extension.CppExtension(
        "prism_megatron._C",
        _sources("*.cpp"),
        include_dirs=include_dirs,
        depends=depends,
        define_macros=DEFINES,
        extra_compile_args={"cxx": CXX_FLAGS},
    )


setup(
    ext_modules=[] if os.environ.get("PRISM_NO_EXTENSION") == "1" else [_extension()],
    cmdclass={"build_ext": cpp_extension.BuildExtension.with_options(use_ninja=True)},
)
