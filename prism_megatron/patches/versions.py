"""The megatron-core releases prism's patches were verified on, and which variant of a record each gets.

A patch is a bet on another project's internals, so every record names the exact releases it was
verified on (its drift test and an emulation passed there). Where a target changed between releases
(moved, took new parameters, stopped being imported by name somewhere), the record has one variant
per shape, all under the same name with disjoint `verified_on`; `select` picks the variant of the
installed release. A release no variant names is refused in one line naming it and
`--prism-allow-untested-megatron`; with that flag each record takes the variant of the nearest
verified release below the installed one, and a warning says so.

Supported pairs (README "Versions"): Python 3.11 with megatron-core 0.16.1, Python 3.12 with 0.19.x.
0.17 and 0.18 are refused: their Megatron-LM training loop was not verified (no checkout of those
tags was run), and their megatron-core differs from both neighbours in places the patches touch.
"""

from __future__ import annotations

import importlib.metadata
import warnings
from collections.abc import Iterable, Sequence
from typing import Protocol, TypeVar

from packaging.version import Version

MEGATRON_CORE_DIST = "megatron-core"

MEGATRON_CORE_0_16 = ("0.16.1",)
"""The 0.16 releases verified (Python 3.11 and up)."""
MEGATRON_CORE_0_19 = ("0.19.0", "0.19.2")
"""The 0.19 releases verified (Python 3.12 and up: 0.17 and later require it)."""
EVERY_VERIFIED = MEGATRON_CORE_0_16 + MEGATRON_CORE_0_19
"""For records whose target kept its shape across every verified release."""

ALLOW_FLAG = "--prism-allow-untested-megatron"


class Versioned(Protocol):
    """What `select` reads of a record (`Patch` and `ModePatch` both have it)."""

    name: str
    verified_on: tuple[str, ...]


R = TypeVar("R", bound=Versioned)


class UntestedMegatronError(ValueError):
    """The installed megatron-core is not a release the patches were verified on (a user's choice to
    make: a ValueError, so the command line prints it as one line and exits 2)."""


def installed_megatron_core_version() -> str:
    return importlib.metadata.version(MEGATRON_CORE_DIST)


def _verifies(record: Versioned, version: Version) -> bool:
    return version in {Version(v) for v in record.verified_on}


def _nearest_below(variants: Sequence[Versioned], version: Version) -> Versioned:
    """The variant verified on the newest release at or below `version`; the oldest if none is."""

    def newest_below(record: Versioned) -> Version | None:
        below = [Version(v) for v in record.verified_on if Version(v) <= version]
        return max(below) if below else None

    below = [(newest_below(r), i) for i, r in enumerate(variants) if newest_below(r) is not None]
    if below:
        return variants[max(below)[1]]
    return min(variants, key=lambda r: min(Version(v) for v in r.verified_on))


def verified_releases(records: Iterable[Versioned]) -> list[str]:
    """Releases on which every record (by name) has a verified variant, oldest first."""
    by_name: dict[str, set[Version]] = {}
    for record in records:
        by_name.setdefault(record.name, set()).update(Version(v) for v in record.verified_on)
    if not by_name:
        return []
    common = set.intersection(*by_name.values())
    return [str(v) for v in sorted(common)]


def untested_message(installed: str, records: Iterable[Versioned]) -> str:
    verified = ", ".join(verified_releases(records)) or "none"
    return (
        f"megatron-core {installed} is not a release prism's patches were verified on ({verified}): "
        f"install one of those, or pass {ALLOW_FLAG} to patch it anyway at your own risk"
    )


def select(
    records: Iterable[R], *, installed: str | None = None, allow_untested: bool = False
) -> tuple[R, ...]:
    """One variant per record name, for the installed megatron-core, in the order names first appear.

    Raises:
        UntestedMegatronError: some record has no variant verified on `installed` (unless
            `allow_untested`: then those records take their nearest variant below, with a warning).
        ValueError: two variants of one record both claim `installed`.
    """
    records = list(records)
    installed = installed or installed_megatron_core_version()
    version = Version(installed)
    variants: dict[str, list[R]] = {}
    for record in records:
        variants.setdefault(record.name, []).append(record)
    chosen: list[R] = []
    untested = False
    for name, group in variants.items():
        matching = [r for r in group if _verifies(r, version)]
        if len(matching) > 1:
            raise ValueError(f"patch {name}: {len(matching)} variants claim megatron-core {installed}")
        if matching:
            chosen.append(matching[0])
            continue
        untested = True
        chosen.append(_nearest_below(group, version))
    if untested:
        message = untested_message(installed, records)
        if not allow_untested:
            raise UntestedMegatronError(message)
        warnings.warn(message, stacklevel=3)
    return tuple(chosen)
