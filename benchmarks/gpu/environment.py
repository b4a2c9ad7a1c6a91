"""What a GPU run's numbers were measured on: versions, GPU, driver, CUDA toolkit, machine.

Run: ``python -m benchmarks.gpu.environment --out DIR``; writes ``DIR/environment.json`` and a one-line
``DIR/environment.md``. Never fails for a missing GPU, tool or extension build (it runs before the
build): it records what is absent.
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import subprocess
import sys

import torch

import prism_megatron  # noqa: F401  (imported: the record takes its version when not installed)
from benchmarks.common import environment


def command_output(argv: list[str]) -> str | None:
    if shutil.which(argv[0]) is None:
        return None
    try:
        return subprocess.run(argv, capture_output=True, text=True, timeout=30, check=False).stdout.strip()
    except subprocess.TimeoutExpired:
        return None


def gpu_environment() -> dict[str, object]:
    nvcc_version = command_output(["nvcc", "--version"])
    env: dict[str, object] = {
        "torch_cuda": torch.version.cuda,
        "cuda_available": torch.cuda.is_available(),
        "nvcc": nvcc_version.splitlines()[-1] if nvcc_version else None,
        "nvidia_smi": command_output(
            [
                "nvidia-smi",
                "--query-gpu=name,driver_version,memory.total,clocks.max.sm",
                "--format=csv,noheader",
            ]
        ),
    }
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        env.update(
            gpu_name=props.name,
            gpu_capability=f"{props.major}.{props.minor}",
            gpu_multiprocessors=props.multi_processor_count,
            gpu_memory_bytes=props.total_memory,
        )
    try:
        from prism_megatron import _C

        env["prism_cuda_build"] = bool(_C.with_cuda)
        env["prism_built_against_torch"] = _C.build_info.torch_version
    except ImportError as error:
        env["prism_cuda_build"] = f"not importable: {error}"
    return env


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    parser.add_argument("--out", required=True, help="directory for environment.json and environment.md")
    args = parser.parse_args(argv)
    env = {**environment(), **gpu_environment()}  # the host fields every record carries
    os.makedirs(args.out, exist_ok=True)
    with open(os.path.join(args.out, "environment.json"), "w") as f:
        json.dump(env, f, indent=2)
    line = (
        f"{env.get('gpu_name', 'no GPU')} (sm_{str(env.get('gpu_capability', '?')).replace('.', '')}), "
        f"driver/smi: {env['nvidia_smi']}; torch {env['torch']} (CUDA {env['torch_cuda']}); {env['nvcc']}; "
        f"python {env['python']}; megatron-core {env['megatron_core']}; {env['platform']}, "
        f"{env['cpu_count']} CPUs"
    )
    with open(os.path.join(args.out, "environment.md"), "w") as f:
        f.write(f"## Environment\n\n{line}\n")
    print(line)
    return 0


if __name__ == "__main__":
    sys.exit(main())
