"""A real process imports its training entry without the cyclic collector and freezes the result, so
no full collection walks torch's and megatron-core's objects again."""

from __future__ import annotations

import gc

from prism_megatron import launch


def test_the_entry_s_imports_run_without_the_collector_and_what_they_made_is_frozen():
    assert gc.isenabled()
    before = gc.get_freeze_count()
    try:
        with launch.imports_frozen():
            assert not gc.isenabled()
            made = [[i] for i in range(1000)]  # tracked objects, as a module's import makes
        assert gc.isenabled()
        assert gc.get_freeze_count() >= before + len(made)
    finally:
        gc.unfreeze()  # the test process's objects back to the collector's care
