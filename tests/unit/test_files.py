"""The one atomic writer and the run folder's names (`prism_megatron.files`)."""

from __future__ import annotations

import ast
import os
import pathlib

import pytest

from prism_megatron import files

ROOT = pathlib.Path(__file__).resolve().parents[2]


def leftovers(directory) -> list[str]:
    return [name for name in os.listdir(directory) if name.startswith(files.TEMPORARY_PREFIX)]


def test_a_failure_half_way_through_leaves_the_old_file_and_no_temporary_file(tmp_path):
    path = tmp_path / "report.json"
    files.write_json({"old": True}, path)
    # json.dump streams: the long list is on disk before the object it cannot encode is reached.
    doc = {"a": list(range(200_000)), "z": object()}
    with pytest.raises(TypeError):
        files.write_json(doc, path)
    assert files.read_json(path, "report") == {"old": True}
    assert leftovers(tmp_path) == []


def test_an_interrupt_inside_the_block_removes_the_temporary_file(tmp_path):
    path = tmp_path / "graph.json"
    with pytest.raises(KeyboardInterrupt), files.atomic_open(path) as f:
        f.write("{" * 100_000)
        f.flush()
        assert len(leftovers(tmp_path)) == 1  # the half-written temporary file exists here ...
        raise KeyboardInterrupt
    assert leftovers(tmp_path) == [] and not path.exists()  # ... and is gone, with no destination


def test_writes_replace_whole_files_with_plain_open_permissions(tmp_path):
    old_mask = os.umask(0o027)
    try:
        path = files.write_atomically(tmp_path / "sub" / "a.md", "first")
        files.write_atomically(path, b"second")
    finally:
        os.umask(old_mask)
    assert pathlib.Path(path).read_text() == "second"
    assert os.stat(path).st_mode & 0o777 == 0o640
    assert leftovers(tmp_path / "sub") == []


def test_without_make_dirs_a_missing_directory_is_an_error_and_nothing_is_created(tmp_path):
    with pytest.raises(FileNotFoundError):
        files.write_atomically(tmp_path / "missing" / "cluster.yaml", "x", make_dirs=False)
    assert os.listdir(tmp_path) == []


def test_json_options_compact_by_default_indented_and_default_on_request(tmp_path):
    compact = files.write_json({"a": [1, 2]}, tmp_path / "c.json")
    assert pathlib.Path(compact).read_text() == '{"a":[1,2]}\n'
    readable = files.write_json({"p": tmp_path}, tmp_path / "r.json", indent=1, default=str)
    assert files.read_json(readable, "x") == {"p": str(tmp_path)}


@pytest.mark.parametrize(
    "doc",
    [
        {"traceEvents": [{"ph": "X", "ts": 1.5, "args": {"op": "mm"}}, {"ph": "M", "name": "é"}], "n": 2},
        {"a": {"b": {"c": [1, (2, 3), {"d": None}]}}, "e": [], "f": {}, "g": float("nan")},
        {1: "int key", "s": [True, False]},  # a non-string key: the dict is encoded whole, as json does
        [[{"x": 1}], [], ["y", 2.0]],
        "just a string",
        {"p": pathlib.PurePosixPath("/a/b")},
        # lists longer than one encoder call's chunk (`atomic._ITEMS_PER_CALL`), at both levels
        {"events": [{"i": i, "t": (i, None)} for i in range(2500)], "rows": [[i] for i in range(1025)]},
        [[i, [i]] for i in range(2049)],
    ],
)
def test_compact_json_is_json_dump_s_bytes(tmp_path, doc):
    import json

    path = files.write_json(doc, tmp_path / "d.json", default=str)
    expected = json.dumps(doc, separators=(",", ":"), default=str) + "\n"
    assert pathlib.Path(path).read_text() == expected


def test_read_json_names_the_file_and_what_it_should_hold(tmp_path):
    with pytest.raises(ValueError, match=r"nothing\.json: no run report here"):
        files.read_json(tmp_path / "nothing.json", "run report")
    (tmp_path / "bad.json").write_text("{")
    with pytest.raises(ValueError, match=r"bad\.json: damaged op log \(not JSON"):
        files.read_json(tmp_path / "bad.json", "op log")


def test_run_folder_names():
    run = "/runs/r1"
    assert files.results_path(run, 8) == "/runs/r1/rank-00008.json"
    assert files.op_log_path(run, 8) == "/runs/r1/ops/rank-00008.json"
    assert files.progress_path(run, 8) == "/runs/r1/progress/rank-00008.json"
    assert (
        files.capture_path(os.path.join(run, files.CAPTURE_DIR), 8) == "/runs/r1/capture/capture-00008.json"
    )
    assert (
        files.schedule_path(os.path.join(run, files.SIMULATION_DIR), 8)
        == "/runs/r1/simulation/schedule-8.json"
    )
    assert files.is_rank_file("rank-00008.json") and not files.is_rank_file("report.json")
    assert os.path.join(files.SPANS_DIR, "simulated.json") == files.SIMULATED_SPANS_FILE


def writer_calls(tree: ast.AST) -> list[str]:
    """Calls that write a file into place by renaming a temporary one (what only `files` may do)."""
    found = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute):
            owner = node.func.value
            name = f"{owner.id}.{node.func.attr}" if isinstance(owner, ast.Name) else node.func.attr
            if name in ("os.replace", "os.rename", "tempfile.mkstemp", "tempfile.NamedTemporaryFile"):
                found.append(f"{name} (line {node.lineno})")
    return found


def test_no_module_outside_files_writes_a_file_through_its_own_temporary_file():
    sources = [
        p
        for folder in ("prism_megatron", "benchmarks", "tools")
        for p in (ROOT / folder).rglob("*.py")
        if "files" not in p.relative_to(ROOT).parts[1:2]
    ]
    offenders = {
        str(p.relative_to(ROOT)): calls for p in sources if (calls := writer_calls(ast.parse(p.read_text())))
    }
    assert offenders == {}, f"write through prism_megatron.files instead: {offenders}"
