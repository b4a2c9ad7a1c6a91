"""Everything named in a user-facing table of the README exists as the table says.

The flag tables: every flag is accepted by the built-in entry's parser with the default the table
gives ("—": none, "off": a switch). The layout table: every path is in the repository.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from prism_megatron.megatron.entry import arguments as pretrain_args

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text(encoding="utf-8")


def _rows(first_cell: str) -> list[list[str]]:
    """Table rows whose first cell starts with `first_cell`, split into stripped cells."""
    rows = []
    for line in README.splitlines():
        if line.startswith(f"| {first_cell}"):
            rows.append([cell.strip() for cell in line.strip().strip("|").split("|")])
    return rows


FLAG_ROWS = _rows("`--")


def _flags(cell: str) -> list[str]:
    return re.findall(r"`(--[a-z0-9-]+)`", cell)


def test_the_readme_has_its_flag_tables():
    flags = [f for row in FLAG_ROWS for f in _flags(row[0])]
    assert "--prism-emulate" in flags and "--tensorboard-dir" in flags and len(flags) > 20


@pytest.mark.parametrize("row", FLAG_ROWS, ids=lambda row: row[0])
def test_every_flag_in_a_readme_table_parses_with_the_default_it_states(row):
    parser = pretrain_args.build_parser()
    actions = {option: action for action in parser._actions for option in action.option_strings}
    for flag in _flags(row[0]):
        assert flag in actions, f"README names {flag}, which the entry does not accept"
        action = actions[flag]
        default = row[1].strip("`")
        if default == "off":
            assert action.nargs == 0 and action.default is False, flag
        elif default == "—":
            assert action.default in (None, "", True), (
                f"{flag}: README says no default, parser has {action.default!r}"
            )
        else:
            assert str(action.default) == default, (
                f"{flag}: README says {default}, parser has {action.default!r}"
            )


LAYOUT_ROWS = _rows("`prism_megatron/") + _rows("`launch/") + _rows("`benchmarks/")


@pytest.mark.parametrize("row", LAYOUT_ROWS, ids=lambda row: row[0])
def test_every_path_in_the_layout_table_exists(row):
    for path in re.findall(r"`([^`]+)`", row[0]):
        assert (REPO / path).exists(), f"README's layout table names {path}, which does not exist"
