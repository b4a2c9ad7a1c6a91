"""Layout: coordinates and every Megatron group of a virtual rank, computed per rank.

The exhaustive comparison with megatron-core itself lives in tests/megatron/test_topology_oracle.py;
these tests pin hand-checked facts and the properties any correct group table has.
"""

import numpy as np
import pytest

from prism_megatron.topology import GROUP_KINDS, Coords, Layout

# Small jobs that exercise every dimension, both orders, and expert sizes unlike the dense ones.
PROPERTY_LAYOUTS = [
    dict(world_size=16, tp=2, pp=4),
    dict(world_size=32, tp=2, pp=2, cp=2, ep=2),
    dict(world_size=48, tp=2, pp=3, cp=2, ep=4, etp=1),
    dict(world_size=32, tp=2, pp=2, cp=2, ep=2, etp=2, order="tp-cp-ep-pp-dp"),
    dict(world_size=24, tp=4, pp=2, ep=2, etp=2, order="tp-cp-ep-pp-dp"),
    dict(world_size=8, tp=1, pp=1, ep=8, etp=1),
    dict(world_size=16, tp=2, pp=4, vpp=2, untie_embeddings=True),
]


def test_megatron_docstring_example_16_ranks_tp2_pp4():
    layout = Layout(world_size=16, tp=2, pp=4)
    assert layout.dp == 2
    assert list(layout.groups("dp")) == [(0, 2), (1, 3), (4, 6), (5, 7), (8, 10), (9, 11), (12, 14), (13, 15)]
    assert list(layout.groups("tp")) == [(2 * i, 2 * i + 1) for i in range(8)]
    assert list(layout.groups("pp")) == [(0, 4, 8, 12), (1, 5, 9, 13), (2, 6, 10, 14), (3, 7, 11, 15)]


def test_rank_5_of_8192_tp8_pp8_has_megatrons_pipeline_and_embedding_groups():
    layout = Layout(world_size=8192, tp=8, pp=8)
    assert layout.dp == 128
    assert layout.group("pp", 5) == tuple(5 + 1024 * stage for stage in range(8))
    assert layout.group("embd", 5) == (5, 7173)
    assert layout.group("pos_embd", 5) == (5,)
    assert layout.coords(5) == Coords(tp=5, cp=0, dp=0, pp=0, etp=5, ep=0, edp=0)


def test_last_rank_of_8192_tp8_pp8_cp2_ep8_has_megatrons_group_ranks():
    layout = Layout(world_size=8192, tp=8, pp=8, cp=2, ep=8)
    last = 8191
    assert (layout.dp, layout.edp) == (64, 16)
    expected = {"tp": (7, 8), "pp": (7, 8), "dp": (63, 64), "dp_cp": (127, 128), "cp": (1, 2),
                "ep": (7, 8), "expt_dp": (15, 16)}  # fmt: skip
    for kind, (rank_in_group, size) in expected.items():
        assert layout.rank_in_group(kind, last) == rank_in_group, kind
        assert len(layout.group(kind, last)) == layout.group_size(kind) == size, kind


def test_pp_dp_order_puts_stages_next_to_each_other():
    layout = Layout(world_size=32, tp=2, pp=4, order="tp-cp-ep-pp-dp")
    assert layout.group("pp", 0) == (0, 2, 4, 6)
    assert layout.group("dp", 0) == (0, 8, 16, 24)
    assert layout.coords(9) == Coords(tp=1, cp=0, dp=1, pp=0, etp=1, ep=0, edp=1)


def test_expert_tp_unlike_tp_changes_only_the_expert_groups():
    dense = Layout(world_size=64, tp=4, pp=2, ep=2)
    expert = Layout(world_size=64, tp=4, pp=2, ep=2, etp=1)
    assert expert.edp == 16
    assert expert.group("expt_tp", 5) == (5,)
    assert expert.group("ep", 5) == (4, 5)
    assert dense.group("ep", 5) == (1, 5)
    for kind in ("tp", "pp", "dp", "mp", "tp_dp_cp"):
        assert dense.group(kind, 5) == expert.group(kind, 5), kind


def test_untied_embeddings_leave_the_last_stage_out_of_the_embedding_group():
    tied = Layout(world_size=16, tp=2, pp=4)
    untied = Layout(world_size=16, tp=2, pp=4, untie_embeddings=True)
    assert tied.group("embd", 1) == tied.group("embd", 13) == (1, 13)
    assert untied.group("embd", 1) == (1,)
    assert untied.group("embd", 13) == ()
    assert not untied.has_group("embd", 13)
    with pytest.raises(ValueError, match="no embd group"):
        untied.group_index("embd", 13)


def test_mtp_layers_keep_an_untied_last_stage_in_the_embedding_group():
    # Megatron-LM's pretrain_gpt adds the stage holding MTP layers (the last) to the embedding ranks.
    untied_mtp = Layout(world_size=16, tp=2, pp=4, untie_embeddings=True, mtp=True)
    assert untied_mtp.group("embd", 1) == untied_mtp.group("embd", 13) == (1, 13)
    assert untied_mtp.has_group("embd", 13) and not untied_mtp.has_group("embd", 5)
    assert untied_mtp.group("pos_embd", 13) == ()
    assert Layout(world_size=4, pp=1, untie_embeddings=True, mtp=True).group("embd", 2) == (2,)
    assert untied_mtp.kwargs()["mtp"] is True and "mtp" not in Layout(world_size=16, pp=4).kwargs()


