"""Drift: every patch target still exists and has the signature it was verified with.

When megatron-core (or torch) changes a function prism replaces, this fails and names the patch, so
the change is noticed before a run misbehaves. Each record is checked in its variant for the
installed megatron-core; on a release no variant was verified on, the variant that
--prism-allow-untested-megatron would apply (the nearest verified release below), so the failures
say what changed. PRISM_DRIFT_AS_MEGATRON_CORE=<release> checks the variants of that release against
what is installed instead (how to see this test fail: 0.16.1's variants on 0.19, or the reverse).
The Megatron-LM hooks need a checkout of the matching tag in MEGATRON_LM_DIR (core_v0.16.1 for
0.16.1, core_v0.19.0 for 0.19.x).
"""

from __future__ import annotations

import os
import sys
import warnings

import pytest

from prism_megatron.megatron.run import script
from prism_megatron.patches import catalog, registry, versions

INSTALLED = versions.installed_megatron_core_version()
CHECKED_AS = os.environ.get("PRISM_DRIFT_AS_MEGATRON_CORE") or INSTALLED
with warnings.catch_warnings():
    warnings.simplefilter("ignore")  # an untested release is the last test's failure, not an import error
    SELECTED = versions.select(catalog.all_patches(), installed=CHECKED_AS, allow_untested=True)
RECORDS = [p for p in SELECTED if isinstance(p, registry.Patch | registry.PrivateCall)]
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


def needs_target_module(record: registry.Patch | registry.PrivateCall) -> None:
    """Megatron-LM's modules are importable only from a checkout (MEGATRON_LM_DIR)."""
    modules = (record.target, *record.importers)
    if not any(m.startswith("megatron.training") for m in modules):
        return
    if not MEGATRON_LM_DIR:
        pytest.skip("Megatron-LM hook: needs a checkout in MEGATRON_LM_DIR")
    for module in ("six", "regex", "triton", "pydantic"):
        pytest.importorskip(module, reason="Megatron-LM's training code imports it")
    script.make_importable(os.path.join(MEGATRON_LM_DIR, "pretrain_gpt.py"))


@pytest.mark.parametrize("record", RECORDS, ids=lambda p: p.name)
def test_target_exists_with_the_recorded_signature(record):
    needs_target_module(record)
    _, _, original = registry.resolve(record.target)
    if record.must_exist:
        assert original is not registry.ABSENT, f"{record.name}: {record.target} no longer exists"
    if record.signature is not None:
        assert registry.current_signature(record) == record.signature, (
            f"{record.name}: {record.target} changed (variant verified on {'/'.join(record.verified_on)}, "
            f"megatron-core {INSTALLED} installed)"
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


def test_every_record_has_a_variant_verified_on_the_installed_megatron_core():
    versions.select(catalog.all_patches(), installed=INSTALLED)


def test_no_two_variants_claim_one_release_and_the_table_lists_them_all():
    for release in versions.EVERY_VERIFIED:
        versions.select(catalog.all_patches(), installed=release)
    table = catalog.table()
    assert all(p.name in table for p in catalog.all_patches())
