"""Who speaks for a virtual member (the mirror policy's stand-ins), against a Python reference.

The C++ layout (csrc/backend/layout.cpp) decides, for every group, which real member a virtual
member mirrors and whose data a virtual source sends. The reference below states the rule.
"""

from __future__ import annotations

import random

import pytest
import torch  # noqa: F401  (before _C: the extension links libc10)

from prism_megatron import _C


def reference(members, real, roles):
    """Real positions, stand-in (real index) per member, members per real index, source stand-ins."""
    positions = [m for m, rank in enumerate(members) if rank in real]
    role_holder = {}
    if roles is not None:
        for r, position in enumerate(positions):
            role_holder.setdefault(roles[members[position]], r)
    stand_in, source = [], []
    for m, rank in enumerate(members):
        if m in positions:
            stand_in.append(positions.index(m))
            source.append(positions.index(m))
            continue
        holder = role_holder.get(roles[rank]) if roles is not None else None
        if holder is not None:
            stand_in.append(holder)
        else:  # nearest real member by group index, the lower one on a tie
            stand_in.append(min(range(len(positions)), key=lambda r: (abs(positions[r] - m), positions[r])))
        source.append(-1 if holder is None else holder)
    counts = [stand_in.count(r) for r in range(len(positions))]
    return positions, stand_in, counts, source


@pytest.fixture
def configure():
    def apply(world_size, self_rank, real, roles=None):
        _C.backend.configure(world_size, self_rank, 0, sorted(real), roles or [], 300.0, True)

    yield apply
    _C.backend.clear()


def describe(members, self_rank):
    info = _C.backend.describe_group(members, members.index(self_rank))
    return info["real_positions"], info["stand_in"], info["counts"], info["source_stand_in"]


def test_alone_every_virtual_member_mirrors_this_rank_and_a_virtual_source_has_no_data(configure):
    configure(64, 5, [5])
    positions, stand_in, counts, source = describe(list(range(8)), 5)
    assert positions == [5] and stand_in == [0] * 8 and counts == [8]
    assert source == [-1, -1, -1, -1, -1, 0, -1, -1]


def test_virtual_members_mirror_the_nearest_real_member_lower_on_a_tie(configure):
    configure(64, 1, [1, 5])
    positions, stand_in, counts, _ = describe(list(range(8)), 1)
    assert positions == [1, 5]
    assert stand_in == [0, 0, 0, 0, 1, 1, 1, 1]  # member 3 is 2 from both: the lower one, 1
    assert counts == [4, 4]


def test_a_real_member_of_the_same_role_stands_in_and_sends_for_a_virtual_source(configure):
    roles = [r % 4 for r in range(64)]
    configure(64, 1, [1, 6], roles)
    positions, stand_in, _, source = describe(list(range(8)), 1)
    assert positions == [1, 6]
    assert stand_in[5] == 0 and source[5] == 0  # rank 5 has rank 1's role
    assert stand_in[2] == 1 and source[2] == 1  # rank 2 has rank 6's role
    assert stand_in[0] == 0 and source[0] == -1  # role 0 has no real holder: nearest, no data


@pytest.mark.parametrize("seed", range(6))
def test_random_groups_match_the_reference(configure, seed):
    rng = random.Random(seed)
    world = 256
    real = set(rng.sample(range(world), rng.randint(1, 12)))
    self_rank = min(real)
    roles = [rng.randrange(6) for _ in range(world)] if seed % 2 else None
    configure(world, self_rank, real, roles)
    for _ in range(5):
        others = rng.sample(sorted(set(range(world)) - {self_rank}), rng.randint(0, 40))
        members = sorted([self_rank, *others])
        assert describe(members, self_rank) == reference(members, real, roles)
