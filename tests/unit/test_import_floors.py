"""Imports run one way, from the top floor down (prism_megatron/README.md): each unit imports only
units on its floor or below, and nothing below floor 3 imports Megatron.

The floors are read from the README's table, so the table and this check cannot drift apart. Every
import statement counts, those inside functions too (a lazy import is still a dependency), and so
do those under `if TYPE_CHECKING:` (a type a module names is a concept it depends on).
"""

from __future__ import annotations

import ast
import pathlib
import re

PACKAGE = pathlib.Path(__file__).resolve().parents[2] / "prism_megatron"
README = PACKAGE / "README.md"
MEGATRON_FLOOR = 3
"""The lowest floor that may import megatron-core or Megatron-LM."""
NO_TORCH = ("topology", "files", "config", "target")
"""Units the README says import no torch at all (topology answers for any W without it)."""


def floors(text: str | None = None) -> dict[str, int]:
    """Unit (a package, sub-package or module path, e.g. `megatron/job`, `cli`) -> floor, from the
    README's table (or from `text`, a table in the README's form)."""
    table = {}
    for line in (README.read_text(encoding="utf-8") if text is None else text).splitlines():
        match = re.match(r"\|\s*(\d+)\s*\|([^|]*)\|", line)
        if match:
            for name in re.findall(r"`([^`]+)`", match.group(2)):
                table[name.removesuffix("/").removesuffix(".py")] = int(match.group(1))
    return table


def unit_of(relative: str, table: dict[str, int]) -> str | None:
    """The longest unit of `table` that `relative` (a path below prism_megatron/ without `.py`, or a
    dotted module name below it written with /) starts with; None when none does."""
    parts = relative.split("/")
    for k in range(len(parts), 0, -1):
        candidate = "/".join(parts[:k])
        if candidate in table:
            return candidate
    return None


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


def offences(source: str, relative_path: str, table: dict[str, int]) -> list[str]:
    """Every import of `source` (the file at `relative_path` below prism_megatron/) that goes up a
    floor, imports Megatron below floor 3, or imports torch from a unit that must not."""
    stem = relative_path.removesuffix(".py")
    unit = unit_of(stem, table)
    if unit is None:
        return [f"{relative_path}: on no floor; add its package to prism_megatron/README.md's table"]
    floor = table[unit]
    package = ".".join(("prism_megatron", *relative_path.split("/")[:-1]))
    found = []
    for line, module in imported(source, package):
        parts = module.split(".")
        where = f"{relative_path}:{line} ({unit}, floor {floor}) imports {module}"
        if parts[0] == "megatron" and floor < MEGATRON_FLOOR:
            found.append(f"{where}: Megatron below floor {MEGATRON_FLOOR}")
        elif parts[0] == "torch" and unit in NO_TORCH:
            found.append(f"{where}: torch in a unit that imports none")
        elif parts[0] == "prism_megatron" and len(parts) > 1:
            # `from prism_megatron import __version__`: a name of the package's own __init__
            other = unit_of("__init__" if parts[1].startswith("__") else "/".join(parts[1:]), table)
            if other is None:
                found.append(f"{where}: a module on no floor")
            elif other != unit and table[other] > floor:
                found.append(f"{where} ({other}, floor {table[other]}): up a floor")
    return found


def test_the_readme_places_every_module_on_a_floor():
    table = floors()
    unplaced = [
        str(p.relative_to(PACKAGE))
        for p in PACKAGE.rglob("*.py")
        if unit_of(str(p.relative_to(PACKAGE))[:-3], table) is None
    ]
    assert unplaced == [], "add these to prism_megatron/README.md's floor table"
    assert table["launch"] == max(table.values()) and table["topology"] == 0
    assert table["patches"] < table["megatron/run"] and table["passes"] < table["patches"]


def test_no_import_goes_up_a_floor_or_reaches_megatron_or_torch_where_it_must_not():
    table = floors()
    found = []
    for path in sorted(PACKAGE.rglob("*.py")):
        found += offences(path.read_text(encoding="utf-8"), str(path.relative_to(PACKAGE)), table)
    assert found == [], "imports that break the floors:\n" + "\n".join(found)


def test_the_check_rejects_an_upward_import_added_on_purpose():
    """The same check as above, over snippets: each line here would break a floor of the real table."""
    table = floors()
    upward = {
        "patches/training.py": "from prism_megatron.megatron.run import runtime\n",
        "passes/rank.py": "def f():\n    from prism_megatron.emulation import driver\n",
        "megatron/job/target.py": "from prism_megatron.megatron.entry import arguments\n",
        "report/flops.py": "from prism_megatron.megatron.job.target import derive\n",
        "commands/emulate.py": "from prism_megatron.cli import main\n",
        "topology/layout.py": "from prism_megatron.graph import ExecutionGraph\n",
        "emulation/plan.py": "import prism_megatron.commands.emulate\n",
        "sim/engine.py": "from megatron.core import parallel_state\n",
        "target/job.py": "import torch\n",
    }
    for path, source in upward.items():
        assert len(offences(source, path, table)) == 1, (path, source)
    # ... and the same imports the other way round are allowed.
    assert offences("from prism_megatron.passes import rank\n", "megatron/run/runtime.py", table) == []
    assert offences("from prism_megatron.target import TargetJob\n", "report/model.py", table) == []


def test_a_finer_table_is_read_with_its_sub_packages():
    table = floors("| 2 | `a/b/`, `c.py` |\n| 1 | `a/` |\n")
    assert table == {"a/b": 2, "c": 2, "a": 1}
    assert unit_of("a/b/x", table) == "a/b" and unit_of("a/y", table) == "a" and unit_of("d", table) is None
    assert offences("from prism_megatron.a.b import x\n", "a/y.py", table) != []
    assert offences("from prism_megatron.a import y\n", "a/b/x.py", table) == []


def test_the_check_sees_function_level_and_relative_imports():
    source = "def f():\n    from prism_megatron.megatron.job import target\n    from . import x\n"
    assert imported(source, "prism_megatron.topology") == [
        (2, "prism_megatron.megatron.job.target"),
        (3, "prism_megatron.topology.x"),
    ]
