"""The order of a middle pipeline stage's steps under the non-interleaved 1F1B schedule.

A middle stage of a pipeline (neither the first nor the last) runs, per microbatch i, one forward
step F_i between receiving its input from the previous stage and sending its output to the next,
and one backward step B_i between receiving the output's gradient from the next stage and sending
the input's gradient back. 1F1B with w warm-up microbatches (megatron-core's
`forward_backward_pipelining_without_interleaving`, w = min(PP - stage - 1, M)) orders them so:

    warm-up   i < w:      recv_forward(i)  F_i  send_forward(i)
                          recv_forward(w)                                   (when M > w)
    steady    j < M - w:  F_{w+j}  send_forward_recv_backward(w+j, j)  B_j
                          send_backward_recv_forward(j, w+j+1), or send_backward(j) the last time
    cool-down i < w:      recv_backward(M-w+i)  B_{M-w+i}  send_backward(M-w+i)

Each call is one batch of pipeline p2p ops, in the order the prism pipeline interceptor posts them:
receive from the previous stage, receive from the next, send to the next, send to the previous.
Between two consecutive calls runs F_i, B_i or nothing (`IDLE`: the schedule's own loop).

`one_f_one_b` gives that order as data; `graph.classes` checks a captured stage against it and
reorders the captured steps into another stage's order. Only what the module docstring states is
modelled: no interleaving, no forward-only pass, the same steps for every stage of the class.
"""

from __future__ import annotations

import dataclasses

from prism_megatron.graph.schema import NodeType

PREVIOUS, NEXT = -1, +1
"""Offsets of the pipeline neighbours in the "pp" group (the graph's relative peers)."""

_RECV_PREV = (NodeType.RECV, PREVIOUS)
_RECV_NEXT = (NodeType.RECV, NEXT)
_SEND_NEXT = (NodeType.SEND, NEXT)
_SEND_PREV = (NodeType.SEND, PREVIOUS)
_POST_ORDER = (_RECV_PREV, _RECV_NEXT, _SEND_NEXT, _SEND_PREV)

P2PKey = tuple[NodeType, int, int]
"""(SEND or RECV, offset in the "pp" group, seq: the microbatch) of one pipeline p2p op."""

FORWARD, BACKWARD, IDLE = "F", "B", "idle"


@dataclasses.dataclass(frozen=True)
class Step:
    """What runs between two consecutive pipeline calls: F_i, B_i, or IDLE (microbatch -1)."""

    kind: str
    microbatch: int = -1


@dataclasses.dataclass(frozen=True)
class StageOrder:
    """A middle stage's pipeline calls in order, and the step between each two consecutive ones."""

    calls: tuple[tuple[P2PKey, ...], ...]
    steps: tuple[Step, ...]
    """len(calls) - 1 entries: steps[k] runs between calls[k] and calls[k + 1]."""


def _call(*ops: tuple[tuple[NodeType, int], int]) -> tuple[P2PKey, ...]:
    """One call's ops in the interceptor's posting order."""
    ordered = sorted(ops, key=lambda op: _POST_ORDER.index(op[0]))
    return tuple((kind, offset, seq) for (kind, offset), seq in ordered)


def one_f_one_b(num_microbatches: int, num_warmup: int) -> StageOrder:
    """The 1F1B order of a middle stage with `num_warmup` warm-up microbatches (module docstring).

    Raises:
        ValueError: not 0 <= num_warmup <= num_microbatches, or no microbatch.
    """
    m, w = num_microbatches, num_warmup
    if m < 1 or not 0 <= w <= m:
        raise ValueError(f"a 1F1B stage needs 0 <= warm-up {w} <= microbatches {m} and M >= 1")
    tokens: list[tuple[P2PKey, ...] | Step] = []
    for i in range(w):
        tokens += [_call((_RECV_PREV, i)), Step(FORWARD, i), _call((_SEND_NEXT, i))]
    if m > w:
        tokens.append(_call((_RECV_PREV, w)))
    for j in range(m - w):
        tokens += [Step(FORWARD, w + j), _call((_SEND_NEXT, w + j), (_RECV_NEXT, j)), Step(BACKWARD, j)]
        last = j == m - w - 1
        tokens.append(_call((_SEND_PREV, j)) if last else _call((_SEND_PREV, j), (_RECV_PREV, w + j + 1)))
    for i in range(m - w, m):
        tokens += [_call((_RECV_NEXT, i)), Step(BACKWARD, i), _call((_SEND_PREV, i))]
    calls: list[tuple[P2PKey, ...]] = []
    steps: list[Step] = []
    for token in tokens:
        if isinstance(token, Step):
            steps.append(token)
            continue
        if calls and len(steps) < len(calls):
            steps.append(Step(IDLE))
        calls.append(token)
    return StageOrder(tuple(calls), tuple(steps))
