"""Imports run one way, from the top floor down (prism_megatron/README.md): each package imports only
packages on its floor or below, and nothing below floor 4 imports Megatron.

The floors are read from the README's table, so the table and this check cannot drift apart. Every
import statement counts, those inside functions too (a lazy import is still a dependency).
"""

from __future__ import annotations

import ast
import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "prism_megatron"
README = PACKAGE / "README.md"
NO_TORCH = ("topology", "files")
"""Packages the README says import no torch at all (topology answers for any W without it)."""


def floors() -> dict[str, int]:
    """Package (or top-level module) name -> floor, from the README's table."""
    table = {}
    for line in README.read_text(encoding="utf-8").splitlines():
        match = re.match(r"\|\s*(\d)\s*\|([^|]*)\|", line)
        if match:
            for name in re.findall(r"`([^`]+)`", match.group(2)):
                table[name.removesuffix("/").removesuffix(".py")] = int(match.group(1))
    return table


def unit_of(path: pathlib.Path) -> str:
    parts = path.relative_to(PACKAGE).parts
    return parts[0] if len(parts) > 1 else path.stem


def imported(source: str, package: str) -> list[tuple[int, str]]:
    """(line, module) for every import in `source` (a module of `package`), relative imports resolved."""
    found = []
    for node in ast.walk(ast.parse(source)):
        if isinstance(node, ast.Import):
            found += [(node.lineno, alias.name) for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = package.split(".")[: len(package.split(".")) - node.level + 1]
                base = ".".join([*anchor, *([base] if base else [])])
            found += [(node.lineno, f"{base}.{alias.name}") for alias in node.names]
    return found


def imports_of(path: pathlib.Path) -> list[tuple[int, str]]:
    package = ".".join(("prism_megatron", *path.relative_to(PACKAGE).parts[:-1]))
    return imported(path.read_text(encoding="utf-8"), package)


def target_unit(module: str) -> str | None:
    parts = module.split(".")
    if parts[0] != "prism_megatron" or len(parts) < 2:
        return None
    return parts[1]


def test_the_readme_places_every_package_on_a_floor():
    table = floors()
    units = {unit_of(p) for p in PACKAGE.rglob("*.py")} - {"__init__"}
    assert units - set(table) == set(), "add these to prism_megatron/README.md's floor table"
    assert table["launch"] == 5 and table["topology"] == 1 and table["megatron"] == 4


def test_each_package_imports_only_its_floor_or_below():
    table = {**floors(), "__init__": 1, "__version__": 1}
    upward = []
    for path in sorted(PACKAGE.rglob("*.py")):
        unit = unit_of(path)
        floor = table.get(unit, 1)
        for line, module in imports_of(path):
            other = target_unit(module)
            if other is not None and other != unit and table[other] > floor:
                upward.append(
                    f"{path.relative_to(PACKAGE)}:{line} (floor {floor}) imports {module} (floor {table[other]})"
                )
    assert upward == [], "imports that go up a floor:\n" + "\n".join(upward)


def test_nothing_below_floor_4_imports_megatron_and_the_pure_floor_imports_no_torch():
    table = floors()
    offences = []
    for path in sorted(PACKAGE.rglob("*.py")):
        unit = unit_of(path)
        for line, module in imports_of(path):
            top = module.split(".")[0]
            if (top == "megatron" and table.get(unit, 1) < 4) or (top == "torch" and unit in NO_TORCH):
                offences.append(f"{path.relative_to(PACKAGE)}:{line} imports {module}")
    assert offences == []


def test_the_check_sees_function_level_and_relative_imports():
    source = "def f():\n    from prism_megatron.megatron.job import target\n    from . import x\n"
    assert imported(source, "prism_megatron.topology") == [
        (2, "prism_megatron.megatron.job.target"),
        (3, "prism_megatron.topology.x"),
    ]
