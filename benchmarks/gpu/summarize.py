"""Gather a GPU run's steps into one record and one readable summary.

run.sh gives every step a directory ``WORK/<step>/`` and appends ``name<TAB>status<TAB>seconds<TAB>note``
to ``WORK/steps.tsv``. A step that wants its numbers reported writes ``*.json`` (merged into the
record under its name) and ``*.md`` fragments (appended to the summary) into its directory, so a new
step needs no change here.

Run: ``python -m benchmarks.gpu.summarize --work WORK --json OUT.json --md OUT.md``; prints the summary.
"""

from __future__ import annotations

import argparse
import datetime
import glob
import json
import os
import sys


def read_steps(work_dir: str) -> list[dict[str, object]]:
    steps = []
    with open(os.path.join(work_dir, "steps.tsv")) as f:
        for line in f:
            name, status, seconds, note = line.rstrip("\n").split("\t", 3)
            steps.append({"name": name, "status": status, "seconds": int(seconds or 0), "note": note})
    return steps


def step_outputs(work_dir: str, name: str) -> tuple[dict[str, object], list[str]]:
    step_dir = os.path.join(work_dir, name)
    results = {}
    for path in sorted(glob.glob(os.path.join(step_dir, "*.json"))):
        with open(path) as f:
            results[os.path.splitext(os.path.basename(path))[0]] = json.load(f)
    fragments = []
    for path in sorted(glob.glob(os.path.join(step_dir, "*.md"))):
        with open(path) as f:
            fragments.append(f.read().strip())
    return results, fragments


def summary_markdown(steps: list[dict[str, object]], fragments: list[str]) -> str:
    lines = [
        f"# GPU run ({datetime.date.today().isoformat()})",
        "",
        "| step | status | s | note |",
        "|---|---|---:|---|",
    ]
    lines += [f"| {s['name']} | {s['status']} | {s['seconds']} | {s['note']} |" for s in steps]
    return "\n".join(lines) + "\n\n" + "\n\n".join(fragments) + "\n"


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--work", required=True, help="run.sh's work directory")
    parser.add_argument("--json", required=True, help="where to write the merged record")
    parser.add_argument("--md", required=True, help="where to write the summary")
    args = parser.parse_args(argv)

    steps = read_steps(args.work)
    fragments = []
    for step in steps:
        step["results"], step_fragments = step_outputs(args.work, step["name"])
        fragments += step_fragments
    record = {"suite": "gpu", "date": datetime.date.today().isoformat(), "steps": steps}
    with open(args.json, "w") as f:
        json.dump(record, f, indent=2)
    text = summary_markdown(steps, fragments)
    with open(args.md, "w") as f:
        f.write(text)
    print(text)
    return 0


if __name__ == "__main__":
    sys.exit(main())
