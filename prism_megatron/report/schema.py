"""The schema of report.json: a JSON Schema file for its shape, and the checks a schema cannot express.

report.json is what a run leaves for people and for tools: the target job, what the real ranks
measured and what the simulator predicted. Readers reject what they do not understand, so every
document carries `schema_version` and `validate` refuses a newer one with a sentence saying so.

The shape (required keys, no unknown keys, JSON types, times and sizes >= 0) is `report.schema.json`
(JSON Schema draft 2020-12, in the package, checked with `jsonschema`), which other tools can use
as it is. `validate(doc)` checks that, then what the schema cannot say: finite numbers, ranks inside
the world, iteration indices increasing, and consistency
(`dp` = world / (tp pp cp); the ranks table holds only real ranks, all of them when the run is ok;
`iteration_time_s` is the median of the iterations after warm-up; each role's compute, exposed
communication and bubble add up to the simulated iteration time, as the simulator's breakdown
guarantees; the capture's classes hold every role of the job once). Every error names its key path (`$.ranks.7168.compute_s`), and all are reported at once
(consistency is checked once the shape is right, as it reads the values the shape check vouches for).
"""

from __future__ import annotations

import functools
import itertools
import json
import math
import os
import reprlib
import statistics
from collections.abc import Iterable
from typing import Any

SCHEMA_VERSION = 1
STATUSES = ("ok", "failed", "running", "interrupted")
"""running and interrupted runs have not finished (`FINISHED` have)."""
FINISHED = ("ok", "failed")
MEMORY_CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations")
"""Categories of `memory_by_category`, as `prism_megatron.passes.memory` names them."""

_REL_TOLERANCE = 1e-6


class SchemaError(ValueError):
    """report.json does not follow the schema; `errors` lists every problem with its key path."""

    def __init__(self, errors: list[str], source: str = "report.json") -> None:
        self.errors = list(errors)
        shown = "; ".join(errors[:8]) + (f"; ... ({len(errors) - 8} more)" if len(errors) > 8 else "")
        super().__init__(f"{source} does not follow report schema {SCHEMA_VERSION}: {shown}")


SCHEMA_FILE = os.path.join(os.path.dirname(os.path.abspath(__file__)), "report.schema.json")
"""The JSON Schema (draft 2020-12) of report.json's shape, shipped in the package."""

_TYPE_WORDS = {
    "integer": "an integer",
    "number": "a number",
    "string": "a string",
    "object": "an object",
    "array": "an array",
    "boolean": "true or false",
    "null": "null",
}


@functools.lru_cache(maxsize=1)
def json_schema() -> dict[str, Any]:
    """The parsed schema file."""
    with open(SCHEMA_FILE, encoding="utf-8") as f:
        return json.load(f)


@functools.lru_cache(maxsize=1)
def _validator():
    import jsonschema

    schema = json_schema()
    jsonschema.Draft202012Validator.check_schema(schema)
    return jsonschema.Draft202012Validator(schema)


def _path(parts: Iterable[Any]) -> str:
    out = "$"
    for part in parts:
        out += f"[{part}]" if isinstance(part, int) else f".{part}"
    return out


def _message(error) -> list[str]:
    """Our one-line messages for a jsonschema error (the key path first, then what is wrong)."""
    path, value, rule, expected = (
        _path(error.absolute_path),
        error.instance,
        error.validator,
        error.validator_value,
    )
    if rule == "required":
        return [f"{path}: missing key {key!r}" for key in expected if key not in value]
    if rule == "additionalProperties":
        known = set(error.schema.get("properties", {}))
        unknown = sorted(set(value) - known)
        return [f"{path}: unknown key(s) {', '.join(map(repr, unknown))}"]
    if rule == "type":
        kinds = [k for k in ([expected] if isinstance(expected, str) else expected) if k != "null"]
        shown = type(value).__name__ if "object" in kinds or "array" in kinds else repr(value)
        return [f"{path}: must be {' or '.join(_TYPE_WORDS[k] for k in kinds)}, got {shown}"]
    if rule == "minimum":
        return [f"{path}: must be >= {expected}, got {reprlib.repr(value)}"]
    if rule == "maximum":  # a huge number is shown shortened: the message stays one readable line
        bound = f"{expected:g}" if isinstance(expected, float) else str(expected)
        return [f"{path}: must be <= {bound}, got {reprlib.repr(value)}"]
    if rule == "enum":
        return [f"{path}: must be one of {', '.join(map(str, expected))}, got {value!r}"]
    if (
        rule == "pattern"
        and error.absolute_path == error.relative_path
        and "propertyNames" in error.schema_path
    ):
        return [f"{path}: key {value!r} must be a virtual rank written as a decimal string"]
    return [f"{path}: {error.message}"]


