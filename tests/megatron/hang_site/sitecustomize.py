"""Test-only: make one real process of a launch hang, to test the rank watchdog (tests/megatron/test_faults.py).

Put this folder on PYTHONPATH and set PRISM_TEST_HANG=PROCESS:ITERATION: the torchrun worker of that
physical rank sleeps forever when it begins that training iteration (1-based), outside any op, as a
stuck dataloader or a deadlock in Python would. Every other process is left alone.
"""

import os

_spec = os.environ.get("PRISM_TEST_HANG", "")
if _spec and "LOCAL_RANK" in os.environ:
    _process, _, _iteration = _spec.partition(":")
    if os.environ.get("RANK") == _process:
        import time

        from prism_megatron.megatron.run import runtime

        _begins = runtime.Runtime.iteration_begins
        _count = [0]

        def _hanging_begins(rt):
            _count[0] += 1
            if _count[0] == int(_iteration):
                while True:
                    time.sleep(1000)  # hung here, where the watchdog must find it
            _begins(rt)

        runtime.Runtime.iteration_begins = _hanging_begins
