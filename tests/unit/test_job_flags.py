"""One reading of Megatron's flags: every spelling Megatron-LM accepts for a setting gives the same
target job in every command that reads a job (`prism_megatron.megatron.job.target`)."""

from __future__ import annotations

import json
import re

import pytest

from prism_megatron import cli
from prism_megatron.emulation.plan import plan_run
from prism_megatron.megatron.entry import arguments as entry_args
from prism_megatron.megatron.job import target
from prism_megatron.megatron.job.job import job_from_flags

WORLD = 64
MODEL = ("--hidden-size", "64", "--num-attention-heads", "4", "--seq-length", "32", "--vocab-size", "1000",
         "--micro-batch-size", "1", "--global-batch-size", "32")  # fmt: skip
RUN = ("--train-iters", "2")  # not a job flag: topology does not take it (emulate wants >= 2)

# Per setting, the spellings of one job; every reader must give each the expected layout and schedule:
# (world, tp, pp, cp, ep, etp, vpp, order, dp) and (vpp, layers per stage, microbatches).
SPELLINGS = {
    "interleaved": (
        [("--num-layers", "16", "--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage", "2"),
         ("--num-layers", "16", "--pipeline-model-parallel-size", "4", "--num-virtual-stages-per-pipeline-rank", "2"),
         ("--num-layers", "16", "--pipeline-model-parallel-size", "4", "--virtual-pipeline-model-parallel-size", "2"),
         ("--num-virtual-stages-per-pipeline-rank=2", "--pipeline-model-parallel-size=4", "--num-layers=16")],
        ((WORLD, 1, 4, 1, 1, 1, 2, "tp-cp-ep-dp-pp", 16), (2, (4, 4, 4, 4), 2)),
    ),
    "uneven-interleaved": (
        [("--num-layers", "16", "--pipeline-model-parallel-size", "4", "--decoder-first-pipeline-num-layers", "2",
          "--decoder-last-pipeline-num-layers", "2", "--num-virtual-stages-per-pipeline-rank", "2"),
         ("--decoder-last-pipeline-num-layers=2", "--virtual-pipeline-model-parallel-size=2", "--num-layers=16",
          "--decoder-first-pipeline-num-layers=2", "--pipeline-model-parallel-size=4")],
        ((WORLD, 1, 4, 1, 1, 1, 2, "tp-cp-ep-dp-pp", 16), (2, (2, 6, 6, 2), 2)),
    ),
    "ends-one-layer-short": (
        [("--num-layers", "14", "--pipeline-model-parallel-size", "4", "--decoder-first-pipeline-num-layers", "3",
          "--decoder-last-pipeline-num-layers", "3"),
         ("--num-layers", "14", "--pipeline-model-parallel-size", "4", "--account-for-embedding-in-pipeline-split",
          "--account-for-loss-in-pipeline-split")],
        ((WORLD, 1, 4, 1, 1, 1, None, "tp-cp-ep-dp-pp", 16), (None, (3, 4, 4, 3), 2)),
    ),
    "sizes-and-order": (
        [("--num-layers", "8", "--tensor-model-parallel-size", "2", "--pipeline-model-parallel-size", "2",
          "--use-tp-pp-dp-mapping"),
         ("--use-tp-pp-dp-mapping", "--tensor-model-parallel-size=2", "--pipeline-model-parallel-size=2",
          "--num-layers=8", "--expert-tensor-parallel-size", "2")],
        ((WORLD, 2, 2, 1, 1, 2, None, "tp-cp-ep-pp-dp", 16), (None, (4, 4), 2)),
    ),
}  # fmt: skip
CASES = [(name, flags, expected) for name, (spellings, expected) in SPELLINGS.items() for flags in spellings]


def layout_key(sizes: dict, dp: int, world: int) -> tuple:
    return (
        world,
        sizes["tp"],
        sizes["pp"],
        sizes["cp"],
        sizes["ep"],
        sizes["etp"],
        sizes["vpp"],
        sizes["order"],
        dp,
    )