def _shape_errors(doc: Any) -> list[str]:
    errors = sorted(_validator().iter_errors(doc), key=lambda e: _order(e.absolute_path))
    return [line for error in errors for line in _message(error)]


def _order(path) -> tuple:
    """Document order of report.json's top-level keys, then the path itself."""
    parts = list(path)
    top = _TOP_LEVEL_ORDER.index(parts[0]) if parts and parts[0] in _TOP_LEVEL_ORDER else -1
    return (top, [str(p) for p in parts])


_TOP_LEVEL_ORDER = (
    "schema_version",
    "status",
    "failure",
    "target",
    "real_ranks",
    "iterations",
    "iteration_time_s",
    "ranks",
    "roles",
    "simulated_iteration_time_s",
    "model_flops_per_iteration",
    "tflops_per_gpu",
    "tokens_per_s_per_gpu",
    "megatron_names",
    "prism",
    "shims_used",
    "patches",
    "capture",
    "versions",
    "created",
    "artefacts",
)


def _non_finite(value: Any, path: str, errors: list[str]) -> None:
    """JSON Schema cannot refuse NaN or infinity (Python's json writes and reads them)."""
    if isinstance(value, float) and not math.isfinite(value):
        errors.append(f"{path}: must be finite, got {value!r}")
    elif isinstance(value, dict):
        for key, entry in value.items():
            _non_finite(entry, f"{path}.{key}", errors)
    elif isinstance(value, list):
        for index, entry in enumerate(value):
            _non_finite(entry, f"{path}[{index}]", errors)


def validate(doc: Any, source: str = "report.json") -> None:
    """Raise SchemaError listing every problem of `doc` (a parsed report.json); return if valid."""
    version = doc.get("schema_version") if isinstance(doc, dict) else None
    if isinstance(version, int) and version > SCHEMA_VERSION:
        raise SchemaError(
            [
                f"$.schema_version: {version} is newer than this prism-megatron understands "
                f"({SCHEMA_VERSION}); upgrade prism-megatron to read it"
            ],
            source,
        )
    errors = _shape_errors(doc)
    _non_finite(doc, "$", errors)
    if not errors:
        _check_consistency(doc, errors)
    if errors:
        raise SchemaError(errors, source)


def _check_agreement(doc: dict, errors: list[str]) -> None:
    for key, entry in (doc.get("agreement") or {}).items():
        if int(key) not in doc["real_ranks"]:
            errors.append(
                f"$.agreement.{key}: virtual rank {key} is not one of real_ranks {doc['real_ranks']}"
            )
        names = (
            "iterations",
            "emulated_s",
            "simulated_s",
            "expected_s",
            "replayed_s",
            "schedule_compute_s",
            "measured_compute_s",
        )
        lengths = {name: len(entry[name]) for name in names if entry.get(name) is not None}
        if len(set(lengths.values())) != 1:
            errors.append(
                f"$.agreement.{key}: one value per iteration compared in each list, got lengths {lengths}"
            )


def _check_consistency(doc: dict, errors: list[str]) -> None:
    target, status = doc["target"], doc["status"]
    world_size = target["world_size"]
    model_size = target["tp"] * target["pp"] * target["cp"]
    if world_size % model_size or target["dp"] != world_size // model_size:
        errors.append(
            f"$.target.dp: must be world_size / (tp * pp * cp) = {world_size}/{model_size}, got {target['dp']}"
        )
    real = doc["real_ranks"]
    if not real and status not in ("failed", "interrupted"):
        errors.append("$.real_ranks: must name at least one real rank")
    if len(set(real)) != len(real):
        errors.append(f"$.real_ranks: must not repeat a rank, got {real}")
    outside = [r for r in real if r >= world_size]
    errors += [f"$.real_ranks: rank {r} is outside the world (0..{world_size - 1})" for r in outside]
    for key in doc["ranks"]:
        if key.isdigit() and int(key) not in real:
            errors.append(f"$.ranks.{key}: virtual rank {key} is not one of real_ranks {real}")
    missing = [r for r in real if str(r) not in doc["ranks"]]
    if status == "ok" and missing:
        errors.append(f"$.ranks: an ok run reports every real rank; missing {missing}")
    if status == "failed" and not doc.get("failure"):
        errors.append("$.failure: a failed run must say why (message, dead_rank, last_op)")
    dead = (doc.get("failure") or {}).get("dead_rank")
    if dead is not None and dead >= world_size:
        errors.append(f"$.failure.dead_rank: rank {dead} is outside the world (0..{world_size - 1})")
    if status not in ("failed", "interrupted") and doc.get("failure"):
        errors.append(f"$.failure: only a failed or interrupted run has a failure, but status is {status!r}")
    _check_iterations(doc, errors)
    _check_agreement(doc, errors)
    _check_roles(doc, errors)
    _check_tokens(doc, errors)
    _check_capture(doc, errors)


