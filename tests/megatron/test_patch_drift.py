"""Drift: every patch target still exists and has the signature it was verified with.

When megatron-core (or torch) changes a function prism replaces, this fails and names the patch, so
the change is noticed before a run misbehaves.
"""

from __future__ import annotations

import os
import sys

import pytest

from prism_megatron.patches import catalog, registry, training

RECORDS = [p for p in catalog.all_patches() if isinstance(p, registry.Patch)]
MEGATRON_LM_DIR = os.environ.get("MEGATRON_LM_DIR")


@pytest.fixture(autouse=True, scope="module")
def undo_megatron_lm_imports():
    """Importing Megatron-LM's training package here must not leak into later test modules."""
    saved_path, saved_modules = list(sys.path), set(sys.modules)
    yield
    sys.path[:] = saved_path
    for name in set(sys.modules) - saved_modules:
        if name.startswith(("megatron.training", "megatron.legacy", "megatron.rl", "megatron.post_training")):
            del sys.modules[name]


def needs_target_module(record: registry.Patch) -> None:
    """Megatron-LM's modules are importable only from a checkout (MEGATRON_LM_DIR)."""
    if not record.target.startswith("megatron.training"):
        return
    if not MEGATRON_LM_DIR:
        pytest.skip("Megatron-LM hook: needs a checkout in MEGATRON_LM_DIR")
    for module in ("six", "regex", "triton", "pydantic"):
        pytest.importorskip(module, reason="Megatron-LM's training code imports it")
    training.make_importable(os.path.join(MEGATRON_LM_DIR, "pretrain_gpt.py"))


@pytest.mark.parametrize("record", RECORDS, ids=lambda p: p.name)
def test_target_exists_with_the_recorded_signature(record):
    needs_target_module(record)
    _, _, original = registry.resolve(record.target)
    if record.must_exist:
        assert original is not registry.ABSENT, f"{record.name}: {record.target} no longer exists"
    if record.signature is not None:
        assert registry.current_signature(record) == record.signature, (
            f"{record.name}: {record.target} changed"
        )


@pytest.mark.parametrize("record", [p for p in RECORDS if p.importers], ids=lambda p: p.name)
def test_importers_still_bind_the_target_by_name(record):
    needs_target_module(record)
    _, attr, original = registry.resolve(record.target)
    for importer in record.importers:
        module, alias = registry._importer_slot(importer, attr)
        assert getattr(module, alias) is original, (
            f"{record.name}: {module.__name__}.{alias} no longer is {record.target}"
        )


def test_every_record_is_verified_on_the_installed_megatron_core():
    registry.check_versions(catalog.all_patches(), allow_untested=False)


def test_names_are_unique_and_the_table_lists_them_all():
    names = [p.name for p in catalog.all_patches()]
    assert len(names) == len(set(names))
    table = catalog.table()
    assert all(name in table for name in names)
