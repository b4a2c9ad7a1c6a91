"""Roles and the default slice: which virtual ranks behave alike, and one real rank per role."""

import pytest

from prism_megatron.topology import Layout

LAYOUTS = [
    dict(world_size=16, tp=2, pp=4),
    dict(world_size=8, tp=4),
    dict(world_size=8, tp=1, pp=2),
    dict(world_size=64, tp=2, pp=4, cp=2, ep=4, etp=1),
    dict(world_size=64, tp=4, pp=2, ep=2, etp=2, order="tp-cp-ep-pp-dp"),
    dict(world_size=48, tp=2, pp=3, cp=2, ep=4, etp=1, order="tp-cp-ep-pp-dp"),
    dict(world_size=32, tp=4, pp=4, vpp=2, ep=2, etp=1),
]


def _brute_force_key(layout, virtual_rank):
    """The role rule from coordinates, independently of roles.py's periodic shortcut."""
    coords = layout.coords(virtual_rank)
    reads_data = coords.pp in (0, layout.pp - 1) and coords.tp == 0
    return coords.pp, reads_data, coords.ep if layout.ep > 1 else None


@pytest.mark.parametrize("config", LAYOUTS, ids=str)
def test_roles_partition_the_world_by_stage_data_source_and_expert_shard(config):
    layout = Layout(**config)
    roles = layout.roles()
    assert len({role.name for role in roles}) == len(roles)
    seen = set()
    for role in roles:
        members = list(layout.role_members(role))
        assert members == sorted(members)
        assert len(members) == layout.role_count(role)
        assert layout.representative(role) == members[0]
        assert {_brute_force_key(layout, rank) for rank in members} == {(role.pp, role.data_source, role.ep)}
        assert all(layout.role_of(rank) == role for rank in members)
        seen.update(members)
    assert seen == set(range(layout.world_size))
    keys = {_brute_force_key(layout, rank) for rank in range(layout.world_size)}
    assert len(keys) == len(roles)


@pytest.mark.parametrize("config", LAYOUTS, ids=str)
def test_default_slice_has_one_rank_of_every_role(config):
    layout = Layout(**config)
    chosen = layout.default_slice()
    assert chosen == sorted(chosen)
    assert sorted(layout.role_of(rank).name for rank in chosen) == sorted(
        role.name for role in layout.roles()
    )


def test_dense_8192_job_slice_is_one_pipeline_plus_the_data_readers_peers():
    layout = Layout(world_size=8192, tp=8, pp=16)
    names = [role.name for role in layout.roles()]
    assert names == ["pp0-tp0src", "pp0", *(f"pp{stage}" for stage in range(1, 15)), "pp15-tp0src", "pp15"]
    assert layout.default_slice() == [0, 1, *range(512, 7680, 512), 7680, 7681]
    first = layout.roles()[0]
    assert first.first_stage and first.data_source and not first.last_stage
    assert layout.role_count(first) == 64  # one data reader per TP group of stage 0
    assert layout.role_count(layout.roles()[1]) == 64 * 7


def test_roles_carry_the_interleaved_model_chunks_of_their_stage():
    layout = Layout(world_size=64, tp=2, pp=4, vpp=3)
    stage_two = next(role for role in layout.roles() if role.pp == 2)
    assert stage_two.model_chunks == (2, 6, 10)
    assert Layout(world_size=64, tp=2, pp=4).role_of(40).model_chunks == (2,)


def test_single_stage_job_reads_data_on_tp_rank_0_only():
    layout = Layout(world_size=8, tp=4)
    assert [role.name for role in layout.roles()] == ["pp0-tp0src", "pp0"]
    assert layout.roles()[0].first_stage and layout.roles()[0].last_stage
    assert list(layout.role_members(layout.roles()[0])) == [0, 4]


def test_expert_shards_make_roles_only_when_they_exist_on_the_data_reader():
    # ETP=1 with TP=2: TP rank 0 is an even rank, so on the first stage it only ever holds the
    # even expert shards; the odd shards exist only among the non-reading TP ranks.
    layout = Layout(world_size=64, tp=2, pp=4, cp=2, ep=4, etp=1)
    first_stage = [role.name for role in layout.roles() if role.pp == 0]
    assert first_stage == ["pp0-tp0src-ep0", "pp0-tp0src-ep2", "pp0-ep1", "pp0-ep3"]
    middle = [role.name for role in layout.roles() if role.pp == 1]
    assert middle == ["pp1-ep0", "pp1-ep1", "pp1-ep2", "pp1-ep3"]


def test_a_role_of_another_job_is_refused():
    small = Layout(world_size=16, tp=2, pp=4)
    big = Layout(world_size=64, tp=2, pp=8)
    with pytest.raises(ValueError, match="does not exist in this job"):
        small.role_members(big.roles()[-1])