def from_job(job: target.TargetJob) -> tuple:
    layout = job.layout()
    sizes = {**{k: getattr(layout, k) for k in ("tp", "pp", "cp", "ep", "etp", "vpp")}, "order": layout.order}
    schedule = job.schedule
    return layout_key(sizes, layout.dp, layout.world_size), (
        schedule.vpp,
        schedule.layers_per_stage,
        schedule.num_microbatches,
    )


def read_by_topology(flags, capsys) -> tuple:
    assert cli.main(["topology", "--prism-world-size", str(WORLD), *flags, *MODEL, "--json"]) == 0
    doc = json.loads(capsys.readouterr().out)
    schedule = doc["schedule"]
    return layout_key(
        {**doc["sizes"], "order": doc["order"]}, doc["data_parallel_size"], doc["world_size"]
    ), (
        schedule["vpp"],
        tuple(schedule["layers_per_stage"]),
        schedule["num_microbatches"],
    )


def read_by_plan(flags, capsys) -> tuple:
    return from_job(job_from_flags([*flags, *MODEL, *RUN, "--prism-world-size", str(WORLD)]).target)


def read_by_emulate(flags, tmp_path) -> tuple:
    emulation = ("--prism-emulate", "--prism-world-size", str(WORLD), "--prism-out", str(tmp_path / "run"))
    return from_job(plan_run([*flags, *MODEL, *RUN, *emulation]).job)


def read_by_entry(flags) -> tuple:
    args = entry_args.parse([*flags, *MODEL, *RUN])
    entry_args.derive_world(args, WORLD)
    return from_job(target.target_job(args, world_size=WORLD))


@pytest.mark.parametrize(
    ("name", "flags", "expected"), CASES, ids=[f"{c[0]}-{i}" for i, c in enumerate(CASES)]
)
def test_each_spelling_gives_the_same_layout_and_schedule_in_every_command(
    name, flags, expected, capsys, tmp_path
):
    assert read_by_topology(flags, capsys) == expected
    assert read_by_plan(flags, capsys) == expected
    assert read_by_emulate(flags, tmp_path) == expected
    assert read_by_entry(flags) == expected


REFUSED = [
    (("--num-layers", "16", "--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage", "3"),
     "--num-layers-per-virtual-pipeline-stage 3 must divide the 4 layers of each pipeline stage"),
    (("--num-layers", "14", "--pipeline-model-parallel-size", "4"),
     "--num-layers 14 must be divisible by --pipeline-model-parallel-size 4"),
    (("--num-layers", "14", "--pipeline-model-parallel-size", "4", "--account-for-loss-in-pipeline-split"),
     "--num-layers 14 (+1 for the loss) must be divisible by --pipeline-model-parallel-size 4"),
    (("--num-layers", "16", "--pipeline-model-parallel-size", "4", "--num-layers-per-virtual-pipeline-stage", "2",
      "--num-virtual-stages-per-pipeline-rank", "2"), "not both"),
    (("--num-layers", "16", "--pipeline-model-parallel-size", "4", "--pipeline-model-parallel-layout", "Et|tt|tt|tL"),
     "--pipeline-model-parallel-layout is not modelled by prism"),
    (("--num-layers", "16", "--pipeline-model-parallel-size", "2", "--num-virtual-stages-per-pipeline-rank", "2",
      "--no-overlap-p2p-communication"), "needs --pipeline-model-parallel-size > 2"),
]  # fmt: skip


@pytest.mark.parametrize(("flags", "message"), REFUSED, ids=[m[:40] for _, m in REFUSED])
def test_every_command_refuses_what_megatron_refuses_with_the_same_sentence(flags, message, capsys, tmp_path):
    assert cli.main(["topology", "--world-size", str(WORLD), *flags, *MODEL]) == 2
    assert message in capsys.readouterr().err
    for read in (lambda: read_by_plan(flags, capsys), lambda: read_by_emulate(flags, tmp_path),
                 lambda: read_by_entry(flags)):  # fmt: skip
        with pytest.raises(ValueError, match=re.escape(message)):
            read()


PLAN_JOB = ("--num-layers", "4", "--hidden-size", "1024", "--num-attention-heads", "16", "--seq-length", "128",
            "--vocab-size", "1000", "--micro-batch-size", "1", "--prism-world-size", "8")  # fmt: skip


