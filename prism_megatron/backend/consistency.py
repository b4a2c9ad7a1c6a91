"""When the backend checks that real members issue the same collectives (`check_consistency`).

Before every collective on a group with two or more real members, the backend all-gathers (op,
bytes, dtype, sequence number) among them and raises on a difference before the real op can pair
with another op. That is a second real op on the collective's path; on a host it costs more than
many of the collectives it guards. Once a pass knows the program issues what the execution graph
holds (the emulate pass compares every iteration with it), it defers the check: the all-gather is
issued after the real op, nothing waits on it where the op completes, and the backend checks its
result when a later op is issued and, at the latest, at `settle()`. A mismatch still raises with
the group, the sequence number, the ranks and both ops, only later.

Every real member of a group must defer from the same op on, since the order of the two real ops
changes: switch all real ranks at one agreed iteration start (`passes/agreed_start.py`), after
settling.
"""

from __future__ import annotations


def _backend():
    from prism_megatron import _C

    return _C.backend


def defer(deferred: bool) -> None:
    """Defer the check (True) or check before every real op again (False, the default)."""
    _backend().set_consistency_deferred(bool(deferred))


def deferred() -> bool:
    return _backend().consistency_deferred()


def settle(timeout_s: float) -> None:
    """Wait for every deferred check (each at most `timeout_s`) and run it.

    Raises:
        RuntimeError: real members issued different collectives (the message names them).
    """
    _backend().settle_consistency_checks(timeout_s)
