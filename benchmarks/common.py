"""What every benchmark records beside its numbers, and where it writes them.

A result is only comparable with the versions and the machine that produced it, so every record
carries `environment()` (and its Markdown says `machine_line()`), and `write_results` puts it under
benchmarks/results/ as `<YYYY-MM-DD>-<suite>.json` plus a short Markdown table. Versions are read
from package metadata (else from a module already imported), so recording them imports neither
torch nor Megatron.
"""

from __future__ import annotations

import datetime
import os
import platform
import sys
from importlib import metadata

from prism_megatron import files

RESULTS_DIR = os.path.join(os.path.dirname(os.path.abspath(__file__)), "results")


def _version(package: str, module: str) -> str | None:
    """The installed version, else the imported module's own (a tree on PYTHONPATH, not installed)."""
    try:
        return metadata.version(package)
    except metadata.PackageNotFoundError:  # not installed: the imported module's, else the record says so
        return getattr(sys.modules.get(module), "__version__", None)


def environment() -> dict[str, object]:
    """Versions (python, torch, megatron-core, prism-megatron) and the machine."""
    return {
        "python": sys.version.split()[0],
        "torch": _version("torch", "torch"),
        "megatron_core": _version("megatron-core", "megatron.core"),
        "prism_megatron": _version("prism-megatron", "prism_megatron"),
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
        "load_average_1min": os.getloadavg()[0],
    }


EVERY_PACKAGE = ("python", "torch", "megatron_core", "prism_megatron")


def machine_line(
    env: dict[str, object], packages: tuple[str, ...] = ("python", "torch", "prism_megatron")
) -> str:
    """What a result was measured on, for a Markdown table's caption: the machine, its load, versions.

    `packages` are keys of `env`, written with dashes (megatron_core: megatron-core).
    """
    versions = ", ".join(f"{key.replace('_', '-')} {env[key]}" for key in packages)
    return f"{env['platform']}, {env['cpu_count']} CPUs (load {env['load_average_1min']:.1f}), {versions}"


def today() -> str:
    return datetime.date.today().isoformat()


def write_results(suite: str, record: dict, markdown: str, out_dir: str = RESULTS_DIR) -> tuple[str, str]:
    """Write `<date>-<suite>.json` and `.md` atomically; return both paths."""
    stem = os.path.join(out_dir, f"{record.get('date', today())}-{suite}")
    paths = (f"{stem}.json", f"{stem}.md")
    files.write_json(record, paths[0], indent=1)
    files.write_atomically(paths[1], markdown)
    return paths


def pin_to_one_core() -> None:
    """Run this process on one core, so that a measured point does not depend on how many are free."""
    if hasattr(os, "sched_setaffinity"):
        os.sched_setaffinity(0, {min(os.sched_getaffinity(0))})


def world_size_figure():
    """A figure of two panels side by side (time, memory) against the world size, drawn off-screen."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    return plt.subplots(1, 2, figsize=(11, 4))


def save_world_size_figure(fig, axes_labels: list[tuple[object, str]], title: str, path: str) -> None:
    """Log-log axes (W in powers of two) with their y labels, a grid and legends; save as `path`."""
    for ax, label in axes_labels:
        ax.set_xscale("log", base=2)
        ax.set_yscale("log")
        ax.set_xlabel("world size W")
        ax.set_ylabel(label)
        ax.grid(True, which="both", alpha=0.3)
        ax.legend()
    fig.suptitle(title)
    fig.tight_layout()
    fig.savefig(path, dpi=120)
