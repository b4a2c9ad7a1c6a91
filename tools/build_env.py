"""What a build of prism_megatron._C compiles and links against, recorded before anything is built.

Why: the first GPU run crashed in the backend and its record could not say which interpreter, which
torch (file and version) or which link flags the build used; a distribution Python's LDSHARED can
differ from the build machines' pyenv one. This prints them first, so a crash report carries them.
It never imports prism_megatron._C (that import may be what crashes): it lists the module files and
asks a child interpreter what the module records about its build.

Usage, from the repository root::

    python -m tools.build_env [--json PATH]

Prints one ``key: value`` line per fact as it is found (the interpreter and the link flags first,
then torch, the tools and the built module); ``--json`` also writes them as a JSON object.
"""

from __future__ import annotations

import argparse
import glob
import json
import os
import platform
import shutil
import subprocess
import sys
import sysconfig
import time
from collections.abc import Iterator
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
LINK_VARS = ("CC", "CXX", "LDSHARED", "LDCXXSHARED", "CFLAGS", "LDFLAGS", "CCSHARED", "EXT_SUFFIX")
ENV_VARS = (
    *("CC", "CXX", "LDSHARED", "CFLAGS", "CXXFLAGS", "CPPFLAGS", "LDFLAGS"),
    *("CUDA_HOME", "TORCH_CUDA_ARCH_LIST", "MAX_JOBS", "LD_LIBRARY_PATH", "LD_PRELOAD", "PYTHONPATH"),
)
# glibc's malloc checking (MALLOC_CHECK_) works only with this library preloaded (glibc >= 2.34).
MALLOC_DEBUG_LIBRARIES = (
    "/lib/x86_64-linux-gnu/libc_malloc_debug.so.0",
    "/usr/lib/x86_64-linux-gnu/libc_malloc_debug.so.0",
    "/lib64/libc_malloc_debug.so.0",
    "/usr/lib64/libc_malloc_debug.so.0",
    "/lib/aarch64-linux-gnu/libc_malloc_debug.so.0",
)


def malloc_debug_library() -> str | None:
    """The path of glibc's malloc debug library, or None where it is absent."""
    return next((path for path in MALLOC_DEBUG_LIBRARIES if os.path.exists(path)), None)


def _first_line(argv: list[str], last: bool = False) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        done = subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False)
    except subprocess.TimeoutExpired:
        return None
    lines = [line for line in (done.stdout or done.stderr).splitlines() if line.strip()]
    return (lines[-1] if last else lines[0]) if lines else None


def _torch_facts() -> dict[str, object]:
    try:
        import torch
    except ImportError as error:
        return {"torch": f"not importable: {error}"}
    return {
        "torch": torch.__version__,
        "torch_file": torch.__file__,
        "torch_cuda": torch.version.cuda,
        "torch_git": torch.version.git_version,
        "torch_cxx11_abi": torch.compiled_with_cxx11_abi(),
    }


def _module_facts(root: Path) -> dict[str, object]:
    """The built modules in the package, and what the newest one records (asked in a child)."""
    modules = sorted(glob.glob(str(root / "prism_megatron" / "_C*.so")), key=os.path.getmtime)
    facts: dict[str, object] = {
        "modules": [
            f"{path} ({os.path.getsize(path)} bytes, {time.ctime(os.path.getmtime(path))})"
            for path in modules
        ]
        or "none"
    }
    if modules:
        code = (
            "import torch; from prism_megatron import _C; "
            "print(_C.build_info.torch_version, '|', _C.build_info.compiler, '|', _C.with_cuda)"
        )
        env = {**os.environ, "PYTHONPATH": f"{root}{os.pathsep}{os.environ.get('PYTHONPATH', '')}"}
        try:
            done = subprocess.run(
                [sys.executable, "-c", code], capture_output=True, text=True, timeout=60, env=env, check=False
            )
        except subprocess.TimeoutExpired:
            facts["module_build"] = "import timed out after 60 s"
            return facts
        lines = (done.stdout if done.returncode == 0 else done.stderr).strip().splitlines()
        facts["module_build"] = (
            lines[-1]
            if done.returncode == 0 and lines
            else f"import failed ({done.returncode}): {lines[-1:]}"
        )
    return facts


def facts(root: Path = REPO) -> Iterator[tuple[str, object]]:
    """Every fact, cheapest first, so a step killed early still leaves the interpreter's."""
    yield "python", sys.executable
    yield "python_version", sys.version.replace("\n", " ")
    yield "platform", platform.platform()
    yield "libc", " ".join(platform.libc_ver())
    for name in LINK_VARS:
        yield f"sysconfig_{name}", sysconfig.get_config_var(name)
    for name in ENV_VARS:
        if name in os.environ:
            yield f"env_{name}", os.environ[name]
    yield from _torch_facts().items()
    yield "c++", _first_line(["c++", "--version"])
    yield "nvcc", _first_line(["nvcc", "--version"], last=True)
    yield "ninja", _first_line(["ninja", "--version"])
    yield "gdb", _first_line(["gdb", "--version"])
    yield "malloc_debug_library", malloc_debug_library()
    yield from _module_facts(root).items()


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--json", type=Path, help="also write the facts to this JSON file")
    args = parser.parse_args(argv)
    recorded = {}
    for key, value in facts():
        print(f"{key}: {value}", flush=True)
        recorded[key] = value
    if args.json is not None:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(json.dumps(recorded, indent=2) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
