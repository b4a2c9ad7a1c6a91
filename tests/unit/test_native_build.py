"""The extension's build and load guards: no stale module, no mixed objects, no other torch.

- A build through `tools.native_build` (the path of every GPU build and `make cuda-check`) after a
  header change compiles the new layout: it is forced and starts from empty folders, where
  setuptools alone would skip the extension (its module newer than its .cpp sources) and ninja
  would trust modification times.
- A module linked from objects of two header versions (what a reused build folder once produced,
  and what crashed the first GPU run) refuses to load, naming the class and both objects.
- The module refuses to load under another torch than the one it was built against, naming both.

The build test compiles a small tree: the module core (module.cpp, build_info.cpp, the same files
the real module starts from) and two probe units sharing one header, through the repository's own
setup.py and tools.native_build.
"""

from __future__ import annotations

import glob
import json
import os
import shutil
import subprocess
import sys
import sysconfig
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
CORE_FILES = ("csrc/module.cpp", "csrc/build_info.cpp", "csrc/registry.h", "csrc/abi_probe.h")
PROBE_HEADER = """#pragma once
#include "abi_probe.h"
struct StampProbe {{
  long members[{num_members}];
}};
PRISM_ABI_PROBE(StampProbe, StampProbe)
"""
PROBE_UNITS = ("csrc/probe/probe_a.cpp", "csrc/probe/probe_b.cpp")


def run_python(code: str, cwd: Path, pythonpath: Path) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(pythonpath)}
    return subprocess.run(
        [sys.executable, "-c", code], cwd=cwd, env=env, capture_output=True, text=True, timeout=120
    )


def load_probes(package_root: Path) -> subprocess.CompletedProcess:
    code = (
        "import json, torch; import prism_megatron._C as C; print(json.dumps(C.build_info.layout_probes()))"
    )
    return run_python(code, package_root, package_root)


def stamp_sizes(done: subprocess.CompletedProcess) -> dict[str, int]:
    assert done.returncode == 0, done.stderr[-2000:]
    probes = json.loads(done.stdout.strip().splitlines()[-1])
    return {Path(unit).name: size for name, unit, size, _ in probes if name == "StampProbe"}


def write_tree(root: Path, num_members: int) -> None:
    for name in CORE_FILES:
        (root / name).parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO / name, root / name)
    shutil.copyfile(REPO / "setup.py", root / "setup.py")
    (root / "prism_megatron").mkdir(exist_ok=True)
    (root / "prism_megatron" / "__init__.py").write_text("")
    (root / "csrc" / "probe").mkdir(exist_ok=True)
    (root / "csrc" / "probe" / "stamp.h").write_text(PROBE_HEADER.format(num_members=num_members))
    for unit in PROBE_UNITS:
        (root / unit).write_text('#include "probe/stamp.h"\n')


def link(objects: list[str], out: Path) -> None:
    """Link objects into a module the way a reused build folder would have (no compile step)."""
    from torch.utils import cpp_extension

    out.parent.mkdir(parents=True, exist_ok=True)
    libraries = ["-lc10", "-ltorch", "-ltorch_cpu", "-ltorch_python"]
    library_dirs = [f"-L{path}" for path in cpp_extension.library_paths()]
    command = ["c++", "-shared", *objects, *library_dirs, *libraries, "-o", str(out)]
    subprocess.run(command, check=True, capture_output=True, text=True)


@pytest.mark.slow
def test_a_header_change_reaches_the_next_build_and_mixed_objects_refuse_to_load(tmp_path, monkeypatch):
    from tools import native_build

    # The CPU variant under any torch: with a CUDA torch (the Python 3.12 pair) the probe tree would
    # otherwise try to link the CUDA runtime wherever torch guesses the toolkit is; staleness is the same.
    monkeypatch.setenv("PRISM_FORCE_CPU", "1")

    tree = tmp_path / "tree"
    write_tree(tree, num_members=1)
    work = tmp_path / "objects"
    module_v1 = native_build.build(root=tree, work=work)
    assert stamp_sizes(load_probes(tree)) == {"probe_a.cpp": 8, "probe_b.cpp": 8}
    old_objects = tmp_path / "objects-v1"
    shutil.copytree(work, old_objects)
    # Modules from the future: setuptools alone would skip the next build and keep them.
    for module in [module_v1, *glob.glob(str(work / "**" / "_C*.so"), recursive=True)]:
        os.utime(module, (2**31, 2**31))

    (tree / "csrc" / "probe" / "stamp.h").write_text(PROBE_HEADER.format(num_members=4))
    native_build.build(root=tree, work=work)  # the same folders, as a warm machine has them
    assert stamp_sizes(load_probes(tree)) == {"probe_a.cpp": 32, "probe_b.cpp": 32}, "the build was stale"

    # probe_a.o of the first build with everything else of the second: the import must refuse.
    new = {Path(p).name: p for p in glob.glob(str(work / "temp" / "**" / "*.o"), recursive=True)}
    old = {Path(p).name: p for p in glob.glob(str(old_objects / "temp" / "**" / "*.o"), recursive=True)}
    assert {"probe_a.o", "probe_b.o", "module.o", "build_info.o"} <= new.keys(), sorted(new)
    mixed = tmp_path / "mixed"
    suffix = sysconfig.get_config_var("EXT_SUFFIX")
    link(
        [old["probe_a.o"], *(path for name, path in new.items() if name != "probe_a.o")],
        mixed / "prism_megatron" / f"_C{suffix}",
    )
    (mixed / "prism_megatron" / "__init__.py").write_text("")
    done = load_probes(mixed)
    assert done.returncode != 0
    assert "ImportError" in done.stderr and "disagree on the layout of StampProbe" in done.stderr, done.stderr
    assert "csrc/probe/probe_a.cpp" in done.stderr and "csrc/probe/probe_b.cpp" in done.stderr
    assert "8 bytes" in done.stderr and "32 bytes" in done.stderr


