"""Reading and writing cluster descriptions: preset names, YAML files and JSON files.

A cluster file has the layout of ``ClusterSpec.to_dict()``. It may start from a preset with
``base: dgx-h100`` and override only some keys; a calibrated file written by
``prism-megatron calibrate`` is complete. Unknown keys are errors (a typo must not silently fall
back to a default), and every error names the file and the key.
"""

from __future__ import annotations

import dataclasses
import json
import os
import sys

import yaml

from prism_megatron import files
from prism_megatron.network.cluster import ClusterSpec, IntraNodeFabric, NetworkFabric, Topology
from prism_megatron.network.presets import PRESETS

SCHEMA_VERSION = 1
DEFAULT_PRESET = "dgx-h100"
"""What ``load_cluster("default")`` returns (the --prism-cluster default)."""
_SECTIONS = {"intra_node": IntraNodeFabric, "network": NetworkFabric, "topology": Topology}
_TOP_LEVEL = ("name", "description", "gpus_per_node", "base_latency_us")
_REQUIRED = ("name", "gpus_per_node", "base_latency_us", "intra_node", "network")
RENAMED_KEYS = {
    "nvlink_bandwidth_gbps": "nvlink_bandwidth_gb_per_s",
    "nic_bandwidth_gbps": "nic_bandwidth_gb_per_s",
}
"""Old key -> new key. The old names said Gb/s (bits) while holding GB/s (bytes): NDR's 400 typed
there made a network eight times too fast. Files with the old keys still load, with a warning."""


def load_cluster(source: str | os.PathLike) -> ClusterSpec:
    """Return the cluster named by a preset name (or ``default``) or a YAML/JSON file path.

    Raises:
        ValueError: the name is neither a preset nor a file, or the file is not a valid cluster
            description (the message names the file and the key, and the valid choices).
    """
    text = os.fspath(source)
    if text == "default":
        return PRESETS[DEFAULT_PRESET]
    if text in PRESETS:
        return PRESETS[text]
    if not os.path.isfile(text):
        raise ValueError(
            f"cluster {text!r} is neither a preset ({', '.join(sorted(PRESETS))}, or default = "
            f"{DEFAULT_PRESET}) nor a YAML/JSON file"
        )
    try:
        with open(text, encoding="utf-8") as f:
            raw = f.read()
        data = json.loads(raw) if text.endswith(".json") else yaml.safe_load(raw)
    except UnicodeDecodeError as exc:
        raise ValueError(
            f"{text}: not a readable cluster file (not UTF-8 text: {exc.reason} at byte {exc.start})"
        ) from exc
    except (json.JSONDecodeError, yaml.YAMLError) as exc:
        raise ValueError(f"{text}: not a readable cluster file ({exc})") from exc
    except RecursionError as exc:
        raise ValueError(f"{text}: not a readable cluster file (nested too deeply)") from exc
    return cluster_from_dict(data, source=text)


def cluster_from_dict(data: object, *, source: str = "cluster") -> ClusterSpec:
    """Build a ClusterSpec from plain data (``base:`` names a preset whose values are the defaults)."""
    if not isinstance(data, dict):
        raise ValueError(f"{source}: a cluster description must be a mapping, got {type(data).__name__}")
    data = dict(data)
    version = data.pop("schema_version", SCHEMA_VERSION)
    if version != SCHEMA_VERSION:
        raise ValueError(f"{source}: schema_version {version!r} is not supported (expected {SCHEMA_VERSION})")
    base_name = data.pop("base", None)
    merged = _base_dict(base_name, source)
    valid = (*_TOP_LEVEL, *_SECTIONS)
    for key, value in data.items():
        if key not in valid:
            raise ValueError(
                f"{source}: unknown key {key!r}; valid keys are base, schema_version, {', '.join(valid)}"
            )
        if key in _SECTIONS:
            merged[key] = {**merged.get(key, {}), **_section_dict(value, key, source)}
        else:
            merged[key] = value
    if base_name is not None and "name" not in data:
        merged["name"] = f"{base_name}-custom"
    return _build(merged, source)


def _base_dict(base_name: object, source: str) -> dict:
    if base_name is None:
        return {}
    if base_name not in PRESETS:
        raise ValueError(
            f"{source}: base {base_name!r} is not a preset; choose one of {', '.join(sorted(PRESETS))}"
        )
    spec_dict = PRESETS[base_name].to_dict()
    spec_dict.pop("schema_version")
    return spec_dict


def _section_dict(value: object, key: str, source: str) -> dict:
    if not isinstance(value, dict):
        raise ValueError(f"{source}: {key} must be a mapping of its fields, got {type(value).__name__}")
    value = _renamed(value, key, source)
    fields = {f.name for f in dataclasses.fields(_SECTIONS[key])}
    for field in value:
        if field not in fields:
            raise ValueError(
                f"{source}: unknown key {key}.{field}; valid keys are {', '.join(sorted(fields))}"
            )
    return value


def _renamed(section: dict, key: str, source: str) -> dict:
    """The section with old key names replaced by the new ones, each with a one-line warning."""
    out = {}
    for field, value in section.items():
        new = RENAMED_KEYS.get(field)
        if new is None:
            out[field] = value
            continue
        if new in section:
            raise ValueError(f"{source}: {key}.{field} and {key}.{new} are the same field; keep only {new}")
        print(
            f"warning: {source}: {key}.{field} is now {key}.{new} (the value is GB/s, bytes); "
            "read as such, rename it",
            file=sys.stderr,
        )
        out[new] = value
    return out


def _build(merged: dict, source: str) -> ClusterSpec:
    missing = [key for key in _REQUIRED if key not in merged]
    if missing:
        raise ValueError(f"{source}: missing key(s) {', '.join(missing)} (or name a preset with base:)")
    try:
        sections = {key: cls(**merged[key]) for key, cls in _SECTIONS.items() if key in merged}
        return ClusterSpec(**{key: merged[key] for key in _TOP_LEVEL if key in merged}, **sections)
    except TypeError as exc:
        raise ValueError(f"{source}: {exc}") from exc
    except ValueError as exc:
        raise ValueError(f"{source}: {exc}") from exc


def save_cluster(spec: ClusterSpec, path: str | os.PathLike, *, header: str = "") -> None:
    """Write a cluster as YAML (or JSON when the path ends in .json), atomically.

    Args:
        header: comment lines put at the top of a YAML file (for example where the numbers came from).
    """
    path = os.fspath(path)
    if path.endswith(".json"):
        text = json.dumps(spec.to_dict(), indent=2) + "\n"
    else:
        comments = "".join(f"# {line}\n" for line in header.splitlines())
        text = comments + yaml.safe_dump(spec.to_dict(), sort_keys=False)
    directory = os.path.dirname(os.path.abspath(path))
    if not os.path.isdir(directory):
        raise ValueError(f"cannot write cluster file {path}: directory {directory} does not exist")
    files.write_atomically(path, text, make_dirs=False)
