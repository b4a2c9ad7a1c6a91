"""A compact printable form of an op that parses back exactly, for tests, logs and graph files.

Grammar (tokens separated by one space; the head comes first, the rest in any order)::

    c:fwd 1.2ms mb2                      compute "fwd", 1.2 ms, microbatch 2
    c:compute 1.2ms host:150us           1.2 ms of which 150 us host overhead (not device work)
    AR tp#3 4MiB bf16                    all-reduce on the tp group, its 4th op there, 4 MiB of bf16
    RS:grad dp#0 96MiB fp32 &            named reduce-scatter, coalesced with the next op
    S→pp+1#4 16MiB bf16 mb2              send to the next pipeline stage, 5th send to that peer
    R←pp-1#4 16MiB bf16 mb2              receive from the previous pipeline stage
    w <comm:3,send:5                     wait until op 3 of stream "comm" and op 5 of "send" are done

Durations print in the largest of ms, us, ns that is not larger than the value, with as many
decimals as needed to be exact; sizes in the largest of GiB, MiB, KiB, B that divides them. ASCII
arrows ("->", "<-") parse too. Anything that is none of the above is the dtype.
"""

from __future__ import annotations

import re
from decimal import Decimal, InvalidOperation

from prism_megatron.graph.schema import Dep, NodeType, Op
from prism_megatron.replay.schedule import OpKind

COMM_CODES = {
    OpKind.ALL_REDUCE: "AR",
    OpKind.BROADCAST: "BC",
    OpKind.ALL_GATHER: "AG",
    OpKind.REDUCE_SCATTER: "RS",
    OpKind.ALL_TO_ALL: "A2A",
    OpKind.BARRIER: "BAR",
    OpKind.GATHER: "GA",
    OpKind.SCATTER: "SC",
    OpKind.REDUCE: "RED",
}
_COMM_BY_CODE = {code: kind for kind, code in COMM_CODES.items()}
_TIME_UNITS = (("ms", 10**6), ("us", 10**3), ("ns", 1))
_TIME_SCALE = {"s": 10**9, "ms": 10**6, "us": 10**3, "ns": 1}
_SIZE_UNITS = (("GiB", 2**30), ("MiB", 2**20), ("KiB", 2**10), ("B", 1))
_SIZE_SCALE = dict(_SIZE_UNITS)

HOST_PREFIX = "host:"
"""Prefix of a compute op's host-overhead token."""
_DURATION = re.compile(r"^(\d+(?:\.\d+)?)(s|ms|us|ns)$")
_SIZE = re.compile(r"^(\d+)(GiB|MiB|KiB|B)$")
_MICROBATCH = re.compile(r"^mb(\d+)$")
_P2P_HEAD = re.compile(r"^([SR])(?::(.*?))?(→|->|←|<-)([A-Za-z_]+)([+-]\d+)#(\d+)$")
_COLL_HEAD = re.compile(r"^([A-Z0-9]+)(?::(.*))?$")
_COLL_GROUP = re.compile(r"^([A-Za-z_]+)#(\d+)$")


def format_duration(duration_ns: int) -> str:
    """1200000 -> "1.2ms"; exact, so `parse_duration` gives the same integer back."""
    for unit, scale in _TIME_UNITS:
        if duration_ns >= scale or scale == 1:
            value = (Decimal(duration_ns) / scale).normalize()
            return f"{value:f}{unit}"
    raise AssertionError("unreachable")


MAX_DURATION_NS = 10**15
"""The longest op a graph may hold (10^6 s, about 11.6 days): the simulator keeps times in int64
nanoseconds (at most 9.2e18), so such an op even 1000 times slowed (the largest what-if factor)
still fits."""
MAX_SIZE_BYTES = 1 << 50
"""The largest message a graph may hold (1 PiB)."""


def parse_duration(text: str) -> int:
    match = _DURATION.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a duration (like 1.2ms, 850us, 17ns)")
    if len(match.group(1)) > 30:  # Decimal takes any length; no duration in range is written so long
        raise ValueError(f"duration {text[:40]!r}... is longer than any op (at most 10^6 s)")
    value = Decimal(match.group(1)) * _TIME_SCALE[match.group(2)]
    if value != value.to_integral_value():
        raise ValueError(f"duration {text!r} is not a whole number of ns")
    if value > MAX_DURATION_NS:
        raise ValueError(f"duration {text!r} is longer than any op may be (at most 10^6 s)")
    return int(value)


def format_size(size_bytes: int) -> str:
    """4194304 -> "4MiB"; 1000 -> "1000B"."""
    for unit, scale in _SIZE_UNITS:
        if size_bytes % scale == 0 and (size_bytes >= scale or scale == 1):
            return f"{size_bytes // scale}{unit}"
    raise AssertionError("unreachable")


def parse_size(text: str) -> int:
    match = _SIZE.match(text)
    if not match:
        raise ValueError(f"{text!r} is not a size (like 4MiB, 1000B)")
    if len(match.group(1)) > 20 or int(match.group(1)) * _SIZE_SCALE[match.group(2)] > MAX_SIZE_BYTES:
        raise ValueError(f"size {text[:40]!r} is larger than any message may be (at most {MAX_SIZE_BYTES} B)")
    return int(match.group(1)) * _SIZE_SCALE[match.group(2)]