def _check_iterations(doc: dict, errors: list[str]) -> None:
    indices = [it["index"] for it in doc["iterations"]]
    if any(b <= a for a, b in itertools.pairwise(indices)):
        errors.append(f"$.iterations: indices must increase, got {indices}")
    times = [it["time_s"] for it in doc["iterations"] if not it.get("warmup", False)]
    claimed = doc["iteration_time_s"]
    if claimed is None:
        if times and doc["status"] == "ok":
            errors.append("$.iteration_time_s: an ok run with measured iterations must give their median")
        return
    if not times:
        errors.append("$.iteration_time_s: given, but no iteration after warm-up was measured")
    elif not math.isclose(claimed, statistics.median(times), rel_tol=_REL_TOLERANCE, abs_tol=1e-12):
        errors.append(
            f"$.iteration_time_s: must be the median of the iterations after warm-up "
            f"({statistics.median(times)!r}), got {claimed!r}"
        )


def _check_roles(doc: dict, errors: list[str]) -> None:
    roles, simulated = doc.get("roles") or {}, doc["simulated_iteration_time_s"]
    world_size = doc["target"]["world_size"]
    for name, role in roles.items():
        if role["virtual_rank"] >= world_size:
            errors.append(f"$.roles.{name}.virtual_rank: {role['virtual_rank']} is outside the world")
        total = role["compute_s"] + role["exposed_comm_s"] + role["bubble_s"]
        if simulated is not None and not math.isclose(total, simulated, rel_tol=_REL_TOLERANCE, abs_tol=1e-9):
            errors.append(
                f"$.roles.{name}: compute_s + exposed_comm_s + bubble_s = {total!r} must equal "
                f"simulated_iteration_time_s {simulated!r}"
            )
    if roles and sum(role["count"] for role in roles.values()) != world_size:
        errors.append(f"$.roles: the role counts must add up to world_size {world_size}")


def _check_tokens(doc: dict, errors: list[str]) -> None:
    claimed, time_s = doc.get("tokens_per_s_per_gpu"), doc["iteration_time_s"]
    if claimed is None or not time_s:
        return
    target = doc["target"]
    expected = target["global_batch_size"] * target["seq_length"] / (time_s * target["world_size"])
    if not math.isclose(claimed, expected, rel_tol=_REL_TOLERANCE):
        errors.append(
            f"$.tokens_per_s_per_gpu: must be global_batch_size x seq_length / (iteration_time_s x "
            f"world_size) = {expected!r}, got {claimed!r}"
        )


def _check_capture(doc: dict, errors: list[str]) -> None:
    """The classes partition the job's roles; counts agree; captured roles and ranks exist."""
    capture = doc.get("capture")
    if not capture:
        return
    members = [m for ms in capture["classes"].values() for m in ms]
    if len(members) != capture["num_roles"] or len(set(members)) != len(members):
        errors.append(
            f"$.capture.classes: must hold each of the {capture['num_roles']} roles once, holds {len(members)}"
        )
    if capture["num_captured_roles"] != len(capture["captured_ranks"]):
        errors.append("$.capture.num_captured_roles: must count $.capture.captured_ranks")
    unknown = sorted(set(capture["captured_ranks"]) - set(members))
    if unknown:
        errors.append(f"$.capture.captured_ranks: roles {unknown} are in no class")
    world_size = doc["target"]["world_size"]
    outside = sorted(r for r in capture["captured_ranks"].values() if r >= world_size)
    errors += [f"$.capture.captured_ranks: rank {r} is outside the world" for r in outside]
