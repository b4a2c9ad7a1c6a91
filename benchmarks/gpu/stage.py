"""The command line every GPU stage of run.sh shares: `--out DIR`, the GPU check, NAME.json and .md.

Why: run.sh's contract with a stage is "take --out DIR, leave *.json / *.md there" (summarize.py
picks them up); one function keeps every stage to it and to the same refusal without a GPU.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
from collections.abc import Callable

import torch

from prism_megatron.replay import clock


def run_stage(
    name: str,
    description: str,
    measure: Callable[[], dict],
    markdown: Callable[[dict], str],
    argv: list[str] | None = None,
) -> dict | None:
    """Parse `--out`, measure and write `<out>/<name>.json` and `.md`; None without a GPU build."""
    parser = argparse.ArgumentParser(description=description)
    parser.add_argument("--out", required=True, help=f"directory for {name}.json and .md")
    args = parser.parse_args(argv)
    if not (torch.cuda.is_available() and clock.cuda_built()):
        print("needs a GPU and a CUDA build of prism_megatron._C", file=sys.stderr)
        return None
    result = measure()
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, f"{name}.json"), "w") as f:
        json.dump(result, f, indent=2)
    with open(os.path.join(args.out, f"{name}.md"), "w") as f:
        f.write(markdown(result))
    return result


def printed(result: dict | None, markdown: Callable[[dict], str]) -> int:
    """A stage's exit status: 2 when it measured nothing (no GPU build), else its markdown printed, 0."""
    if result is None:
        return 2
    print(markdown(result))
    return 0
