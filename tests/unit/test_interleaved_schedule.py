"""`graph.schedule.interleaved`: what every middle stage's order must hold, whatever its warm-up.

The order itself is checked against megatron-core's schedule in `tests/megatron/test_interleaved_classes.py`
(captured stages against derived ones); here, the invariants a wrong order would break.
"""

from __future__ import annotations

import pytest

from prism_megatron.graph.schedule import (
    BACKWARD,
    FORWARD,
    NEXT,
    PREVIOUS,
    SEND_WAIT_AT_POST,
    SEND_WAIT_NEXT_POST,
    Call,
    Step,
    Wait,
    interleaved,
)
from prism_megatron.graph.schema import NodeType

RECV, SEND = NodeType.RECV, NodeType.SEND


@pytest.mark.parametrize("send_wait", [SEND_WAIT_NEXT_POST, SEND_WAIT_AT_POST])
@pytest.mark.parametrize(("total", "warmup"), [(16, 6), (16, 8), (8, 8), (128, 114), (128, 128), (4, 1)])
def test_every_transfer_once_waited_after_posting_and_received_before_its_step(total, warmup, send_wait):
    tokens = interleaved(total, warmup, waits=True, send_wait=send_wait)
    steps = [t for t in tokens if isinstance(t, Step)]
    forwards = [s.microbatch for s in steps if s.kind == FORWARD]
    backwards = [s.microbatch for s in steps if s.kind == BACKWARD]
    assert forwards == list(range(total)) and backwards == list(range(total))
    # warm-up forwards first; then one forward per backward until the forwards run out
    assert [s.kind for s in steps[:warmup]] == [FORWARD] * warmup
    ops = [(op, call.blocking) for call in tokens if isinstance(call, Call) for op in call.ops]
    keys = [op for op, _ in ops]
    assert len(keys) == len(set(keys)) == 4 * total  # each direction's 0 .. T-1, once
    for kind, offset in ((RECV, PREVIOUS), (SEND, NEXT), (RECV, NEXT), (SEND, PREVIOUS)):
        assert sorted(seq for t, o, seq in keys if (t, o) == (kind, offset)) == list(range(total))
    posted = {op for op, blocking in ops if not blocking}
    waited = [t.key for t in tokens if isinstance(t, Wait)]
    assert len(waited) == len(set(waited)) and set(waited) <= posted
    # every receive is complete before the step that needs it
    position = {}
    for index, token in enumerate(tokens):
        if isinstance(token, Call):
            for op in token.ops:
                position[op] = index
        elif isinstance(token, Wait):
            position[("wait", *token.key)] = index
        else:
            position[token] = index
    for k in range(total):
        for key, step in (((RECV, PREVIOUS, k), Step(FORWARD, k)), ((RECV, NEXT, k), Step(BACKWARD, k))):
            done = position[("wait", *key)] if key in posted else position[key]
            assert done < position[step], (key, step)


def test_the_cpu_form_blocks_in_every_call_and_waits_nowhere():
    with_waits = interleaved(16, 6, waits=True)
    without = interleaved(16, 6, waits=False)
    assert not any(isinstance(t, Wait) for t in without)
    assert all(t.blocking for t in without if isinstance(t, Call))
    strip = [t if not isinstance(t, Call) else t.ops for t in with_waits if not isinstance(t, Wait)]
    assert strip == [t if not isinstance(t, Call) else t.ops for t in without]


def test_bad_warmup_counts_are_refused():
    with pytest.raises(ValueError, match="warm-up"):
        interleaved(8, 0, waits=True)
    with pytest.raises(ValueError, match="warm-up"):
        interleaved(8, 9, waits=True)
    with pytest.raises(ValueError, match="variant"):
        interleaved(8, 4, waits=True, send_wait="later")
