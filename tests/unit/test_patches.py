"""The patch registry: apply, rebind importers, count, refuse, revert (twice), version gate."""

from __future__ import annotations

import sys
import types

import pytest
from torch.overrides import TorchFunctionMode

from prism_megatron.patches import registry, versions
from prism_megatron.patches.registry import ABSENT, ModePatch, Patch

INSTALLED = registry.installed_megatron_core_version()


def original_add(a, b):
    return a + b


class Owner:
    def method(self):
        return "original"


class Child(Owner):
    pass


@pytest.fixture
def fake_modules():
    """A target module, a module that imported its function by name, and cleanup."""
    target = types.ModuleType("prism_test_target")
    target.add = original_add
    target.Child = Child
    importer = types.ModuleType("prism_test_importer")
    importer.add = target.add
    importer.plus = target.add
    sys.modules.update(prism_test_target=target, prism_test_importer=importer)
    yield target, importer
    del sys.modules["prism_test_target"], sys.modules["prism_test_importer"]


def doubling(original):
    return lambda a, b: 2 * original(a, b)


def record(**overrides) -> Patch:
    fields = {
        "name": "test.add",
        "target": "prism_test_target:add",
        "make": doubling,
        "verified_on": (INSTALLED,),
        "reason": "test",
    }
    return Patch(**{**fields, **overrides})


def test_apply_replaces_target_and_every_importer_then_revert_restores(fake_modules):
    target, importer = fake_modules
    applied = registry.apply([record(importers=("prism_test_importer", "prism_test_importer:plus"))])
    assert target.add(1, 2) == 6
    assert importer.add(1, 2) == 6
    assert importer.plus(1, 2) == 6
    applied.revert()
    assert target.add is original_add and importer.add is original_add and importer.plus is original_add


def test_revert_is_safe_twice(fake_modules):
    target, _ = fake_modules
    applied = registry.apply([record()])
    applied.revert()
    applied.revert()
    assert target.add is original_add


def test_calls_are_counted_per_patch(fake_modules):
    target, _ = fake_modules
    with registry.patched(
        [record(), record(name="test.unused", target="prism_test_target:missing", must_exist=False)]
    ) as applied:
        target.add(1, 1)
        target.add(2, 2)
        assert applied.used() == {"test.add": 2, "test.unused": 0}


def test_a_target_already_replaced_elsewhere_is_refused_and_nothing_stays_applied(fake_modules):
    target, importer = fake_modules
    importer.add = lambda a, b: 0  # someone else's patch
    with pytest.raises(RuntimeError, match="refusing to stack"):
        registry.apply(
            [
                record(name="first", target="prism_test_target:Child"),
                record(importers=("prism_test_importer",)),
            ]
        )
    assert target.Child is Child and target.add is original_add


def test_an_absent_attribute_is_added_then_deleted(fake_modules):
    target, _ = fake_modules
    with registry.patched(
        [record(target="prism_test_target:te_gemm", make=lambda original: None, must_exist=False)]
    ):
        assert target.te_gemm is None
    assert not hasattr(target, "te_gemm")


def test_the_make_function_receives_ABSENT_for_a_missing_attribute(fake_modules):
    seen = []
    with registry.patched(
        [record(target="prism_test_target:nothing", make=lambda original: seen.append(original))]
    ):
        pass
    assert seen == [ABSENT]


def test_an_inherited_method_is_shadowed_then_unshadowed(fake_modules):
    with registry.patched(
        [record(target="prism_test_target:Child.method", make=lambda original: lambda self: "patched")]
    ):
        assert Child().method() == "patched"
        assert Owner().method() == "original"
    assert "method" not in Child.__dict__
    assert Child().method() == "original"


def test_revert_leaves_a_later_foreign_replacement_in_place_and_warns(fake_modules):
    target, _ = fake_modules
    applied = registry.apply([record()])
    foreign = lambda a, b: -1  # noqa: E731
    target.add = foreign
    with pytest.warns(UserWarning, match="replaced by someone else"):
        applied.revert()
    assert target.add is foreign


def test_an_untested_megatron_core_is_refused_in_one_line_naming_it_and_the_flag(fake_modules):
    untested = record(verified_on=("0.1.0", "0.2.0"))
    with pytest.raises(registry.UntestedMegatronError) as refused:
        registry.apply([untested])
    message = str(refused.value)
    assert "\n" not in message
    assert f"megatron-core {INSTALLED} is not" in message
    assert "(0.1.0, 0.2.0)" in message and "--prism-allow-untested-megatron" in message
    assert fake_modules[0].add is original_add


def test_allow_untested_applies_with_a_warning(fake_modules):
    untested = record(verified_on=("0.1.0",))
    with (
        pytest.warns(UserWarning, match="not a release"),
        registry.patched([untested], allow_untested=True),
    ):
        assert fake_modules[0].add(1, 1) == 4


