"""Configuration files of production jobs: Megatron-LM flags, one per line, read into an argv list.

A configuration (`launch/configs/*.args`) is the flag list a production job was launched with, kept as
plain text so that a shell wrapper, the `plan` command and a reviewer all read the same thing:

    # Source: where the configuration comes from (first comment lines; see `header`)
    --num-layers 126                # a comment may follow a flag after whitespace
    --rampup-batch-size 16 16 5859375
    --prism-world-size 16384

Rules (kept identical in `launch/emulate.sh` and `launch/prism.sbatch`, which read the same files):
a `#` at the start of a line or after whitespace starts a comment that runs to the end of the line;
blank lines are skipped; every other line is split on whitespace and its first word must be a flag
(`--name`). Nothing is expanded: `$VAR`, `~` and globs stay literal, so a file means the same thing in
every shell and in Python. `--prism-ranks` does not belong in a file: which ranks run real is chosen
on the command line for each run.

This module is pure (no torch, no Megatron) so that tests and tools can read configurations cheaply.
"""

from __future__ import annotations

import re
from pathlib import Path

_COMMENT = re.compile(r"(^|\s)#.*$")

WORLD_SIZE_FLAG = "--prism-world-size"
"""The flag a configuration uses to say how many GPUs the target job has (the virtual world)."""

FORBIDDEN_FLAGS = ("--prism-ranks",)
"""Flags that choose a run rather than describe a job; they belong on the command line."""


def _strip_comment(line: str) -> str:
    return _COMMENT.sub("", line).strip()


def read_config(path: str | Path) -> list[str]:
    """Return the flags of a configuration file as an argv list (comments and blank lines removed).

    Raises:
        ValueError: a line does not start with a flag, or the file sets a flag listed in
            `FORBIDDEN_FLAGS`; the message names the file and line.
    """
    path = Path(path)
    argv: list[str] = []
    for number, raw in enumerate(path.read_text(encoding="utf-8").splitlines(), start=1):
        words = _strip_comment(raw).split()
        if not words:
            continue
        if not words[0].startswith("--"):
            raise ValueError(
                f"{path}:{number}: expected a flag such as '--num-layers 32' at the start of the line, "
                f"got {words[0]!r}"
            )
        if words[0] in FORBIDDEN_FLAGS:
            raise ValueError(
                f"{path}:{number}: {words[0]} chooses which ranks run and belongs on the command line "
                "(--ranks), not in a configuration file"
            )
        argv.extend(words)
    return argv


def header(path: str | Path) -> list[str]:
    """Return the leading comment lines of a configuration (its source and the choices made), unprefixed."""
    lines = []
    for raw in Path(path).read_text(encoding="utf-8").splitlines():
        stripped = raw.strip()
        if not stripped.startswith("#"):
            break
        lines.append(stripped.lstrip("#").strip())
    return lines


def flag_value(argv: list[str], flag: str) -> str | None:
    """The value the last `flag` in `argv` gives (`--flag VALUE` or `--flag=VALUE`), as argparse would take it."""
    value = None
    for index, word in enumerate(argv):
        if word == flag and index + 1 < len(argv):
            value = argv[index + 1]
        elif word.startswith(flag + "="):
            value = word.split("=", 1)[1]
    return value


def world_size_of(argv: list[str]) -> int | None:
    """The target job's number of GPUs (`--prism-world-size`), or None when `argv` does not say."""
    value = flag_value(argv, WORLD_SIZE_FLAG)
    if value is None:
        return None
    try:
        return int(value)
    except ValueError:
        raise ValueError(f"{WORLD_SIZE_FLAG} must be a positive integer, got {value!r}") from None


def is_config_path(text: str) -> bool:
    """True when `text` names an existing file (the `plan` command's CONFIG_OR_FLAGS argument)."""
    return not text.startswith("-") and Path(text).is_file()
