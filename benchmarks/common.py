"""What every benchmark records beside its numbers, and where it writes them.

A result is only comparable with the versions and the machine that produced it, so every record
carries `environment()`, and `write_results` puts it under benchmarks/results/ as
`<YYYY-MM-DD>-<suite>.json` plus a short Markdown table. Versions are read from package metadata,
so recording them imports neither torch nor Megatron.
"""

from __future__ import annotations

import datetime
import json
import os
import platform
import sys
from importlib import metadata

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _version(package: str) -> str | None:
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:  # not installed: the record says so
        return None


def environment() -> dict[str, object]:
    """Versions (python, torch, megatron-core, prism-megatron) and the machine."""
    return {
        "python": sys.version.split()[0],
        "torch": _version("torch"),
        "megatron_core": _version("megatron-core"),
        "prism_megatron": _version("prism-megatron"),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0],
    }


def today() -> str:
    return datetime.date.today().isoformat()


def write_results(suite: str, record: dict, markdown: str, out_dir: str = RESULTS_DIR) -> tuple[str, str]:
    """Write `<date>-<suite>.json` and `.md` atomically (temp file, then rename); return both paths."""
    os.makedirs(out_dir, exist_ok=True)
    stem = os.path.join(out_dir, f"{record.get('date', today())}-{suite}")
    paths = (f"{stem}.json", f"{stem}.md")
    for path, text in zip(paths, (json.dumps(record, indent=1) + "\n", markdown), strict=True):
        with open(f"{path}.tmp", "w", encoding="utf-8") as f:
            f.write(text)
        os.replace(f"{path}.tmp", path)
    return paths