@pytest.mark.parametrize(
    ("extra", "message"),
    [
        (("--tensor-model-parallel-sise", "4"),
         "--tensor-model-parallel-sise: not a Megatron-LM flag the plan knows (did you mean --tensor-model-parallel-size?)"),
        (("--no-such-flag", "3"), "--no-such-flag: not a Megatron-LM flag the plan knows"),
        (("--group-query-attention", "--num-query-groups", "5"),
         "--num-attention-heads 16 must be divisible by --num-query-groups 5"),
        (("--tensor-model-parallel-size", "8", "--num-attention-heads", "12", "--kv-channels", "64"),
         "megatron-core refuses these flags: num_attention_heads (12) must be a multiple of "
         "tensor_model_parallel_size (8)"),
    ],
    ids=["misspelt-flag", "unknown-flag", "heads-not-divisible-by-query-groups", "megatron-core-check"],
)  # fmt: skip
def test_plan_refuses_unknown_flags_and_inconsistent_models_in_one_line_before_planning(
    extra, message, capsys
):
    assert cli.main(["plan", "--ranks", "0", *PLAN_JOB, *extra]) == 2
    out, err = capsys.readouterr()
    assert out == "" and "planning" not in err
    assert err.count("\n") == 1 and message in err


PATTERN = "([1]*2+[0]*4+[1]*4+[0]*4+[1]*2)"  # stage 1 holds layers 2-7, stage 2 layers 8-13
ROLE_CLASS_SPELLINGS = [
    (("--num-layers", "16", "--pipeline-model-parallel-size", "4", "--mtp-num-layers", "1",
      "--decoder-first-pipeline-num-layers", "2", "--decoder-last-pipeline-num-layers", "2"), "dense"),
    (("--num-layers=16", "--pipeline-model-parallel-size=4", "--mtp-num-layers=1",
      "--decoder-first-pipeline-num-layers=2", "--decoder-last-pipeline-num-layers=2"), "dense"),
    (("--num-layers", "16", "--pipeline-model-parallel-size", "4", "--decoder-first-pipeline-num-layers", "2",
      "--decoder-last-pipeline-num-layers", "2", "--num-experts", "4", "--moe-layer-freq", PATTERN), "moe"),
    (("--num-layers=16", "--pipeline-model-parallel-size=4", "--decoder-first-pipeline-num-layers=2",
      "--decoder-last-pipeline-num-layers=2", "--num-experts=4", f"--moe-layer-freq={PATTERN}"), "moe"),
]  # fmt: skip


@pytest.mark.parametrize(
    "flags, kind", ROLE_CLASS_SPELLINGS, ids=["dense", "dense-equals", "moe", "moe-equals"]
)
def test_the_captures_role_classes_read_the_job_as_every_command_does(flags, kind, tmp_path):
    """The slice's classes come from the one reader's job, whichever spelling: the uneven first and the
    MTP last stage stay apart; the middle stages (6 layers each) share a capture when dense, and not
    when --moe-layer-freq puts their MoE layers in other places."""
    emulation = ("--prism-emulate", "--prism-world-size", str(WORLD), "--prism-out", str(tmp_path / "run"))
    plan = plan_run([*flags, *MODEL, *RUN, *emulation])
    members = sorted(tuple(sorted(c.members)) for c in plan.role_classes)
    middle = [("pp1", "pp2")] if kind == "dense" else [("pp1",), ("pp2",)]
    assert members == sorted([("pp0-tp0src",), *middle, ("pp3-tp0src",)]), members


def test_the_plan_takes_megatron_lms_alignment_switches_as_flags_without_memory_effect():
    from prism_megatron.megatron.job.flags import parse_flags

    parsed = parse_flags(["--num-layers", "16", *MODEL, "--no-align-param-gather", "--no-align-grad-reduce"])
    assert parsed.ignored == ("--no-align-param-gather", "--no-align-grad-reduce")
    with pytest.raises(ValueError, match="--align-param-gather"):
        parse_flags(["--num-layers", "16", *MODEL, "--align-param-gather"])
