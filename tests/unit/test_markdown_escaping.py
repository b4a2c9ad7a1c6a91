"""Text from inputs lands in report.md and compare.md as the text it is (a role name from a graph
file may hold anything): it never splits a table row, opens a link or turns bold."""

from __future__ import annotations

from prism_megatron.compare.judge import Judged
from prism_megatron.compare.render import to_markdown
from prism_megatron.report import Failure, RunReport, TargetJob
from prism_megatron.report.markdown import code, escape, render_markdown
from prism_megatron.report.model import RoleReport
from prism_megatron.topology import Layout

NASTY = "pp0|x **bold** [link](http://e) <b>\n| injected | row |"


def _cells(line: str) -> int:
    """Table cells of a row, as GitHub's Markdown splits it: at pipes not escaped by a backslash."""
    unescaped = line.replace("\\\\", "").replace("\\|", "")
    return unescaped.count("|") - 1


def test_escape_and_code_keep_text_literal_and_on_one_line():
    assert escape(NASTY) == "pp0\\|x \\*\\*bold\\*\\* \\[link\\](http://e) \\<b\\> \\| injected \\| row \\|"
    assert code("a`b|c") == "`` a`b\\|c ``" and code("plain") == "`plain`"


def test_a_role_name_from_a_graph_stays_in_its_cell_of_report_md():
    report = RunReport(
        target=TargetJob.from_layout(
            Layout(world_size=16, tp=2, pp=2), micro_batch_size=1, global_batch_size=16, seq_length=32
        ),
        real_ranks=(0,),
        status="failed",
        failure=Failure(message="boom\n| fake | row |"),
        roles=(
            RoleReport(role=NASTY, virtual_rank=0, count=8, compute_s=1.0, exposed_comm_s=0.0, bubble_s=0.0),
        ),
        prism={"cluster": {"cluster": "a|b`c"}},
    )
    text = render_markdown(report, {}, {})
    header = next(line for line in text.splitlines() if line.startswith("| role |"))
    row = next(line for line in text.splitlines() if line.startswith("| pp0"))
    assert _cells(row) == _cells(header) == 6
    assert "| injected |" not in text and "| fake | row |" not in text and "**bold**" not in text
    setting = next(line for line in text.splitlines() if line.startswith("| cluster.cluster"))
    assert _cells(setting) == 2


def test_a_role_name_stays_in_its_cell_of_compare_md():
    judged = Judged(key="role.x.compute", label=f"role {NASTY} compute", kind="time", a=1.0, b=2.0,
                    difference=1.0, change_pct=100.0, scale="itself", p_value=None, test="one value per run",
                    verdict="regression", megatron_name=None, num_samples=(1, 1))  # fmt: skip
    doc = {"run_a": "runs/a`b", "run_b": "runs/b", "verdict": "regression", "max_regression_pct": 5.0,
           "max_memory_regression_pct": 1.0, "test": "Mann-Whitney U", "alpha": 0.05, "same_graph": True,
           "versions": {"a": {"torch": "2|x"}, "b": {"torch": "2"}}, "gated": "headline",
           "breakdown_flagged": [{"metric": judged.label, "verdict": "regression"}], "captures": None}  # fmt: skip
    text = to_markdown(doc, [judged])
    row = next(line for line in text.splitlines() if line.startswith("| role pp0"))
    assert (
        _cells(row) == 9
        and "| injected |" not in text
        and "**bold**" not in text.replace("**regression**", "")
    )
