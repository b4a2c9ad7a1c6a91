"""The patch registry: every change prism makes to Megatron or torch is a record, applied and undone here.

Why a registry rather than scattered `setattr`: a patch is a bet on another project's internals. Each
record says what it replaces, why no extension point sufficed, which megatron-core versions it was
verified on and which modules bound the target by name at import (those bindings must be rebound
too, or half of Megatron keeps calling the original). Applying refuses an untested megatron-core
unless the user opts in, refuses to stack on a target someone else already replaced, and counts
calls so a report can say which patches a run actually used. Reverting unwinds in reverse order and
is safe to call twice. A drift test per record compares the target's signature with the recorded one.

Three kinds of record:
- `Patch`: replaces one attribute (`"module:attr"` or `"module:Class.attr"`).
- `ModePatch`: pushes a `torch.overrides.TorchFunctionMode` for the lifetime of the application
  (the only way to reach hard-coded literals such as `device="cuda"` inside Megatron functions).
- `PrivateCall`: a private megatron-core function prism calls as it is. Nothing is replaced, but it is
  the same bet on internals, so it is versioned and drift-tested like a patch (`private_call`).

A record describes a change; binding it to a run is a separate step. A record whose replacement
depends on the run (its virtual world, its runtime, the device of a build) names what it `needs`,
and `bind` supplies it; so the catalog lists every record without a run, and `apply` refuses a
record that was not bound.
"""

from __future__ import annotations

import collections
import dataclasses
import functools
import importlib
import inspect
import types
import warnings
from collections.abc import Callable, Iterable, Iterator, Mapping
from contextlib import contextmanager
from typing import Any

from prism_megatron.patches.versions import (
    UntestedMegatronError,
    installed_megatron_core_version,
    select,
)

__all__ = ["UntestedMegatronError", "installed_megatron_core_version"]


class _Absent:
    """Marks a target attribute that does not exist before the patch (it is added, then deleted)."""

    def __repr__(self) -> str:
        return "ABSENT"


ABSENT: Any = _Absent()


@dataclasses.dataclass(frozen=True, kw_only=True)
class Patch:
    """One replaced attribute."""

    name: str
    """Unique short name, as `--prism-list-patches` prints it."""
    target: str
    """`"module.path:attr"` or `"module.path:Class.attr"`; the module is imported when applied."""
    make: Callable[..., Any]
    """Builds the replacement from the original object (`ABSENT` when the attribute does not exist)
    and, as keyword arguments, what the record `needs` of a run."""
    verified_on: tuple[str, ...]
    """megatron-core releases this variant was verified on (exact versions; see `versions`). Variants
    of one record share its name and split the releases between them."""
    reason: str
    """Why it is needed and why no extension point sufficed."""
    importers: tuple[str, ...] = ()
    """Modules that did `from <module> import <attr>`: `"module"` or `"module:alias"`; rebound too."""
    signature: str | None = None
    """The target's signature as verified (`current_signature`); None for non-callables. The drift
    test checks it."""
    count_calls: bool = True
    """Wrap the replacement so each call is counted (only for plain functions)."""
    must_exist: bool = True
    """Whether the target exists on every verified install (False: added when absent, like a missing global)."""
    needs: tuple[str, ...] = ()
    """What binding the record to a run supplies (`bind`): the keyword arguments `make` takes after
    the original, e.g. `("world",)`. Empty: the record is the same in every run."""

    def __post_init__(self) -> None:
        module, _, qualname = self.target.partition(":")
        if not module or not qualname:
            raise ValueError(f"patch {self.name!r}: target {self.target!r} must read 'module:attr'")
        if self.importers and "." in qualname:
            raise ValueError(f"patch {self.name!r}: only module-level targets can have importers")
        if not self.verified_on:
            raise ValueError(f"patch {self.name!r}: verified_on must name at least one version")


@dataclasses.dataclass(frozen=True, kw_only=True)
class ModePatch:
    """A torch function mode pushed while the patches are applied."""

    name: str
    """Unique short name, as `--prism-list-patches` prints it."""
    make_mode: Callable[[Callable[[], None]], Any]
    """Builds the mode; it gets a `count()` callback to call whenever it rewrites a call."""
    verified_on: tuple[str, ...]
    """megatron-core versions this patch was verified on (exact versions)."""
    reason: str
    """Why it is needed and why no extension point sufficed."""
    target: str = "torch.overrides:TorchFunctionMode"
    """What it hooks (for the table)."""


