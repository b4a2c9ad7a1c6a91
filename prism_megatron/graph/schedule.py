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


# --- the interleaved schedule ------------------------------------------------------------------


@dataclasses.dataclass(frozen=True)
class Call:
    """One pipeline call's ops in posting order: waited in the call (`blocking`), or each posted on
    its own side stream and waited later by a `Wait`."""

    ops: tuple[P2PKey, ...]
    blocking: bool = True


@dataclasses.dataclass(frozen=True)
class Wait:
    """The program waits for one posted op of an earlier non-blocking `Call`."""

    key: P2PKey


SEND_WAIT_NEXT_POST = "next-post"
"""Variant of `interleaved`: a send is waited right after the next send in its direction is posted
(megatron-core 0.16's `send_next_wait_handle` and `send_prev_wait_handle`)."""
SEND_WAIT_AT_POST = "at-post"
"""Variant: a forward send is waited right after it is posted, before its output is deallocated
(megatron-core 0.19 with `deallocate_pipeline_outputs`); a backward send as in `SEND_WAIT_NEXT_POST`."""


def interleaved(
    total: int, num_warmup: int, *, waits: bool, send_wait: str = SEND_WAIT_NEXT_POST
) -> tuple[Call | Wait | Step, ...]:
    """A middle stage's calls, waits and steps under megatron-core's interleaved schedule with
    overlapped p2p (`forward_backward_pipelining_with_interleaving`, `overlap_p2p_comm`, no warm-up
    flush), over its `total` = M x V virtual microbatches with `num_warmup` of them warm-up.

    Step k is virtual microbatch k (whatever chunk and microbatch it is): F_k receives R<-prev #k and
    sends S->next #k, B_k receives R<-next #k and sends S->prev #k. The warm-up's calls wait in the
    call; the steady phase posts its calls and waits a receive just before the step that needs it
    and a send as `send_wait` has it; the cool-down's calls wait in the call again, and the last
    backward send of the steady phase is waited after them.

        R<-prev#0
        warm-up   k < w:      F_k  [R<-prev#k+1, S->next#k]      then, at k = w-1, post R<-next#0
        steady    j < T - w:  (wait R<-prev#w+j)  F_w+j  post [R<-prev#w+j+1, S->next#w+j]  (wait send)
                              wait R<-next#j  B_j  post [R<-next#j+1, S->prev#j]  (wait S->prev#j-1)
        cool-down k >= T - w: (wait R<-next#k the first time)  B_k  [R<-next#k+1, S->prev#k]

    (no R<-prev#T and no R<-next#T). With every microbatch in warm-up (w = T) the cool-down starts
    with a blocking R<-next#0. `waits` False: where no wait is recorded (the CPU device), every call
    is blocking and there is no `Wait`.

    Raises:
        ValueError: not 1 <= num_warmup <= total, or an unknown `send_wait`.
    """
    t, w = total, num_warmup
    if not 1 <= w <= t:
        raise ValueError(f"an interleaved stage needs 1 <= warm-up {w} <= virtual microbatches {t}")
    if send_wait not in (SEND_WAIT_NEXT_POST, SEND_WAIT_AT_POST):
        raise ValueError(f"unknown send-wait variant {send_wait!r}")
    tokens: list[Call | Wait | Step] = []

    def call(*ops: tuple[tuple[NodeType, int], int], blocking: bool = True) -> None:
        ops = tuple(op for op in ops if op[1] < t)
        if ops:
            tokens.append(Call(_call(*ops), blocking=blocking or not waits))

    def wait(op: tuple[NodeType, int], seq: int) -> None:
        if waits:
            tokens.append(Wait((*op, seq)))

    remaining = t - w
    call((_RECV_PREV, 0))
    for k in range(w):
        tokens.append(Step(FORWARD, k))
        call((_RECV_PREV, k + 1), (_SEND_NEXT, k))
        if k == w - 1 and remaining:
            call((_RECV_NEXT, 0), blocking=False)
    for j in range(remaining):
        forward = w + j
        if j:
            wait(_RECV_PREV, forward)
        tokens.append(Step(FORWARD, forward))
        call((_RECV_PREV, forward + 1 if j < remaining - 1 else t), (_SEND_NEXT, forward), blocking=False)
        if send_wait == SEND_WAIT_AT_POST:
            wait(_SEND_NEXT, forward)
        elif j:
            wait(_SEND_NEXT, forward - 1)
        wait(_RECV_NEXT, j)
        tokens.append(Step(BACKWARD, j))
        call((_RECV_NEXT, j + 1), (_SEND_PREV, j), blocking=False)
        if j:
            wait(_SEND_PREV, j - 1)
    if not remaining:
        call((_RECV_NEXT, 0))
    for k in range(remaining, t):
        if k == remaining and remaining:
            wait(_RECV_NEXT, k)
        tokens.append(Step(BACKWARD, k))
        call((_RECV_NEXT, k + 1), (_SEND_PREV, k))
    if remaining:
        wait(_SEND_PREV, remaining - 1)
    return tuple(tokens)
