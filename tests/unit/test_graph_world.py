"""LayoutWorld: the graph's view of a layout, as the simulation and the timeline ask it."""

import pytest

from prism_megatron.graph.world import LayoutWorld, peer_of
from prism_megatron.topology import Layout

LAYOUT = Layout(world_size=64, tp=2, pp=4)  # DP 8


def test_a_world_answers_as_its_layout_does_and_keeps_each_group_once():
    world = LayoutWorld(LAYOUT)
    for kind in ("tp", "pp", "dp", "embd"):
        assert world.group_size(kind) == LAYOUT.group_size(kind)
        for rank in range(LAYOUT.world_size):
            assert world.group(kind, rank) == LAYOUT.group(kind, rank)
            assert world.group(kind, rank) is world.group(kind, rank)
    members = world.group("dp", 0)
    assert all(world.group("dp", m) is members for m in members)  # one tuple per group, not per rank
    assert peer_of(world, "pp", 0, 1) == LAYOUT.group("pp", 0)[1]


@pytest.mark.parametrize("rank", [5.0, -1, 64, "5"])
def test_a_rank_outside_the_world_is_refused_even_once_the_rank_it_equals_was_asked(rank):
    world = LayoutWorld(LAYOUT)
    world.group("tp", 5)
    with pytest.raises(ValueError, match="outside the world"):
        world.group("tp", rank)
