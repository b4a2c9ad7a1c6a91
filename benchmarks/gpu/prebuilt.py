"""The prebuilt ``_C`` module carried to the lent GPU machine: which sources and torch it was built for.

Why: the lent machine has a few minutes in all, and building the extension there takes one or two
of them. ``make prebuilt-gpu`` builds the module here for that machine's pair (Python 3.12, torch
2.11.0+cu130, nvcc 13.0, sm_90) and records what it was built from; run.sh imports it there only when
the sources it was sent and its torch are the ones recorded, and builds there otherwise (a stale
module would test code that is not the code under test).

Usage, from the repository root::

    python -m benchmarks.gpu.prebuilt --write DIR   # after the build: DIR/built_from.json
    python -m benchmarks.gpu.prebuilt --check DIR   # exit 0: DIR/prism_megatron holds a module for
                                                    # these sources and this torch, and it loads
                                                    # with CUDA; else exit 1 and why not
"""

from __future__ import annotations

import argparse
import hashlib
import json
import os
import sys
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
RECORD = "built_from.json"
SOURCE_SUFFIXES = {".cpp", ".h", ".cu", ".cuh"}


def sources_sha1(root: Path = REPO) -> str:
    """One hash of setup.py and every C++/CUDA source under csrc/, by path and content."""
    digest = hashlib.sha1()
    paths = [root / "setup.py", *(p for p in (root / "csrc").rglob("*") if p.suffix in SOURCE_SUFFIXES)]
    for path in sorted(paths):
        digest.update(str(path.relative_to(root)).encode() + b"\0" + path.read_bytes() + b"\0")
    return digest.hexdigest()


def _torch_pair() -> dict[str, str]:
    import torch

    return {"torch": torch.__version__, "python": f"{sys.version_info.major}.{sys.version_info.minor}"}


def write(folder: Path) -> dict:
    modules = sorted((folder / "prism_megatron").glob("_C*.so"))
    if len(modules) != 1:
        raise ValueError(f"{folder}/prism_megatron holds {len(modules)} _C modules, expected one")
    record = {"sources_sha1": sources_sha1(), "module": modules[0].name, **_torch_pair()}
    (folder / RECORD).write_text(json.dumps(record, indent=2) + "\n")
    return record


def check(folder: Path) -> str | None:
    """None when the folder's module fits this tree and this interpreter's torch; else why not."""
    path = folder / RECORD
    if not path.is_file():
        return f"no prebuilt module: {path} does not exist (make prebuilt-gpu writes it)"
    record = json.loads(path.read_text())
    if not (folder / "prism_megatron" / record["module"]).is_file():
        return f"{folder}/prism_megatron/{record['module']} is missing"
    if record["sources_sha1"] != sources_sha1():
        return "the prebuilt module was built from other sources than these"
    here = _torch_pair()
    if {k: record[k] for k in here} != here:
        return f"the prebuilt module is for torch {record['torch']} on Python {record['python']}, not {here}"
    return _imports(folder / "prism_megatron")


def _imports(native_dir: Path) -> str | None:
    """None when the module loads here with CUDA (another image's system libraries may refuse it)."""
    import prism_megatron

    prism_megatron.__path__.insert(0, str(native_dir.resolve()))
    try:
        from prism_megatron import _C
    except ImportError as error:
        return f"the prebuilt module does not load here: {error}"
    finally:
        prism_megatron.__path__.remove(str(native_dir.resolve()))
    if Path(_C.__file__).resolve().parent != native_dir.resolve():
        return f"imported {_C.__file__}, not the prebuilt module"
    if not _C.with_cuda:
        return "the prebuilt module was built without CUDA"
    return None


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    what = parser.add_mutually_exclusive_group(required=True)
    what.add_argument("--write", type=Path, metavar="DIR", help="record what DIR's module was built from")
    what.add_argument("--check", type=Path, metavar="DIR", help="exit 0 when DIR's module fits this tree")
    args = parser.parse_args(argv)
    if args.write:
        try:
            print(json.dumps(write(args.write)))
        except ValueError as error:
            print(f"prebuilt: {error}", file=sys.stderr)
            return 2
        return 0
    why = check(args.check)
    if why is not None:
        print(why)
        return 1
    print(f"prebuilt module fits: {os.path.join(args.check, 'prism_megatron')}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
