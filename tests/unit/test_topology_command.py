"""`prism-megatron topology` (the demo, which runs the emulation, is tested with it)."""

import json
import subprocess
import sys

import pytest

from prism_megatron.cli import main
from prism_megatron.megatron.job import target
from prism_megatron.topology import GROUP_KINDS, Layout

BASE = [
    "topology",
    "--world-size",
    "8192",
    "--tensor-model-parallel-size",
    "8",
    "--pipeline-model-parallel-size",
]


def _run(capsys, argv):
    status = main(argv)
    captured = capsys.readouterr()
    return status, captured.out, captured.err


def test_json_lists_every_group_of_the_selected_ranks_in_full(capsys):
    status, out, _ = _run(capsys, [*BASE, "16", "--ranks", "0,7168", "--json"])
    assert status == 0
    result = json.loads(out)
    layout = Layout(world_size=8192, tp=8, pp=16)
    assert result["world_size"] == 8192 and result["data_parallel_size"] == 64
    assert result["slice"] == layout.default_slice()
    assert [role["name"] for role in result["roles"]] == [role.name for role in layout.roles()]
    assert set(result["ranks"]) == {"0", "7168"}
    rank = result["ranks"]["7168"]
    assert rank["coords"] == {"tp": 0, "cp": 0, "dp": 0, "pp": 14, "etp": 0, "ep": 0, "edp": 0}
    assert set(rank["groups"]) == set(GROUP_KINDS)
    assert rank["groups"]["dp"] == list(range(7168, 7680, 8))
    assert rank["groups"]["embd"] == []


def test_default_selection_is_the_slice_and_text_shows_groups_compactly(capsys):
    status, out, _ = _run(capsys, [*BASE, "8"])
    assert status == 0
    assert "slice (10 real ranks): 0,1,1024-7168:1024,7169" in out
    assert "virtual rank 7169: role pp7;" in out
    assert "  pp             8  1-7169:1024" in out


def test_megatron_lm_flags_set_experts_order_and_interleaving(capsys):
    argv = [*BASE, "8", "--context-parallel-size", "2", "--expert-model-parallel-size", "8",
            "--expert-tensor-parallel-size", "2", "--use-tp-pp-dp-mapping", "--num-layers", "32",
            "--num-layers-per-virtual-pipeline-stage", "2", "--ranks", "pp=3;tp=0;dp=0;cp=0", "--json"]  # fmt: skip
    status, out, _ = _run(capsys, argv)
    assert status == 0
    result = json.loads(out)
    assert result["sizes"] == {"tp": 8, "pp": 8, "cp": 2, "ep": 8, "etp": 2, "vpp": 2}
    assert result["order"] == "tp-cp-ep-pp-dp"
    assert list(result["ranks"]) == [str(3 * 16)]


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (["7"], "--world-size 8192 is not divisible by --tensor-model-parallel-size"),
        (["8", "--num-layers-per-virtual-pipeline-stage", "2"], "needs --num-layers"),
        (["1", "--virtual-pipeline-model-parallel-size", "2"], "needs --pipeline-model-parallel-size > 1"),
        (["8", "--ranks", "9000"], "rank 9000 is outside the world"),
        (["8", "--expert-model-parallel-size", "x"], "--expert-model-parallel-size: invalid int value"),
    ],
)
def test_bad_flags_exit_2_with_one_line_naming_the_flag(capsys, extra, message):
    try:
        status, out, err = _run(capsys, [*BASE, *extra])
    except SystemExit as exc:  # argparse's own errors
        status, err = exc.code, capsys.readouterr().err
        out = ""
    assert status == 2
    assert out == ""
    assert err.count("\n") == 1 and message in err


def test_topology_command_imports_neither_torch_nor_megatron():
    code = (
        "import sys\n"
        "from prism_megatron.cli import main\n"
        "assert main(['topology', '--world-size', '131072', '--tensor-model-parallel-size', '8',\n"
        "             '--pipeline-model-parallel-size', '16', '--json']) == 0\n"
        "loaded = [m for m in sys.modules if m.split('.')[0] in ('torch', 'megatron')]\n"
        "assert not loaded, loaded\n"
    )
    done = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["slice"][-1] == 131072 - 8192 + 1


def test_listing_every_rank_builds_each_group_once_and_prints_what_rank_by_rank_would(capsys, monkeypatch):
    from prism_megatron.commands import topology

    argv = ["topology", "--world-size", "512", "--tensor-model-parallel-size", "4",
            "--pipeline-model-parallel-size", "4", "--ranks", "all"]  # fmt: skip
    layout = Layout(world_size=512, tp=4, pp=4)
    rank_by_rank = "\n".join(topology.render_lines(layout, list(range(512)), topology.GroupLookup(layout, 1)))
    no_model = target.Schedule(vpp=None, layers_per_stage=None, overlap_p2p_comm=False, num_microbatches=None)
    described = topology.describe(layout, list(range(512)), no_model)
    calls = []
    monkeypatch.setattr(Layout, "group", lambda *a: calls.append(a) or ())
    status, out, _ = _run(capsys, argv)
    assert status == 0 and out == rank_by_rank + "\n"
    assert calls == [], "with every rank selected, no rank's groups are rebuilt (that grew with W squared)"
    status, out, _ = _run(capsys, [*argv, "--json"])
    assert status == 0 and json.loads(out) == described


def test_a_json_listing_too_large_to_print_is_refused_before_anything_is_printed(capsys):
    status, out, err = _run(capsys, [*BASE, "16", "--world-size", "131072", "--ranks", "all", "--json"])
    assert status == 2 and out == ""
    assert "--ranks all --json would list" in err and "drop --json" in err


def test_a_long_listing_shows_its_progress_on_a_terminal_and_clears_it(capsys, monkeypatch):
    import io

    class Terminal(io.StringIO):
        def isatty(self):
            return True

    terminal = Terminal()
    monkeypatch.setattr(sys, "stderr", terminal)
    assert main([*BASE, "4", "--world-size", "8192", "--ranks", "all"]) == 0
    shown = terminal.getvalue()
    assert "\rtopology: listed 4096 of 8192 ranks" in shown and "listed 8192 of 8192 ranks" in shown
    assert shown.endswith("\r"), "the line is cleared at the end"
    assert capsys.readouterr().out.count("\nvirtual rank ") == 8192
