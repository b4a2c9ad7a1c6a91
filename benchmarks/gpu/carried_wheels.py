"""Install the wheels carried in `.whl/` (`make wheels-gpu`) that this Python lacks, without a network.

The lent GPU machine has its own Python and torch and no network; megatron-core and the few
packages prism imports that such an environment may lack travel as wheels. Only distributions this
interpreter does not already have are installed, into a private folder (never the machine's
site-packages), so the machine's own numpy or packaging is never shadowed by a carried copy.

Usage: python -m benchmarks.gpu.carried_wheels --wheels .whl --target DIR
Prints one line per wheel (installed or kept) and exits 1 when an install failed.
"""

from __future__ import annotations

import argparse
import glob
import importlib.metadata
import os
import re
import subprocess
import sys
import zipfile


def distribution(wheel_path: str) -> tuple[str, str]:
    """(name, version) from a wheel's file name (`name-version-tags.whl`)."""
    name, version = os.path.basename(wheel_path).split("-")[:2]
    return name, version


def installed_version(name: str) -> str | None:
    try:
        return importlib.metadata.version(re.sub(r"[-_.]+", "-", name))
    except importlib.metadata.PackageNotFoundError:
        return None


def have_pip() -> bool:
    done = subprocess.run([sys.executable, "-m", "pip", "--version"], capture_output=True)
    return done.returncode == 0


def install(wheels: list[str], wheel_dir: str, target: str) -> int:
    """pip from the local folder alone; unpacking by hand where this Python has no pip (a wheel is
    laid out to be unpacked into site-packages as it is)."""
    os.makedirs(target, exist_ok=True)
    if have_pip():
        requirements = ["{}=={}".format(*distribution(w)) for w in wheels]
        command = [sys.executable, "-m", "pip", "install", "-q", "--no-index", "--no-deps", "--no-compile",
                   "--find-links", wheel_dir, "--target", target, *requirements]  # fmt: skip
        return subprocess.run(command).returncode
    for wheel in wheels:
        with zipfile.ZipFile(wheel) as archive:
            archive.extractall(target)
    return 0


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--wheels", default=".whl", help="folder of carried wheels (default .whl)")
    parser.add_argument(
        "--target", required=True, help="private folder to install into (put it on PYTHONPATH)"
    )
    args = parser.parse_args(argv)
    wheels = sorted(glob.glob(os.path.join(args.wheels, "*.whl")))
    if not wheels:
        print(f"carried_wheels: no wheels in {args.wheels} (run `make wheels-gpu` before copying the tree)")
        return 1
    missing = []
    for wheel in wheels:
        name, version = distribution(wheel)
        have = installed_version(name)
        if have is None:
            missing.append(wheel)
            print(f"install {name} {version}")
        else:
            print(f"keep    {name} {have} (this machine's; carried {version} not installed)")
    if not missing:
        return 0
    status = install(missing, args.wheels, args.target)
    print(f"carried_wheels: {len(missing)} installed into {args.target}" if status == 0 else "install failed")
    return 0 if status == 0 else 1


if __name__ == "__main__":
    sys.exit(main())
