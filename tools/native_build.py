"""Forced builds of prism_megatron._C from empty build folders: every GPU build and `make cuda-check`.

Why: three mechanisms can put objects of older sources into a module, and one of them did on the
first GPU run (a segmentation fault at backend creation): setuptools skips an extension whose module
in the build folder is newer than its sources and then copies that old module into place; ninja
trusts modification times; a warm machine keeps every ignored file. A build here empties its folders
first, passes ``--force``, and removes the module it replaces before compiling, so a failed build
leaves no older module behind for later steps to import.

It runs ``setup.py`` (the one definition of the extension) with this interpreter. A *part* builds
the module core and some components only, so a component that does not compile under the lent
machine's torch does not hide the GPU checks of the others:

- ``full``: every source (setup.py's own build);
- ``backend``: the replay engine and the prism backend (with the clock, part of the replay folder);
- ``clock``: the clock and its device wait kernel alone.

Usage, from the repository root::

    python -m tools.native_build [--part full|backend|clock] [--inplace | --out DIR] [--work DIR]
                                 [--debug-symbols]

``--inplace`` replaces ``prism_megatron/_C*.so`` (the default); ``--out DIR`` leaves the module in
``DIR/prism_megatron/`` and the package's own untouched. ``--work`` (default ``build/native-<part>``)
holds the objects and is emptied first. ``--debug-symbols`` compiles with ``-g1``. Prints the
module's path and the build's duration; exits non-zero when the build fails.
"""

from __future__ import annotations

import argparse
import glob
import os
import shutil
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parent.parent
PARTS: dict[str, tuple[str, ...] | None] = {
    "full": None,
    "backend": ("csrc/replay/*.cpp", "csrc/backend/*.cpp"),
    "clock": ("csrc/replay/clock.cpp", "csrc/replay/clock_bindings.cpp"),
}
MODULE_GLOB = "prism_megatron/_C*.so"


def part_sources(part: str, root: Path = REPO) -> list[str] | None:
    """The csrc/ paths a part builds besides the core (None: everything)."""
    if part not in PARTS:
        raise ValueError(f"--part must be one of {sorted(PARTS)}, got {part!r}")
    patterns = PARTS[part]
    if patterns is None:
        return None
    found = sorted({os.path.relpath(p, root) for pattern in patterns for p in glob.glob(str(root / pattern))})
    if not found:
        raise ValueError(f"part {part!r}: no source under {root} matches {list(patterns)}")
    return found


def _empty(folder: Path) -> Path:
    shutil.rmtree(folder, ignore_errors=True)
    folder.mkdir(parents=True)
    return folder


def build(
    *,
    part: str = "full",
    out: Path | None = None,
    work: Path | None = None,
    debug_symbols: bool = False,
    root: Path = REPO,
    python: str = sys.executable,
) -> Path:
    """Build the part from scratch; returns the module's path.

    Args:
        part: a key of PARTS.
        out: the folder to leave ``prism_megatron/_C*.so`` in (emptied first); None: in place,
            replacing ``root/prism_megatron/_C*.so``.
        work: the folder for objects (emptied first); default ``root/build/native-<part>``.
        debug_symbols: compile with -g1 (native backtraces name functions and lines).
        root: the repository (the folder holding setup.py and csrc/).
        python: the interpreter whose torch the build uses.

    Raises:
        ValueError: an unknown part, or a root without setup.py.
        subprocess.CalledProcessError: the build failed (its output went to this process's).
    """
    root = Path(root).resolve()
    if not (root / "setup.py").is_file():
        raise ValueError(f"{root} holds no setup.py: give the repository root")
    sources = part_sources(part, root)
    work = _empty(Path(work) if work is not None else root / "build" / f"native-{part}")
    lib = _empty(Path(out)) if out is not None else work / "lib"
    if out is None:
        for old in glob.glob(str(root / MODULE_GLOB)):
            os.remove(old)  # a failed build must leave no older module to import
    env = dict(os.environ)
    env.pop("PRISM_NO_EXTENSION", None)
    if sources is not None:
        env["PRISM_SOURCES"] = " ".join(sources)
    if debug_symbols:
        env["PRISM_DEBUG_SYMBOLS"] = "1"
    command = [python, "setup.py", "build_ext", "--force", "--build-temp", str(work / "temp")]
    command += ["--build-lib", str(lib)]
    subprocess.run(command, cwd=root, env=env, check=True)
    built = glob.glob(str(lib / MODULE_GLOB))
    if len(built) != 1:
        raise RuntimeError(f"the build left {len(built)} modules matching {lib / MODULE_GLOB}, expected one")
    if out is not None:
        return Path(built[0])
    target = root / "prism_megatron" / os.path.basename(built[0])
    shutil.copyfile(built[0], target)
    return target


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--part", default="full", choices=sorted(PARTS), help="what to build (default full)")
    where = parser.add_mutually_exclusive_group()
    where.add_argument("--inplace", action="store_true", help="replace prism_megatron/_C*.so (the default)")
    where.add_argument("--out", type=Path, help="leave the module in OUT/prism_megatron/ instead")
    parser.add_argument(
        "--work", type=Path, help="folder for objects, emptied first (default build/native-PART)"
    )
    parser.add_argument("--debug-symbols", action="store_true", help="compile with -g1")
    parser.add_argument("--root", type=Path, default=REPO, help="the repository root (default: this one)")
    args = parser.parse_args(argv)
    start_s = time.monotonic()
    try:
        module = build(
            part=args.part, out=args.out, work=args.work, debug_symbols=args.debug_symbols, root=args.root
        )
    except subprocess.CalledProcessError as error:
        print(f"native_build: the {args.part} build failed (exit status {error.returncode})", file=sys.stderr)
        return 1
    except ValueError as error:
        print(f"native_build: {error}", file=sys.stderr)
        return 2
    print(f"native_build: {args.part} build of {module} in {time.monotonic() - start_s:.0f} s")
    return 0


if __name__ == "__main__":
    sys.exit(main())