def test_versions_compare_as_versions_not_strings():
    versions.select([record(verified_on=("0.16.1",))], installed="0.16.01")
    with pytest.raises(registry.UntestedMegatronError):
        versions.select([record(verified_on=("0.16.1",))], installed="0.16.10")


def variants():
    old = record(verified_on=("0.16.1",), make=lambda original: lambda a, b: "old")
    new = record(verified_on=("0.19.0", "0.19.2"), make=lambda original: lambda a, b: "new")
    return old, new


@pytest.mark.parametrize(("installed", "expected"), [("0.16.1", "old"), ("0.19.0", "new"), ("0.19.2", "new")])
def test_each_release_gets_the_variant_verified_on_it(installed, expected):
    (chosen,) = versions.select(variants(), installed=installed)
    assert chosen.make(None)(1, 2) == expected


@pytest.mark.parametrize(
    ("installed", "expected"), [("0.17.1", "old"), ("0.19.9", "new"), ("0.20.0", "new"), ("0.15.0", "old")]
)
def test_an_untested_release_is_refused_or_given_the_nearest_variant_below(installed, expected):
    with pytest.raises(registry.UntestedMegatronError, match=r"\(0\.16\.1, 0\.19\.0, 0\.19\.2\)"):
        versions.select(variants(), installed=installed)
    with pytest.warns(UserWarning, match=installed):
        (chosen,) = versions.select(variants(), installed=installed, allow_untested=True)
    assert chosen.make(None)(1, 2) == expected


def test_the_releases_named_are_those_every_record_was_verified_on():
    other = record(name="test.other", verified_on=("0.16.1",))
    with pytest.raises(registry.UntestedMegatronError, match=r"verified on \(0\.16\.1\)"):
        versions.select([*variants(), other], installed="0.18.0")


def test_order_follows_the_first_variant_of_each_name():
    first = record(name="test.first", verified_on=("0.16.1", "0.19.2"))
    chosen = versions.select([*variants(), first], installed="0.19.2")
    assert [p.name for p in chosen] == ["test.add", "test.first"]


class CountingMode(TorchFunctionMode):
    def __init__(self, count):
        super().__init__()
        self.count = count

    def __torch_function__(self, func, types, args=(), kwargs=None):
        self.count()
        return func(*args, **(kwargs or {}))


def test_a_mode_patch_is_active_while_applied_and_counts():
    import torch

    mode = ModePatch(name="test.mode", make_mode=CountingMode, verified_on=(INSTALLED,), reason="test")
    with registry.patched([mode]) as applied:
        torch.ones(2).sum()
        assert applied.used()["test.mode"] >= 2
    calls = applied.used()["test.mode"]
    torch.ones(2).sum()
    assert applied.used()["test.mode"] == calls


def test_duplicate_names_and_malformed_targets_are_rejected():
    with pytest.raises(ValueError, match="2 variants claim"):
        registry.apply([record(), record()])
    with pytest.raises(ValueError, match="module:attr"):
        record(target="no_colon")


def test_table_lists_every_patch_with_its_versions():
    text = registry.table([record(), record(name="test.other", verified_on=("0.16.1", "0.17.0"))])
    assert "test.add" in text and "prism_test_target:add" in text and "0.16.1/0.17.0" in text


def scaling(original, *, factor):
    return lambda a, b: factor * original(a, b)


def test_a_record_that_needs_a_run_is_applied_only_once_bound_and_binding_changes_no_record(fake_modules):
    target, _ = fake_modules
    needing = record(make=scaling, needs=("factor",))
    with pytest.raises(RuntimeError, match=r"test\.add: bind it to a run first \(it needs factor\)"):
        registry.apply([needing])
    assert target.add is original_add
    with pytest.raises(ValueError, match=r"test\.add: binding it to a run needs factor"):
        registry.bind([needing], world=object())
    (bound,) = registry.bind([needing], factor=10, unused="ignored")
    assert needing.needs == ("factor",) and bound.needs == ()
    with registry.patched([bound]):
        assert target.add(1, 2) == 30
    assert target.add is original_add
    assert registry.bind([record()]) == (record(),)  # a record needing nothing passes unchanged


def test_a_private_call_is_version_gated_and_never_applied(fake_modules):
    private = registry.PrivateCall(
        name="test.private", target="prism_test_target:add", verified_on=(INSTALLED,), reason="test"
    )
    assert registry.private_call(private) is original_add
    untested = registry.PrivateCall(
        name="test.private", target="prism_test_target:add", verified_on=("0.1.0",), reason="test"
    )
    with pytest.raises(registry.UntestedMegatronError, match="--prism-allow-untested-megatron"):
        registry.private_call(untested)
    with pytest.warns(UserWarning, match="not a release"):
        assert registry.private_call([untested], allow_untested=True) is original_add
    with pytest.raises(TypeError, match="replaces nothing"):
        registry.apply([private])
