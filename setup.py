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
under any other torch (csrc/module.cpp). So before compiling, a build stops with one line saying
what to do when it would fail deep in the compiler or build a module that cannot load:

- pip's isolated build (a plain `pip install .`) compiles against a torch pip put into a temporary
  build environment, not the torch of the environment it installs into: it stops unless the two
  versions agree (`pip install --no-build-isolation .` is the way, README "Install");
- a CUDA build whose CUDA_HOME has no include/cuda_runtime_api.h (torch guesses CUDA_HOME from the
  folder above `nvcc`, wrong where `nvcc` on PATH is a wrapper) stops, naming the toolkit that nvcc
  itself runs from and PRISM_FORCE_CPU=1 for a CPU build.
"""

import glob
import importlib.metadata
import os
import re
import subprocess
import sys

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


def isolation_problem(build_torch, build_torch_dir, target_torch):
    """One line when the torch the build sees is not the one the package will run with, else None.

    Args:
        build_torch: torch.__version__ of the build.
        build_torch_dir: where that torch lies.
        target_torch: the version installed where the package goes (None: no torch there).
    """
    if target_torch == build_torch:
        return None
    if "pip-build-env-" not in build_torch_dir and target_torch is None:
        return None  # not pip's isolated build (python setup.py, a tree on PYTHONPATH): nothing to compare
    there = (
        f"this environment runs torch {target_torch}" if target_torch else "this environment has no torch yet"
    )
    return (
        f"prism-megatron: this build sees torch {build_torch} from {build_torch_dir}, but {there}, and the "
        "extension loads only beside the torch it was compiled against: install torch first, then "
        '`pip install --no-build-isolation .` (README "Install")'
    )


def cuda_headers_problem(cuda_home, include_dirs, nvcc_toolkit):
    """One line when a CUDA build would not find cuda_runtime_api.h, else None.

    Args:
        cuda_home: torch's CUDA_HOME.
        include_dirs: the include folders torch passes to a CUDA build.
        nvcc_toolkit: the toolkit folder `nvcc` on PATH runs from (None when unknown).
    """
    if any(os.path.isfile(os.path.join(d, "cuda_runtime_api.h")) for d in include_dirs):
        return None
    hint = (
        f"the nvcc on PATH runs from {nvcc_toolkit}: rerun with CUDA_HOME={nvcc_toolkit}"
        if nvcc_toolkit and os.path.realpath(nvcc_toolkit) != os.path.realpath(cuda_home)
        else "set CUDA_HOME to the CUDA toolkit that has include/cuda_runtime_api.h"
    )
    return (
        f"prism-megatron: a CUDA build needs cuda_runtime_api.h, and CUDA_HOME={cuda_home} (torch's "
        f"guess from nvcc's folder unless CUDA_HOME is set) has none; {hint}, or PRISM_FORCE_CPU=1 "
        "for a CPU-only build"
    )


def _installed_torch():
    """The torch version where the package is installed: this interpreter without pip's build path."""
    env = {k: v for k, v in os.environ.items() if k not in ("PYTHONPATH", "PYTHONNOUSERSITE")}
    code = (
        "import importlib.metadata as m\ntry: print(m.version('torch'))\nexcept m.PackageNotFoundError: pass"
    )
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=120)
    return done.stdout.strip() or None


def _nvcc_toolkit():
    """The toolkit folder nvcc on PATH compiles with (its dry run's TOP), None without nvcc."""
    try:
        done = subprocess.run(
            ["nvcc", "--dryrun", "-c", "-x", "cu", os.devnull, "-o", os.devnull],
            capture_output=True,
            text=True,
            timeout=60,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    match = re.search(r"^#\$ TOP=(.*)$", done.stdout + done.stderr, re.M)
    return os.path.normpath(match.group(1).strip()) if match else None


def check_build_environment(cuda):
    """Stop with one line where the build would fail or make a module that cannot load."""
    # Compare distribution versions on both sides: a wheel's metadata says "2.14.1" where its
    # torch.__version__ says "2.14.1+cu130".
    try:
        build_torch = importlib.metadata.version("torch")
    except importlib.metadata.PackageNotFoundError:  # a source tree on the path: no metadata
        build_torch = torch.__version__
    problem = isolation_problem(build_torch, os.path.dirname(torch.__file__), _installed_torch())
    if problem is None and cuda:
        try:
            include_dirs = cpp_extension.include_paths(device_type="cuda")
        except TypeError:  # torch before 2.6 names the argument `cuda`
            include_dirs = cpp_extension.include_paths(cuda=True)
        problem = cuda_headers_problem(cpp_extension.CUDA_HOME, include_dirs, _nvcc_toolkit())
    if problem is not None:
        raise SystemExit(problem)


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


class BuildExtension(cpp_extension.BuildExtension.with_options(use_ninja=True)):
    """torch's build, after `check_build_environment` (only when an extension is compiled: an sdist
    or a PRISM_NO_EXTENSION install needs neither torch nor a toolkit)."""

    def run(self):
        if self.extensions:
            check_build_environment(_want_cuda())
        super().run()


if __name__ == "__main__":  # pip's build backend and `python setup.py` both run it as __main__
    setup(
        ext_modules=[] if os.environ.get("PRISM_NO_EXTENSION") == "1" else [_extension()],
        cmdclass={"build_ext": BuildExtension},
    )
