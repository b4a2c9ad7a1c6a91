"""The schema of report.json, checked in plain Python (no JSON-schema dependency).

report.json is what a run leaves for people and for tools: the target job, what the real ranks
measured and what the simulator predicted. Readers reject what they do not understand, so every
document carries `schema_version` and `validate` refuses a newer one with a sentence saying so.

`validate(doc)` checks, in order: the shape (required keys, no unknown keys, JSON types), sane values
(times and sizes >= 0, ranks inside the world, iteration indices increasing) and consistency
(`dp` = world / (tp pp cp); the ranks table holds only real ranks, all of them when the run is ok;
`iteration_time_s` is the median of the iterations after warm-up; each role's compute, exposed
communication and bubble add up to the simulated iteration time, as the simulator's breakdown
guarantees). Every error names its key path (`$.ranks.7168.compute_s`), and all are reported at once
(consistency is checked once the shape is right, as it reads the values the shape check vouches for).
"""

from __future__ import annotations

import itertools
import math
import statistics
from collections.abc import Callable, Mapping
from typing import Any

SCHEMA_VERSION = 1
STATUSES = ("ok", "failed", "running")
MEMORY_CATEGORIES = ("parameters", "gradients", "optimizer_state", "activations")
"""Categories of `memory_by_category`, as `prism_megatron.megatron.run.memory` names them."""

_REL_TOLERANCE = 1e-6


class SchemaError(ValueError):
    """report.json does not follow the schema; `errors` lists every problem with its key path."""

    def __init__(self, errors: list[str], source: str = "report.json") -> None:
        self.errors = list(errors)
        shown = "; ".join(errors[:8]) + (f"; ... ({len(errors) - 8} more)" if len(errors) > 8 else "")
        super().__init__(f"{source} does not follow report schema {SCHEMA_VERSION}: {shown}")


# ---- type specs: a check is a function (value, path, errors) -> None ------------------------------

Check = Callable[[Any, str, list[str]], None]


def _number(*, minimum: float | None = 0, nullable: bool = False, integer: bool = False) -> Check:
    def check(value: Any, path: str, errors: list[str]) -> None:
        if value is None and nullable:
            return
        kinds = (int,) if integer else (int, float)
        if isinstance(value, bool) or not isinstance(value, kinds):
            errors.append(f"{path}: must be {'an integer' if integer else 'a number'}, got {value!r}")
        elif not math.isfinite(value):
            errors.append(f"{path}: must be finite, got {value!r}")
        elif minimum is not None and value < minimum:
            errors.append(f"{path}: must be >= {minimum}, got {value!r}")

    return check


def _string(*, choices: tuple[str, ...] | None = None, nullable: bool = False) -> Check:
    def check(value: Any, path: str, errors: list[str]) -> None:
        if value is None and nullable:
            return
        if not isinstance(value, str):
            errors.append(f"{path}: must be a string, got {value!r}")
        elif choices is not None and value not in choices:
            errors.append(f"{path}: must be one of {', '.join(choices)}, got {value!r}")

    return check


def _boolean(value: Any, path: str, errors: list[str]) -> None:
    if not isinstance(value, bool):
        errors.append(f"{path}: must be true or false, got {value!r}")


def _object(
    required: Mapping[str, Check],
    optional: Mapping[str, Check] | None = None,
    *,
    extra: bool = False,
    nullable: bool = False,
) -> Check:
    optional = optional or {}

    def check(value: Any, path: str, errors: list[str]) -> None:
        if value is None and nullable:
            return
        if not isinstance(value, dict):
            errors.append(f"{path}: must be an object, got {type(value).__name__}")
            return
        for key, sub in required.items():
            if key not in value:
                errors.append(f"{path}: missing key {key!r}")
            else:
                sub(value[key], f"{path}.{key}", errors)
        for key, sub in optional.items():
            if key in value:
                sub(value[key], f"{path}.{key}", errors)
        if not extra:
            unknown = sorted(set(value) - set(required) - set(optional))
            if unknown:
                errors.append(f"{path}: unknown key(s) {', '.join(map(repr, unknown))}")

    return check


