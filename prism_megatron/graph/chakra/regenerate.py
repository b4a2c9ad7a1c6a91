"""Regenerate et_def_pb2.py from et_def.proto: `python -m prism_megatron.graph.chakra.regenerate`.

The generated module is committed, so installing prism-megatron needs no protobuf compiler; this
command (which needs grpcio-tools, a test dependency) writes it again after a change to the .proto.
The proto is compiled from the repository root, so its name in protobuf's descriptor pool is
"prism_megatron/graph/chakra/et_def.proto" and cannot clash with Chakra's own "et_def.proto".
"""

from __future__ import annotations

import os
import sys

PACKAGE_DIR = os.path.dirname(os.path.abspath(__file__))
ROOT = os.path.dirname(os.path.dirname(os.path.dirname(PACKAGE_DIR)))
PROTO = os.path.relpath(os.path.join(PACKAGE_DIR, "et_def.proto"), ROOT)


def generate(out_root: str = ROOT) -> str:
    """Compile et_def.proto into `out_root/<its package path>/et_def_pb2.py`; return that path."""
    try:
        from grpc_tools import protoc
    except ModuleNotFoundError as exc:
        raise SystemExit("regenerating needs grpcio-tools: pip install grpcio-tools") from exc
    status = protoc.main(["protoc", f"-I{ROOT}", f"--python_out={out_root}", os.path.join(ROOT, PROTO)])
    if status != 0:
        raise SystemExit(f"protoc failed on {PROTO} (exit {status})")
    return os.path.join(out_root, os.path.dirname(PROTO), "et_def_pb2.py")


if __name__ == "__main__":
    print(f"wrote {generate()}", file=sys.stderr)
