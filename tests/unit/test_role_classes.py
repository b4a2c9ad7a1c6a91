"""Role equivalence at full scale, without processes: which roles share one capture, decided from the job."""

from __future__ import annotations

import pytest

from prism_megatron.topology import JobModel, Layout, RoleClass, role_classes
from prism_megatron.topology.equivalence import DENSE, MOE, MTP, class_of, stage_layers


def names(classes):
    return [list(c.members) for c in classes]


def test_llama3_405b_shares_one_capture_among_its_fourteen_uneven_pipelines_middle_stages():
    layout = Layout(world_size=8192, tp=8, pp=16, untie_embeddings=True)
    model = JobModel(num_layers=126, first_stage_layers=7, last_stage_layers=7, num_microbatches=32)
    classes = role_classes(layout, model)
    assert names(classes) == [
        ["pp0-tp0src", "pp0"],
        [f"pp{s}" for s in range(1, 15)],
        ["pp15-tp0src", "pp15"],
    ]
    middle = classes[1]
    assert middle.representative == "pp1" and middle.num_microbatches == 32
    assert middle.warmup == {f"pp{s}": 15 - s for s in range(1, 15)}, "1F1B: PP - stage - 1 warm-up forwards"
    assert classes[0].warmup is None and classes[2].warmup is None
    assert [layout.representative(layout.roles()[0])] == [0]


def test_uneven_first_and_last_stages_stay_apart_even_where_their_layer_count_matches_the_middle():
    layout = Layout(world_size=64, tp=2, pp=8)
    model = JobModel(num_layers=16, first_stage_layers=2, last_stage_layers=2, num_microbatches=8)
    assert stage_layers(layout, model) == [((DENSE, DENSE),)] * 8
    assert names(role_classes(layout, model))[0] == ["pp0-tp0src", "pp0"]
    assert names(role_classes(layout, model))[-1] == ["pp7-tp0src", "pp7"]
    uneven = JobModel(num_layers=14, first_stage_layers=1, last_stage_layers=1, num_microbatches=8)
    assert [len(chunks[0]) for chunks in stage_layers(layout, uneven)] == [1, 2, 2, 2, 2, 2, 2, 1]
    assert len(role_classes(layout, uneven)) == 3


def test_mtp_layers_make_the_last_stage_its_own_program():
    layout = Layout(world_size=16, tp=1, pp=4)
    model = JobModel(num_layers=8, mtp_num_layers=1, num_microbatches=4)
    layers = stage_layers(layout, model)
    assert layers[3] == ((DENSE, DENSE, MTP),) and layers[2] == ((DENSE, DENSE),)
    assert names(role_classes(layout, model)) == [["pp0-tp0src"], ["pp1", "pp2"], ["pp3-tp0src"]]


def test_a_moe_layer_pattern_that_differs_between_stages_splits_the_middle_stages():
    layout = Layout(world_size=32, tp=1, pp=8, ep=4)
    # --moe-layer-freq 2 over 2 layers per stage: every stage starts with an MoE layer, all alike.
    alike = JobModel(num_layers=16, moe_layers=2, num_microbatches=8)
    assert len(role_classes(layout, alike)) == 3
    # --moe-layer-freq 3: stage s holds layers 2s, 2s+1, whose MoE pattern repeats every 3 stages.
    apart = JobModel(num_layers=16, moe_layers=3, num_microbatches=8)
    layers = stage_layers(layout, apart)
    assert layers[1] == ((DENSE, MOE),) and layers[2] == ((DENSE, DENSE),) and layers[3] == ((MOE, DENSE),)
    middle = [
        sorted({int(m.split("-")[0][2:]) for m in c.members}) for c in role_classes(layout, apart)[1:-1]
    ]
    assert middle == [[1, 4], [2, 5], [3, 6]]


def test_deepseek_v3_expert_shards_and_middle_stages_share_three_captures_for_1024_roles():
    layout = Layout(world_size=2048, tp=1, pp=16, ep=64)
    pattern = (0,) * 3 + (1,) * 58
    model = JobModel(num_layers=61, first_stage_layers=4, last_stage_layers=1, moe_layers=pattern,
                     mtp_num_layers=1, num_microbatches=120)  # fmt: skip
    assert len(layout.roles()) == 1024
    classes = role_classes(layout, model)
    assert [len(c.members) for c in classes] == [64, 14 * 64, 64]
    assert stage_layers(layout, model)[0] == ((DENSE, DENSE, DENSE, MOE),)
    assert stage_layers(layout, model)[15] == ((MOE, MTP),)
    assert classes[1].warmup["pp7-ep63"] == 8