def _array(item: Check) -> Check:
    def check(value: Any, path: str, errors: list[str]) -> None:
        if not isinstance(value, list):
            errors.append(f"{path}: must be an array, got {type(value).__name__}")
            return
        for index, entry in enumerate(value):
            item(entry, f"{path}[{index}]", errors)

    return check


def _map(value_check: Check, *, integer_keys: bool = False, nullable: bool = False) -> Check:
    def check(value: Any, path: str, errors: list[str]) -> None:
        if value is None and nullable:
            return
        if not isinstance(value, dict):
            errors.append(f"{path}: must be an object, got {type(value).__name__}")
            return
        for key, entry in value.items():
            if integer_keys and not (isinstance(key, str) and key.isdigit()):
                errors.append(f"{path}: key {key!r} must be a virtual rank written as a decimal string")
            value_check(entry, f"{path}.{key}", errors)

    return check


_SECONDS = _number()
_OPTIONAL = _number(nullable=True)
_COUNT = _number(integer=True)
_SIZE = _number(integer=True, minimum=1)

TARGET = _object(
    {
        **dict.fromkeys(("world_size", "tp", "pp", "cp", "ep", "etp", "dp"), _SIZE),
        "vpp": _number(integer=True, minimum=1, nullable=True),
        **dict.fromkeys(("micro_batch_size", "global_batch_size", "seq_length"), _SIZE),
    },
    {"order": _string()},
)
ITERATION = _object({"index": _COUNT, "time_s": _SECONDS}, {"warmup": _boolean})
RANK = _object(
    {
        "peak_memory_allocated_bytes": _number(integer=True, nullable=True),
        "peak_memory_reserved_bytes": _number(integer=True, nullable=True),
        "compute_s": _OPTIONAL,
        "exposed_comm_s": _OPTIONAL,
        "bubble_s": _OPTIONAL,
    },
    {
        "role": _string(nullable=True),
        "memory_by_category": _map(_number(integer=True)),
        "memory_method": _string(nullable=True),
    },
)
ROLE = _object(
    {
        "virtual_rank": _COUNT,
        "count": _SIZE,
        "compute_s": _SECONDS,
        "exposed_comm_s": _SECONDS,
        "bubble_s": _SECONDS,
    }
)
FAILURE = _object(
    {"message": _string()},
    {"dead_rank": _number(integer=True, nullable=True), "last_op": _string(nullable=True)},
    nullable=True,
)
VERSIONS = _object(
    {"prism_megatron": _string(), "megatron_core": _string(nullable=True), "torch": _string(nullable=True)},
    extra=True,
)
REPORT = _object(
    {
        "schema_version": _COUNT,
        "status": _string(choices=STATUSES),
        "target": TARGET,
        "real_ranks": _array(_COUNT),
        "iterations": _array(ITERATION),
        "iteration_time_s": _OPTIONAL,
        "ranks": _map(RANK, integer_keys=True),
        "simulated_iteration_time_s": _OPTIONAL,
        "tflops_per_gpu": _OPTIONAL,
        "versions": VERSIONS,
    },
    {
        "failure": FAILURE,
        "roles": _map(ROLE),
        "model_flops_per_iteration": _OPTIONAL,
        "prism": _object({}, extra=True),
        "shims_used": _map(_COUNT, nullable=True),
        "patches": _map(_COUNT, nullable=True),
        "created": _string(),
    },
)
"""The shape of report.json (see the module docstring for the checks beyond shape)."""


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
    errors: list[str] = []
    REPORT(doc, "$", errors)
    if not errors:
        _check_consistency(doc, errors)
    if errors:
        raise SchemaError(errors, source)


def _check_consistency(doc: dict, errors: list[str]) -> None:
    target, status = doc["target"], doc["status"]
    world_size = target["world_size"]
    model_size = target["tp"] * target["pp"] * target["cp"]
    if world_size % model_size or target["dp"] != world_size // model_size:
        errors.append(
            f"$.target.dp: must be world_size / (tp * pp * cp) = {world_size}/{model_size}, got {target['dp']}"
        )
    real = doc["real_ranks"]
    if not real and status != "failed":
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
    if status != "failed" and doc.get("failure"):
        errors.append(f"$.failure: only a failed run has a failure, but status is {status!r}")
    _check_iterations(doc, errors)
    _check_roles(doc, errors)


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
