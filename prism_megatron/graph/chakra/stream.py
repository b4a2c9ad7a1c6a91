"""Chakra's file framing: a sequence of protobuf messages, each preceded by its byte count as a varint.

This is how Chakra's own tools write and read execution traces (its `encodeMessage` and
`decodeMessage`, and ASTRA-sim's feeder): the first message is a `GlobalMetadata`, every following
one a `Node`. A reader stops at the end of the file; a length of zero also ends a trace there (as in
Chakra's reader), so a writer must never emit an empty message: every node we write has a name.
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import BinaryIO

from prism_megatron.graph.chakra import et_def_pb2 as et

_MAX_MESSAGE_BYTES = 1 << 30


def encode_varint(value: int) -> bytes:
    """Unsigned LEB128, as protobuf writes lengths."""
    if value < 0:
        raise ValueError(f"a varint length must be >= 0, got {value}")
    out = bytearray()
    while True:
        bits, value = value & 0x7F, value >> 7
        out.append(bits | (0x80 if value else 0))
        if not value:
            return bytes(out)


def framed(message) -> bytes:
    """One message with its length in front."""
    payload = message.SerializeToString()
    if not payload:
        raise ValueError(f"refusing to write an empty {type(message).__name__}: Chakra's reader stops at one")
    return encode_varint(len(payload)) + payload


def _read_varint(f: BinaryIO, source: str) -> int | None:
    """The next varint, or None at a clean end of file."""
    result, shift = 0, 0
    while True:
        byte = f.read(1)
        if not byte:
            if shift == 0:
                return None
            raise ValueError(f"{source}: the file ends inside a message length")
        result |= (byte[0] & 0x7F) << shift
        if not byte[0] & 0x80:
            return result
        shift += 7
        if shift > 63:
            raise ValueError(f"{source}: a message length longer than 64 bits; not a Chakra trace")


def read_messages(f: BinaryIO, source: str = "trace") -> Iterator[bytes]:
    """The raw messages of a framed file, in order."""
    while (length := _read_varint(f, source)) is not None:
        if length == 0:
            return
        if length > _MAX_MESSAGE_BYTES:
            raise ValueError(f"{source}: a message of {length} bytes; not a Chakra trace")
        payload = f.read(length)
        if len(payload) != length:
            raise ValueError(f"{source}: the file ends inside a message ({len(payload)} of {length} bytes)")
        yield payload


def read_trace(path: str) -> tuple[et.GlobalMetadata, list[et.Node]]:
    """Decode a Chakra ET file: its metadata and its nodes.

    Raises:
        ValueError: naming the file, when it is empty, cut short or not protobuf of this schema.
    """
    from google.protobuf.message import DecodeError

    with open(path, "rb") as f:
        messages = list(read_messages(f, path))
    if not messages:
        raise ValueError(f"{path}: empty; a Chakra trace starts with its GlobalMetadata")
    try:
        metadata = et.GlobalMetadata.FromString(messages[0])
        nodes = [et.Node.FromString(m) for m in messages[1:]]
    except DecodeError as exc:
        raise ValueError(f"{path}: not a Chakra execution trace ({exc})") from exc
    return metadata, nodes


def attributes(node_or_metadata) -> dict[str, object]:
    """A node's (or the metadata's) attributes as a dict name -> value (lists as Python lists)."""
    out: dict[str, object] = {}
    for attr in node_or_metadata.attr:
        kind = attr.WhichOneof("value")
        value = getattr(attr, kind) if kind else None
        out[attr.name] = list(value.values) if hasattr(value, "values") else value
    return out