def test_single_stage_embedding_group_is_the_rank_alone():
    layout = Layout(world_size=4, tp=2)
    assert layout.group("embd", 3) == layout.group("pos_embd", 3) == (3,)


def test_middle_stage_is_in_no_embedding_group():
    layout = Layout(world_size=16, tp=2, pp=4)
    assert layout.group("embd", 4) == ()
    assert layout.group("pos_embd", 4) == ()


@pytest.mark.parametrize("config", PROPERTY_LAYOUTS, ids=str)
@pytest.mark.parametrize("kind", [kind for kind in GROUP_KINDS if kind not in ("embd", "pos_embd")])
def test_each_rank_is_in_exactly_one_group_of_each_kind(config, kind):
    layout = Layout(**config)
    groups = list(layout.groups(kind))
    assert len(groups) == layout.num_groups(kind)
    assert all(len(members) == layout.group_size(kind) for members in groups)
    assert sorted(rank for members in groups for rank in members) == list(range(layout.world_size))


@pytest.mark.parametrize("config", PROPERTY_LAYOUTS, ids=str)
@pytest.mark.parametrize("kind", GROUP_KINDS)
def test_group_agrees_with_the_enumeration_and_across_its_members(config, kind):
    layout = Layout(**config)
    groups = list(layout.groups(kind))
    for virtual_rank in range(layout.world_size):
        members = layout.group(kind, virtual_rank)
        if not members:
            assert not layout.has_group(kind, virtual_rank)
            continue
        index = layout.group_index(kind, virtual_rank)
        assert groups[index] == members
        assert members[layout.rank_in_group(kind, virtual_rank)] == virtual_rank
        for member in members:
            assert layout.group(kind, member) == members
            assert layout.group_index(kind, member) == index


@pytest.mark.parametrize("config", PROPERTY_LAYOUTS, ids=str)
def test_coordinates_are_a_bijection(config):
    layout = Layout(**config)
    dense = {
        tuple(layout.coords(r).as_dict()[n] for n in ("tp", "cp", "dp", "pp"))
        for r in range(layout.world_size)
    }
    expert = {
        tuple(layout.coords(r).as_dict()[n] for n in ("etp", "ep", "edp", "pp"))
        for r in range(layout.world_size)
    }
    assert len(dense) == len(expert) == layout.world_size


def test_one_rank_of_131072_is_answered_without_enumerating_the_world():
    layout = Layout(world_size=131072, tp=8, pp=16, cp=2, ep=8)
    virtual_rank = 99_999
    groups = {kind: layout.group(kind, virtual_rank) for kind in GROUP_KINDS}
    assert all(
        virtual_rank in members for kind, members in groups.items() if kind not in ("embd", "pos_embd")
    )
    assert len(groups["tp_dp_cp"]) == 131072 // 16


@pytest.mark.parametrize(
    ("config", "message"),
    [
        (dict(world_size=100, tp=8), "--world-size 100 is not divisible by --tensor-model-parallel-size"),
        (dict(world_size=64, tp=8, pp=2, ep=3), "--expert-model-parallel-size"),
        (dict(world_size=64, tp=8, vpp=2), "needs --pipeline-model-parallel-size > 1"),
        (dict(world_size=64, tp=0), "--tensor-model-parallel-size must be a positive integer"),
        (dict(world_size=0), "--world-size must be a positive integer"),
        (dict(world_size=64, tp=8, pp=2, vpp=0), "--virtual-pipeline-model-parallel-size must be"),
        (dict(world_size=64, order="tp-dp-pp"), "valid orders: tp-cp-ep-dp-pp, tp-cp-ep-pp-dp"),
        (dict(world_size=64, tp=2, pp=2, ep=4, etp=1, order="tp-cp-ep-pp-dp"), "--use-tp-pp-dp-mapping"),
    ],
)
def test_invalid_jobs_are_refused_naming_the_flag(config, message):
    with pytest.raises(ValueError, match=message.replace("+", r"\+")):
        Layout(**config)


def test_ranks_and_kinds_outside_the_job_are_refused():
    layout = Layout(world_size=16, tp=2, pp=4)
    with pytest.raises(ValueError, match=r"outside the world \(0..15\)"):
        layout.coords(16)
    with pytest.raises(ValueError, match="valid kinds: tp, pp"):
        layout.group("tensor", 0)


def test_expert_tp_defaults_to_tp():
    assert Layout(world_size=16, tp=2, pp=4).etp == 2
    assert Layout(world_size=16, tp=2, pp=4) == Layout(world_size=16, tp=2, pp=4, etp=2)


def test_integer_ranks_of_any_type_give_python_ints():
    layout = Layout(world_size=64, tp=2, pp=4)
    rank = np.int64(5)
    answers = [*layout.group("pp", rank), layout.group_index("pp", rank), layout.rank_in_group("pp", rank)]
    answers += layout.coords(rank).as_dict().values()
    assert all(type(value) is int for value in answers)