@dataclasses.dataclass(frozen=True, kw_only=True)
class PrivateCall:
    """A private megatron-core function prism calls as it is (nothing is replaced)."""

    name: str
    """Unique short name, as `--prism-list-patches` prints it."""
    target: str
    """`"module.path:attr"` or `"module.path:Class.attr"`."""
    verified_on: tuple[str, ...]
    """megatron-core releases this variant was verified on (exact versions)."""
    reason: str
    """Why prism calls it and why no public function sufficed."""
    signature: str | None = None
    """The target's signature as verified; the drift test checks it."""
    importers: tuple[str, ...] = ()
    """Always empty (nothing is rebound); kept so drift tests read every record alike."""
    must_exist: bool = True


AnyPatch = Patch | ModePatch
AnyRecord = Patch | ModePatch | PrivateCall


def variants(*, by_release: Mapping[tuple[str, ...], Mapping[str, Any]], **common: Any) -> tuple[Patch, ...]:
    """One record's variants: the fields all share, and per group of releases what differs there
    (a signature, the importers, a target that moved and the replacement that fits it)."""
    return tuple(
        Patch(**{**common, **differs}, verified_on=releases) for releases, differs in by_release.items()
    )


def bind(records: Iterable[AnyPatch], **context: Any) -> tuple[AnyPatch, ...]:
    """The records ready to apply in a run: each one's `needs` taken from `context`.

    Records that need nothing pass unchanged; context a record does not need is ignored.

    Raises:
        ValueError: a record needs something `context` does not give.
    """
    bound = []
    for record in records:
        needs = getattr(record, "needs", ())
        if needs:
            missing = [n for n in needs if n not in context]
            if missing:
                raise ValueError(f"patch {record.name}: binding it to a run needs {', '.join(missing)}")
            given = {n: context[n] for n in needs}
            record = dataclasses.replace(record, make=functools.partial(record.make, **given), needs=())
        bound.append(record)
    return tuple(bound)


def private_call(record: PrivateCall | Iterable[PrivateCall], *, allow_untested: bool = False) -> Any:
    """The private function a record names, after the version check every patch gets.

    Args:
        record: the record, or its variants (one per group of releases).

    Raises:
        UntestedMegatronError: no variant was verified on the installed megatron-core (unless
            `allow_untested`: then the nearest variant below, with a warning).
    """
    candidates = (record,) if isinstance(record, PrivateCall) else tuple(record)
    (chosen,) = select(candidates, allow_untested=allow_untested)
    _, _, target = resolve(chosen.target)
    if target is ABSENT:
        raise RuntimeError(
            f"prism record {chosen.name}: {chosen.target} does not exist in this megatron-core"
        )
    return target


def resolve(target: str) -> tuple[Any, str, Any]:
    """Return (owner object, attribute name, current value or ABSENT) for a `module:qualname` target."""
    module_name, _, qualname = target.partition(":")
    owner: Any = importlib.import_module(module_name)
    *path, attr = qualname.split(".")
    for part in path:
        owner = getattr(owner, part)
    return owner, attr, getattr(owner, attr, ABSENT)


def _importer_slot(importer: str, default_attr: str) -> tuple[types.ModuleType, str]:
    module_name, _, alias = importer.partition(":")
    return importlib.import_module(module_name), alias or default_attr


@dataclasses.dataclass
class _Undo:
    owner: Any
    attr: str
    had_own: bool
    old_value: Any
    new_value: Any
    patch_name: str


class AppliedPatches:
    """The live application of a list of patches: what to undo, and how often each was called."""

    def __init__(self) -> None:
        self._undo: list[_Undo] = []
        self._modes: list[tuple[str, Any]] = []
        self.calls: collections.Counter[str] = collections.Counter()
        self.names: list[str] = []
        self.active = True

    def count(self, name: str) -> None:
        self.calls[name] += 1

    def used(self) -> dict[str, int]:
        """Calls per applied patch name (0 for patches never hit), in application order."""
        return {name: self.calls.get(name, 0) for name in self.names}

    def revert(self) -> None:
        """Undo in reverse order. Safe to call twice; warns when someone else replaced a target since."""
        if not self.active:
            return
        self.active = False
        for name, mode in reversed(self._modes):
            try:
                mode.__exit__(None, None, None)
            except Exception as exc:  # a mode stack unwound out of order; keep undoing the rest
                warnings.warn(
                    f"prism patch {name}: could not pop its torch function mode: {exc}", stacklevel=2
                )
        for undo in reversed(self._undo):
            current = undo.owner.__dict__.get(undo.attr, ABSENT)
            if current is not undo.new_value:
                warnings.warn(
                    f"prism patch {undo.patch_name}: {undo.owner!r}.{undo.attr} was replaced by someone "
                    "else after prism patched it; leaving their value in place",
                    stacklevel=2,
                )
                continue
            if undo.had_own:
                setattr(undo.owner, undo.attr, undo.old_value)
            else:
                delattr(undo.owner, undo.attr)
        self._undo.clear()
        self._modes.clear()


