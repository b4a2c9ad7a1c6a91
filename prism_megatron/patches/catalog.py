"""Every patch prism can apply, in one table (`--prism-list-patches`, the README, the drift tests).

A record describes a change; a run binds the records that depend on it (`registry.bind`) when it
applies them, so the catalog lists them all without a run.
"""

from __future__ import annotations

import os
import sys

from prism_megatron import files
from prism_megatron.patches import (
    control_flow,
    cpu_shim,
    model_build,
    parallel_state,
    pipeline,
    registry,
    versions,
)


def all_patches() -> tuple[registry.AnyRecord, ...]:
    """Records in the order a CPU emulation applies them (Megatron-LM's after: only its script uses
    them), then the records of model builds (the plan, the built-in entry's MLA)."""
    from prism_megatron.patches import modelled_device, training

    return (
        *cpu_shim.MEGATRON_CORE_SHIMS,
        parallel_state.CREATE_GROUP,
        pipeline.P2P_COMMUNICATOR,
        *control_flow.CORE_FIXES,
        *training.all_records(),
        *model_build.RECORDS,
        *modelled_device.ALL_RECORDS,
        *modelled_device.SCRIPT_DEVICE_BEGINS,
    )


def table() -> str:
    """Every patch record, then the layer-spec substitutions of the built-in entry."""
    from prism_megatron.megatron.layers import parallel_spec

    return registry.table((*all_patches(), *parallel_spec.SUBSTITUTIONS))


def check_installed(*, allow_untested: bool) -> None:
    """Refuse an installed megatron-core that no variant was verified on (one line, `ValueError`),
    before any process starts; with `allow_untested`, warn instead."""
    versions.select(all_patches(), allow_untested=allow_untested)


README = os.path.join(os.path.dirname(os.path.abspath(__file__)), "README.md")
REGENERATE = "make patches-readme"
"""The command that writes README.md from the catalog (`python -m prism_megatron.patches.catalog`)."""


def _kind(record) -> str:
    if isinstance(record, registry.ModePatch):
        return "torch function mode"
    if isinstance(record, registry.PrivateCall):
        return "private call (nothing replaced)"
    if isinstance(record, registry.Patch):
        bound = f", bound to a run's {', '.join(f'`{n}`' for n in record.needs)}" if record.needs else ""
        return f"replaces the attribute{bound}"
    return "layer-spec substitution (built-in entry)"


def _cell(text: str) -> str:
    return " ".join(text.split()).replace("|", "\\|")


def readme() -> str:
    """README.md of this folder: every record (every variant) with what, where, why and versions."""
    from prism_megatron.megatron.layers import parallel_spec

    lines = [
        "# Patches",
        "",
        f"<!-- Generated from prism_megatron/patches/catalog.py by `{REGENERATE}`; do not edit. "
        "tests/unit/test_patches_readme.py fails when this file and the catalog differ. -->",
        "",
        "Every change prism makes to Megatron or torch at run time, as a record of the registry",
        "(`registry.py`): what it changes, where (the target, `module:attr`), why no extension point",
        "sufficed, and the megatron-core releases each variant was verified on. Nothing outside this",
        "folder assigns to a Megatron or torch attribute (tests/unit/test_patch_boundary.py).",
        f"`--prism-list-patches` prints the same records; `{REGENERATE}` regenerates this file.",
        "",
        "| record | kind | target | verified on | why |",
        "|---|---|---|---|---|",
    ]
    for record in (*all_patches(), *parallel_spec.SUBSTITUTIONS):
        row = (f"`{record.name}`", _kind(record), f"`{record.target}`", ", ".join(record.verified_on))
        lines.append("| " + " | ".join((*row, _cell(record.reason))) + " |")
    return "\n".join(lines) + "\n"


def main(argv: list[str] | None = None) -> int:
    """Write README.md from the catalog (`--check`: exit 1 when it differs, writing nothing)."""
    check = "--check" in (sys.argv[1:] if argv is None else argv)
    text = readme()
    current = ""
    if os.path.exists(README):
        with open(README, encoding="utf-8") as f:
            current = f.read()
    if check:
        if current != text:
            print(f"{README} differs from the catalog; run {REGENERATE}", file=sys.stderr)
            return 1
        return 0
    files.write_atomically(README, text)
    print(f"wrote {README}")
    return 0


if __name__ == "__main__":
    sys.exit(main())