def test_interleaved_middle_stages_share_a_class_led_by_the_fewest_warmup_microbatches():
    layout = Layout(world_size=3072, tp=8, pp=8, vpp=2)
    model = JobModel(num_layers=16, num_microbatches=32)
    classes = role_classes(layout, model)
    assert names(classes) == [
        ["pp0-tp0src", "pp0"],
        ["pp6", *(f"pp{s}" for s in range(1, 6))],
        ["pp7-tp0src", "pp7"],
    ]
    middle = classes[1]
    assert middle.representative == "pp6" and middle.chunks == 2 and middle.num_microbatches == 32
    # megatron-core's get_pp_rank_microbatches: 2 (PP - s - 1) + (V - 1) x group, group = PP
    assert middle.warmup == {f"pp{s}": 2 * (8 - s - 1) + 8 for s in range(1, 7)}
    assert stage_layers(layout, model)[0] == ((DENSE,), (DENSE,))
    # a group size of its own; the warm-up is at most M x V
    grouped = role_classes(layout, JobModel(num_layers=16, num_microbatches=10, microbatch_group_size=10))
    assert grouped[1].warmup["pp1"] == 20 and grouped[1].warmup["pp6"] == 12
    assert RoleClass.from_json(middle.to_json()) == middle


def test_an_interleaved_class_captures_its_member_with_the_most_in_flight_too():
    from prism_megatron.emulation.capture_slice import capture_ranks

    layout = Layout(world_size=64, tp=1, pp=8, vpp=2)  # DP 8: rank of stage s is 8 s
    classes = role_classes(layout, JobModel(num_layers=16, num_microbatches=32))
    # one process at a time (a modelled GPU): the three representatives, then stage 1 in a pass of its own
    assert capture_ranks(layout, classes, 1) == (0, 48, 56, 8)
    # under 1F1B the representative is already the stage with the most in flight: nothing added
    flat = role_classes(Layout(world_size=64, tp=1, pp=8), JobModel(num_layers=16, num_microbatches=32))
    assert capture_ranks(Layout(world_size=64, tp=1, pp=8), flat, 1) == (0, 8, 56)


def test_interleaved_without_overlapped_p2p_keeps_every_pipeline_rank_apart():
    layout = Layout(world_size=3072, tp=8, pp=8, vpp=2)
    classes = role_classes(layout, JobModel(num_layers=16, num_microbatches=32, overlap_p2p_comm=False))
    assert names(classes) == [
        ["pp0-tp0src", "pp0"],
        *([f"pp{s}"] for s in range(1, 7)),
        ["pp7-tp0src", "pp7"],
    ]


def test_what_is_not_modelled_keeps_every_stage_apart_and_capture_all_keeps_every_role():
    layout = Layout(world_size=8192, tp=8, pp=16)
    for model in (
        JobModel(num_layers=32, num_microbatches=32, unmodelled=("--pipeline-model-parallel-layout",)),
        JobModel(num_layers=32, num_microbatches=None),
        JobModel(num_layers=None, num_microbatches=32),
        JobModel(num_layers=30, num_microbatches=32),  # 30 layers do not split over 16 stages
    ):
        assert len(role_classes(layout, model)) == 16, model
    classes = role_classes(layout, JobModel(num_layers=32, num_microbatches=32), capture_all=True)
    assert names(classes) == [[role.name] for role in layout.roles()]


def test_a_role_class_reads_back_what_it_wrote_and_refuses_what_is_not_one():
    layout = Layout(world_size=8192, tp=8, pp=16)
    classes = role_classes(layout, JobModel(num_layers=32, num_microbatches=4))
    assert tuple(RoleClass.from_json(c.to_json()) for c in classes) == classes
    assert class_of(classes)["pp9"].representative == "pp1"
    assert classes[1].warmup["pp13"] == 2 and classes[1].warmup["pp1"] == 4
    with pytest.raises(ValueError, match="not a role class"):
        RoleClass.from_json({"members": ["pp1"]})
    with pytest.raises(ValueError, match="must start with it"):
        RoleClass("pp1", ("pp2", "pp1"))


def test_aligned_parameter_gathers_are_launched_at_the_first_microbatch_of_chunks_1_to_v_minus_2():
    from prism_megatron.topology.equivalence import param_sync_points

    # M = 8 in groups of 4 over 3 chunks: chunk 1's first microbatch is forward step 4 (chunk 2's
    # gather is launched there, less the rank); chunks 0 and 1 are gathered before the loop.
    assert param_sync_points(8, 3, 4) == [4]
    assert param_sync_points(8, 4, 4) == [4, 8]
    assert param_sync_points(16, 8, 16) == [16, 32, 48, 64, 80, 96]
    assert param_sync_points(8, 2, 4) == []
