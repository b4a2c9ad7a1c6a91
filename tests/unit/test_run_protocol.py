"""The run the patches are bound to meets the protocol they are written against (`patches/run.py`):
every attribute and method a patch may use exists on `Runtime` and `TrainingRecord`, with the same
parameters, so binding the real run never fails where a patch reaches for it."""

from __future__ import annotations

import dataclasses
import inspect
import typing

from prism_megatron.megatron.run.runtime import Runtime, TrainingRecord
from prism_megatron.patches import run


def _members(protocol: type) -> dict[str, object]:
    names = set(typing.get_type_hints(protocol)) | {
        name for name, value in vars(protocol).items() if not name.startswith("_") and callable(value)
    }
    names |= {name for name, value in vars(protocol).items() if isinstance(value, property)}
    return {name: vars(protocol).get(name) for name in sorted(names)}


def _parameters(function) -> list[str]:
    return [p.name for p in inspect.signature(function).parameters.values()]


def test_the_runtime_has_everything_a_patch_may_use_of_the_run():
    fields = {f.name for f in dataclasses.fields(Runtime)}
    for name, declared in _members(run.Run).items():
        assert name in fields or hasattr(Runtime, name), name
        if callable(declared) and not isinstance(declared, property):
            assert _parameters(getattr(Runtime, name)) == _parameters(declared), name


def test_the_training_record_is_what_the_train_step_hook_reports_to():
    for name, declared in _members(run.StepRecord).items():
        assert _parameters(getattr(TrainingRecord, name))[: len(_parameters(declared))] == _parameters(
            declared
        )


def test_the_check_sees_a_missing_method():
    class Partial:
        config = device = sizes = world = None

    assert not all(hasattr(Partial, name) for name in _members(run.Run))