def format_op(op: Op) -> str:
    """The compact printable form of `op` (see the module docstring)."""
    if op.type == NodeType.COMPUTE:
        tokens = [f"c:{op.name}", format_duration(op.duration_ns)]
        if op.overhead_ns:
            tokens.append(HOST_PREFIX + format_duration(op.overhead_ns))
    elif op.type == NodeType.WAIT:
        tokens = [f"w:{op.name}" if op.name else "w"]
    elif op.type == NodeType.COLLECTIVE:
        head = COMM_CODES[op.comm] + (f":{op.name}" if op.name else "")
        tokens = [head, f"{op.group}#{op.seq}", format_size(op.size_bytes)]
    else:
        letter, arrow = ("S", "→") if op.type == NodeType.SEND else ("R", "←")
        name = f":{op.name}" if op.name else ""
        tokens = [f"{letter}{name}{arrow}{op.group}{op.offset:+d}#{op.seq}", format_size(op.size_bytes)]
    if op.dtype:
        tokens.append(op.dtype)
    if op.microbatch >= 0:
        tokens.append(f"mb{op.microbatch}")
    if op.deps:
        tokens.append("<" + ",".join(f"{d.stream}:{d.index}" for d in op.deps))
    if op.coalesced:
        tokens.append("&")
    return " ".join(tokens)


def parse_op(text: str) -> Op:
    """Parse the printable form back into an `Op`.

    Raises:
        ValueError: the text is not an op's printable form; the message quotes it.
    """
    try:
        return _parse(text)
    except (ValueError, KeyError, InvalidOperation) as exc:
        raise ValueError(f"cannot parse op {text!r}: {exc}") from None


def split_seq(text: str) -> tuple[str, int] | None:
    """A transfer's or collective's text cut at its sequence number: (what comes before the number,
    the number), or None for a compute or wait op. Ops that differ only in their sequence number (each
    microbatch's transfer, each bucket's collective) share the first part, so a reader that matches
    ops with each other parses that part once (`report.links`).

    Raises:
        ValueError: the text has no valid head or sequence number; the message quotes it.
    """
    try:
        return _split_seq(text)
    except ValueError as exc:
        raise ValueError(f"cannot parse op {text!r}: {exc}") from None


def _split_seq(text: str) -> tuple[str, int] | None:
    head, _, rest = text.partition(" ")
    kind, match = _head(head)
    if kind in (NodeType.SEND, NodeType.RECV):
        return head[: match.start(6) - 1], _index(match.group(6), "seq")
    if kind == NodeType.COLLECTIVE:
        group = _COLL_GROUP.match(rest.partition(" ")[0])
        if group is None:
            raise ValueError("a collective needs GROUP#SEQ after its code")
        return f"{head} {group.group(1)}", _index(group.group(2), "seq")
    if kind is None:
        raise ValueError(f"unknown head {head!r}")
    return None


def _head(head: str) -> tuple[NodeType | None, re.Match | None]:
    """The type of op a text's first token begins (None: no op's) and the grammar's match of it."""
    if head.startswith("c:"):
        return NodeType.COMPUTE, None
    if head == "w" or head.startswith("w:"):
        return NodeType.WAIT, None
    if match := _P2P_HEAD.match(head):
        return (NodeType.SEND if match.group(1) == "S" else NodeType.RECV), match
    if (match := _COLL_HEAD.match(head)) and match.group(1) in _COMM_BY_CODE:
        return NodeType.COLLECTIVE, match
    return None, None


def _parse(text: str) -> Op:
    head, *rest = text.split(" ")
    fields: dict = {}
    kind, match = _head(head)
    if kind in (NodeType.COMPUTE, NodeType.WAIT):
        fields.update(type=kind, name=head[2:])
    elif kind in (NodeType.SEND, NodeType.RECV):
        _letter, name, _arrow, group, offset, seq = match.groups()
        fields.update(
            type=kind, name=name or "", group=group, offset=_index(offset, "offset"), seq=_index(seq, "seq")
        )
    elif kind == NodeType.COLLECTIVE:
        if not rest or not (group := _COLL_GROUP.match(rest[0])):
            raise ValueError("a collective needs GROUP#SEQ after its code")
        fields.update(type=NodeType.COLLECTIVE, comm=_COMM_BY_CODE[match.group(1)], name=match.group(2) or "")
        fields.update(group=group.group(1), seq=_index(group.group(2), "seq"))
        rest = rest[1:]
    else:
        raise ValueError(f"unknown head {head!r}")
    for token in rest:
        _parse_field(token, fields)
    return Op(**fields)


MAX_INDEX = 1 << 40
"""The largest sequence number, offset, dependency index or microbatch an op may carry: far above
any graph's, and far below what the engine's 64-bit integers hold."""


def _index(text: str, what: str) -> int:
    if len(text) > 16 or abs(int(text)) > MAX_INDEX:
        shown = text if len(text) <= 20 else text[:20] + "..."
        raise ValueError(f"{what} {shown} is out of range (at most {MAX_INDEX})")
    return int(text)


def _parse_field(token: str, fields: dict) -> None:
    if token == "&":
        fields["coalesced"] = True
    elif token.startswith("<"):
        deps = []
        for item in token[1:].split(","):
            stream, _, index = item.rpartition(":")
            deps.append(Dep(stream, _index(index, "dependency index")))
        fields["deps"] = tuple(deps)
    elif match := _MICROBATCH.match(token):
        fields["microbatch"] = _index(match.group(1), "microbatch")
    elif token.startswith(HOST_PREFIX) and fields["type"] == NodeType.COMPUTE:
        fields["overhead_ns"] = parse_duration(token[len(HOST_PREFIX) :])
    elif _DURATION.match(token) and fields["type"] == NodeType.COMPUTE:
        fields["duration_ns"] = parse_duration(token)
    elif _SIZE.match(token) and fields["type"] != NodeType.COMPUTE:
        fields["size_bytes"] = parse_size(token)
    elif token and "dtype" not in fields:
        fields["dtype"] = token
    else:
        raise ValueError(f"unexpected token {token!r}")
