"""pytest imports the test modules of tests/unit, tests/megatron and tests/gpu by their base name
(those folders are not packages), so two test files with one name in two of them stop the whole
run at collection: the suite must not hold such a pair."""

from __future__ import annotations

from collections import defaultdict
from pathlib import Path

TESTS = Path(__file__).resolve().parents[1]


def test_test_modules_outside_packages_have_unique_names():
    folders: dict[str, list[str]] = defaultdict(list)
    for path in TESTS.rglob("test_*.py"):
        if (path.parent / "__init__.py").exists():
            continue
        folders[path.name].append(str(path.parent.relative_to(TESTS)))
    clashes = {name: where for name, where in folders.items() if len(where) > 1}
    assert not clashes, f"test files with one name in several non-package folders: {clashes}"