def _counted(replacement: Any, name: str, applied: AppliedPatches) -> Any:
    if not isinstance(replacement, types.FunctionType):
        return replacement

    @functools.wraps(replacement)
    def counted(*args: Any, **kwargs: Any) -> Any:
        applied.count(name)
        return replacement(*args, **kwargs)

    return counted


def _set(owner: Any, attr: str, value: Any, name: str, applied: AppliedPatches) -> None:
    had_own = attr in owner.__dict__
    old_value = owner.__dict__.get(attr, ABSENT)
    setattr(owner, attr, value)
    applied._undo.append(_Undo(owner, attr, had_own, old_value, owner.__dict__[attr], name))


def _apply_one(patch: AnyPatch, applied: AppliedPatches) -> None:
    if isinstance(patch, PrivateCall):
        raise TypeError(f"prism record {patch.name} replaces nothing; call it through private_call")
    if getattr(patch, "needs", ()):
        raise RuntimeError(
            f"prism patch {patch.name}: bind it to a run first (it needs {', '.join(patch.needs)})"
        )
    if isinstance(patch, ModePatch):
        mode = patch.make_mode(functools.partial(applied.count, patch.name))
        mode.__enter__()
        applied._modes.append((patch.name, mode))
        return
    owner, attr, original = resolve(patch.target)
    slots = [_importer_slot(i, attr) for i in patch.importers]
    for module, alias in slots:
        bound = getattr(module, alias, ABSENT)
        if bound is not original:
            raise RuntimeError(
                f"prism patch {patch.name}: {module.__name__}.{alias} is not the original {patch.target} "
                "(another tool patched it, or Megatron changed its imports); refusing to stack patches"
            )
    replacement = patch.make(original)
    if patch.count_calls:
        replacement = _counted(replacement, patch.name, applied)
    _set(owner, attr, replacement, patch.name, applied)
    for module, alias in slots:
        _set(module, alias, replacement, patch.name, applied)


def apply(patches: Iterable[AnyPatch], *, allow_untested: bool = False) -> AppliedPatches:
    """Apply, in order, each record's variant for the installed megatron-core; undo all on any failure.

    Raises:
        UntestedMegatronError: a record has no variant verified on the installed release (unless
            `allow_untested`: then it takes its nearest variant below, with a warning).
        ValueError: two records of one name claim the same release.
        RuntimeError: a target was already replaced by someone else, or a record was not bound.
    """
    patches = select(patches, allow_untested=allow_untested)
    applied = AppliedPatches()
    try:
        for patch in patches:
            _apply_one(patch, applied)
            applied.names.append(patch.name)
    except BaseException:
        applied.revert()
        raise
    return applied


@contextmanager
def patched(patches: Iterable[AnyPatch], *, allow_untested: bool = False) -> Iterator[AppliedPatches]:
    """Apply patches for the duration of a `with` block (what tests use)."""
    applied = apply(patches, allow_untested=allow_untested)
    try:
        yield applied
    finally:
        applied.revert()


def current_signature(patch: Patch | PrivateCall) -> str | None:
    """The target's signature as installed now (for drift tests); None when not introspectable.

    Annotations written as strings (a module with `from __future__ import annotations`) are evaluated
    first where they can be, so a module that only changed how it spells its annotations does not
    read as a changed target.
    """
    _, _, original = resolve(patch.target)
    if original is ABSENT or not callable(original):
        return None
    for eval_str in (True, False):
        try:
            return str(inspect.signature(original, eval_str=eval_str))
        except (NameError, TypeError, ValueError, AttributeError, SyntaxError):
            continue
    return None


def table(patches: Iterable[AnyRecord]) -> str:
    """A plain-text table of the patches (what `--prism-list-patches` prints)."""
    rows = [("name", "target", "verified on", "reason")]
    for p in patches:
        rows.append((p.name, p.target, "/".join(p.verified_on), p.reason))
    widths = [max(len(r[i]) for r in rows) for i in range(3)]
    lines = []
    for r in rows:
        lines.append("  ".join(r[i].ljust(widths[i]) for i in range(3)) + "  " + r[3])
    return "\n".join(lines)
