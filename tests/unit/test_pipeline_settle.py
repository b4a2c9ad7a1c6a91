"""A pipeline transfer the program never waits on is still logged, where the training step ends.

megatron-core's interleaved schedule with overlapped p2p never waits its last forward send; a
transfer logged only when waited was missing from the capture, and the receiving stage's graph then
waited for a send its neighbour's graph did not have (the Llama 3 70B VPP configuration deadlocked).
"""

from __future__ import annotations

import torch

from prism_megatron.patches import pipeline_ops
from prism_megatron.replay import OpKind


class _Work:
    def __init__(self) -> None:
        self.waits = 0

    def wait(self, *args, **kwargs) -> bool:
        self.waits += 1
        return True

    def is_completed(self) -> bool:
        return True


def test_settling_waits_and_logs_each_unwaited_transfer_once(monkeypatch):
    logged = []
    monkeypatch.setattr(pipeline_ops.Transfer, "log", lambda self, **kw: logged.append(self.kind))
    monkeypatch.setattr(pipeline_ops, "_NOT_WAITED", {})
    ops = []
    for kind in (OpKind.SEND, OpKind.RECV, OpKind.SEND):
        transfer = pipeline_ops.Transfer(kind=kind, self_rank=0, peer=1, tensor=torch.ones(4), async_op=True)
        ops.append((pipeline_ops.RealPeerOp(_Work(), transfer, {}, "send_next"), transfer))
    ops[1][0].wait()  # the program waits on the receive only
    assert logged == [OpKind.RECV]
    assert pipeline_ops.settle_unwaited() == 2
    assert logged == [OpKind.RECV, OpKind.SEND, OpKind.SEND]
    assert pipeline_ops.settle_unwaited() == 0
    ops[0][0].wait()  # a late wait by the program logs nothing twice
    assert len(logged) == 3


def test_a_transfers_wait_is_recorded_on_a_modelled_gpu_and_not_on_the_cpu(monkeypatch):
    """Where the program waits on a transfer decides whether the capture keeps it beside the compute
    (graph/capture.py); on the CPU device gloo's transfer work shares the compute's cores, so no wait
    is recorded there and the transfer stays in its pipeline call."""
    from prism_megatron.replay import timeline

    waits = []
    monkeypatch.setattr(pipeline_ops.Transfer, "log", lambda self, **kw: waits.append(kw["wait"]))
    monkeypatch.setattr(pipeline_ops, "_NOT_WAITED", {})

    def wait_once(*, in_call: bool = False) -> None:
        transfer = pipeline_ops.Transfer(
            kind=OpKind.RECV, self_rank=0, peer=1, tensor=torch.ones(4), async_op=True
        )
        op = pipeline_ops.RealPeerOp(_Work(), transfer, {}, "recv_prev")
        if in_call:
            op.wait_in_call()
        else:
            op.wait()

    assert timeline.device_name() == "host" and not timeline.modelled()
    wait_once()
    timeline.set_time_map(lambda t_ns: t_ns)
    try:
        assert timeline.modelled()
        wait_once()
        wait_once(in_call=True)  # the call's own wait (no overlap): the transfer stays in its call
    finally:
        timeline.set_time_map(None)
    assert waits[0] is None and isinstance(waits[1], timeline.Mark) and waits[2] is None
