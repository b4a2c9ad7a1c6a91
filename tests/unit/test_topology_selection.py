"""The rank-selection language, the compact rank notation, and placement of real ranks."""

import pytest

from prism_megatron.topology import Layout, Placement, format_ranks, parse_ranks, place, select_ranks

JOB = Layout(world_size=8192, tp=8, pp=16)


@pytest.mark.parametrize(
    ("ranks", "text"),
    [
        ([0, 1, 2, 3, 4, 5, 6, 7], "0-7"),
        (list(range(5, 8192, 512)), "5-7685:512"),
        ([0, 1, 2, 3, 512, 513, 514, 515], "0-3,512-515"),
        ([3, 9], "3,9"),
        ([0, 4, 5, 6, 7], "0,4-7"),
        ([7], "7"),
        ([], ""),
    ],
)
def test_rank_lists_print_compactly_and_read_back(ranks, text):
    assert format_ranks(ranks) == text
    if ranks:
        assert parse_ranks(text) == ranks


@pytest.mark.parametrize(
    ("text", "message"),
    [
        ("1,,2", "empty item"),
        ("a-3", "is not a rank"),
        ("7-3", "is empty"),
        ("0-8:0", "is empty"),
        ("4:2", "no range"),
    ],
)
def test_bad_rank_lists_are_refused_with_the_reason(text, message):
    with pytest.raises(ValueError, match=message):
        parse_ranks(text)


def test_explicit_ranks_are_sorted_and_unique():
    assert select_ranks(JOB, "7168,0,0") == [0, 7168]
    assert select_ranks(JOB, "0-7680:512") == list(range(0, 8192, 512))


def test_slice_selects_the_default_slice():
    assert select_ranks(JOB, " slice ") == JOB.default_slice()


def test_coordinate_filters_intersect():
    assert select_ranks(JOB, "pp=0,7;tp=0;dp=0") == [0, 7 * 512]
    assert select_ranks(JOB, "pp=15;dp=63") == list(range(8184, 8192))
    assert select_ranks(Layout(world_size=16, tp=2, pp=4), "all") == list(range(16))


def test_expert_coordinates_and_roles_filter_too():
    job = Layout(world_size=8192, tp=8, pp=8, cp=2, ep=8, etp=1)
    chosen = select_ranks(job, "ep=3;pp=2;edp=0")
    assert chosen and all(
        (job.coords(r).ep, job.coords(r).pp, job.coords(r).edp) == (3, 2, 0) for r in chosen
    )
    assert len(chosen) == job.etp
    readers = select_ranks(JOB, "role=pp0-tp0src;dp=1-2")
    assert readers == [8, 16]


@pytest.mark.parametrize(
    ("spec", "message"),
    [
        ("0,8192", r"rank 8192 is outside the world \(0..8191\)"),
        ("pp=16", r"pp=16 is out of range; pp runs 0..15"),
        ("tensor=0", "names: tp, cp, dp, pp, etp, ep, edp, role"),
        ("role=pp99", "no role named 'pp99'"),
        ("pp=1;pp=2", "given twice"),
        ("role=pp3;tp=0;pp=4", "selects no rank"),
        ("", "it is empty"),
    ],
)
def test_bad_selections_say_why(spec, message):
    with pytest.raises(ValueError, match=message):
        select_ranks(JOB, spec)


def test_placement_fills_nodes_in_order():
    placements = place([0, 512, 1024, 7680, 7681], nproc_per_node=2)
    assert placements[3] == Placement(virtual_rank=7680, physical_rank=3, node=1, local_rank=1)
    assert [(p.node, p.local_rank) for p in placements] == [(0, 0), (0, 1), (1, 0), (1, 1), (2, 0)]


def test_placement_refuses_duplicates_and_empty_nodes():
    with pytest.raises(ValueError, match="selected twice"):
        place([3, 3], nproc_per_node=8)
    with pytest.raises(ValueError, match="--nproc-per-node must be a positive integer"):
        place([3], nproc_per_node=0)
