"""The prebuilt module for the GPU machine is used only for the sources and torch it was built for,
and only when it loads; anything else sends run.sh to its build there."""

from __future__ import annotations

import importlib.machinery
import json
import subprocess
import sys
from pathlib import Path

import torch

from benchmarks.gpu import prebuilt


def fake_module(folder, name: str = "_C" + importlib.machinery.EXTENSION_SUFFIXES[0]) -> None:
    (folder / "prism_megatron").mkdir(parents=True)
    (folder / "prism_megatron" / name).write_bytes(b"not an ELF file")


def check_fresh(folder) -> str:
    """prebuilt.check in a fresh interpreter, as run.sh calls it: in this one an earlier test may have
    imported the package's own module already, and an imported extension is never loaded again."""
    repo = Path(__file__).resolve().parents[2]
    code = "import sys; from pathlib import Path; from benchmarks.gpu import prebuilt; print(prebuilt.check(Path(sys.argv[1])))"
    done = subprocess.run(
        [sys.executable, "-c", code, str(folder)], cwd=repo, capture_output=True, text=True, timeout=120
    )
    assert done.returncode == 0, done.stderr
    return done.stdout.strip()


def test_the_sources_hash_follows_every_source_and_setup(tmp_path):
    (tmp_path / "csrc" / "replay").mkdir(parents=True)
    (tmp_path / "setup.py").write_text("setup()")
    (tmp_path / "csrc" / "replay" / "a.cpp").write_text("int a;")
    (tmp_path / "csrc" / "notes.md").write_text("not a source")
    before = prebuilt.sources_sha1(tmp_path)
    (tmp_path / "csrc" / "notes.md").write_text("still not a source")
    assert prebuilt.sources_sha1(tmp_path) == before
    (tmp_path / "csrc" / "replay" / "a.cpp").write_text("int b;")
    assert prebuilt.sources_sha1(tmp_path) != before


def test_a_module_is_refused_when_missing_stale_for_another_torch_or_not_loading(tmp_path):
    assert "does not exist" in prebuilt.check(tmp_path)
    fake_module(tmp_path)
    record = prebuilt.write(tmp_path)
    assert record["sources_sha1"] == prebuilt.sources_sha1() and record["torch"] == torch.__version__
    # Everything recorded fits; the module itself does not load: refused, with the loader's reason.
    assert "does not load here" in check_fresh(tmp_path)
    (tmp_path / prebuilt.RECORD).write_text(json.dumps({**record, "sources_sha1": "0" * 40}))
    assert prebuilt.check(tmp_path) == "the prebuilt module was built from other sources than these"
    (tmp_path / prebuilt.RECORD).write_text(json.dumps({**record, "torch": "2.11.0+cu130x"}))
    assert "for torch 2.11.0+cu130x" in prebuilt.check(tmp_path)
    assert prebuilt.main(["--check", str(tmp_path)]) == 1