def test_the_module_refuses_another_torch_and_names_both_versions():
    code = "import torch; torch.__version__ = '0.0.0+elsewhere'; from prism_megatron import _C"
    done = run_python(code, REPO, REPO)
    assert done.returncode != 0
    import torch

    assert "ImportError" in done.stderr, done.stderr[-2000:]
    assert f"built against torch {torch.__version__}" in done.stderr, done.stderr[-2000:]
    assert "imported by torch 0.0.0+elsewhere" in done.stderr, done.stderr[-2000:]


def test_every_unit_of_the_module_agrees_on_the_backend_layout():
    import torch  # before _C: the extension links libc10

    from prism_megatron import _C

    probes = _C.build_info.layout_probes()
    units = {Path(unit).name for name, unit, _, _ in probes if name == "PrismBackend"}
    # The unit that allocates the backend and the ones that define its methods all report.
    assert {"backend.cpp", "backend_bindings.cpp", "reduce_ops.cpp"} <= units, sorted(units)
    for name in {name for name, *_ in probes}:
        assert len({(size, align) for other, _, size, align in probes if other == name}) == 1, name
    assert _C.build_info.torch_version == torch.__version__


def test_native_build_names_what_is_wrong():
    from tools import native_build

    with pytest.raises(ValueError, match="--part must be one of"):
        native_build.part_sources("everything")
    assert native_build.part_sources("clock") == ["csrc/replay/clock.cpp", "csrc/replay/clock_bindings.cpp"]
    assert native_build.main(["--root", str(REPO / "csrc")]) == 2  # no setup.py there


# ---- what a build says before it compiles (setup.py's checks) -----------------------------------


def _setup_module():
    """setup.py as a module: its checks, without running setup() (it runs only as __main__)."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("prism_setup", REPO / "setup.py")
    module = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(module)
    return module


def test_an_isolated_build_against_another_torch_stops_with_one_line_saying_what_to_do():
    setup = _setup_module()
    pip_env = "/tmp/pip-build-env-x1/overlay/lib/python3.11/site-packages/torch"
    problem = setup.isolation_problem("2.14.1", pip_env, "2.13.0+cpu")
    assert problem is not None and "\n" not in problem
    assert "torch 2.14.1" in problem and "runs torch 2.13.0+cpu" in problem
    assert "pip install --no-build-isolation ." in problem
    fresh = setup.isolation_problem("2.14.1", pip_env, None)
    assert fresh is not None and "has no torch yet" in fresh and "install torch first" in fresh
    # the torch it will run with: no objection, isolated or not
    assert setup.isolation_problem("2.13.0+cpu", pip_env, "2.13.0+cpu") is None
    assert (
        setup.isolation_problem("2.13.0+cpu", "/venv/lib/python3.11/site-packages/torch", "2.13.0+cpu")
        is None
    )


def test_a_cuda_build_without_headers_names_the_toolkit_nvcc_runs_from(tmp_path):
    setup = _setup_module()
    guessed, toolkit = tmp_path / "usr-local", tmp_path / "cuda-13.0"
    (guessed / "include").mkdir(parents=True)
    (toolkit / "include").mkdir(parents=True)
    (toolkit / "include" / "cuda_runtime_api.h").write_text("")
    problem = setup.cuda_headers_problem(str(guessed), [str(guessed / "include")], str(toolkit))
    assert problem is not None and "\n" not in problem
    assert f"CUDA_HOME={guessed}" in problem and f"rerun with CUDA_HOME={toolkit}" in problem
    assert "PRISM_FORCE_CPU=1" in problem
    assert "set CUDA_HOME to the CUDA toolkit" in setup.cuda_headers_problem(str(guessed), [], None)
    assert setup.cuda_headers_problem(str(toolkit), [str(toolkit / "include")], str(toolkit)) is None


def test_the_toolkit_is_read_from_nvccs_own_dry_run(tmp_path, monkeypatch):
    """A wrapper `nvcc` (a script in /usr/local/bin calling the real one) hides the toolkit's folder."""
    setup = _setup_module()
    fake = tmp_path / "bin" / "nvcc"
    fake.parent.mkdir()
    fake.write_text(
        '#!/bin/sh\necho "#\\$ _NVVM_BRANCH_=nvvm" >&2\necho "#\\$ TOP=/opt/cuda-13.0/bin/.." >&2\n'
    )
    fake.chmod(0o755)
    monkeypatch.setenv("PATH", f"{fake.parent}:{os.environ['PATH']}")
    assert setup._nvcc_toolkit() == "/opt/cuda-13.0"
    monkeypatch.setenv("PATH", str(tmp_path / "nowhere"))
    assert setup._nvcc_toolkit() is None
