"""The native entry points that take ranks, member lists or sizes never crash on bad input.

`_C.backend.configure`, `create_backend` and `describe_group`, and the rank- and size-taking calls of
`_C.replay`, are called with a few thousand seeded random arguments: mostly valid ones with one
mistake each (a member outside the world, a repeated member, this process's rank missing from its
own group rank, sizes that disagree, a real sub-communicator of the wrong size), some wholly random.
A Python oracle states which inputs are valid. Valid ones must succeed (`describe_group` must also
agree with the mirror policy's reference); invalid ones must raise ValueError (TypeError for a
`real` that is no Backend) naming the argument. Before the checks existed, a member outside the
world read the real-rank table out of bounds and a group without a real member wrote through an
empty vector: a segmentation fault. So every case runs in a child interpreter, and a crash fails the
test instead of ending pytest.

The child is this file run as a script: ``python tests/unit/test_backend_fuzz.py --seed 21 --cases 3000``
runs the two named cases (the issue's reproductions), then the random ones, and prints one JSON
summary line; it exits 1 naming the first case where the module and the oracle disagree.
"""

from __future__ import annotations

import argparse
import json
import math
import os
import random
import subprocess
import sys
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
MAX_WORLD = 2**31 - 1
NUM_OP_KINDS = 11
SEND, RECV = 6, 7


class Mismatch(AssertionError):
    """The native call disagreed with the oracle."""


# ---- the oracle: what the C++ checks must enforce, in the order they check it ----------------------


def configure_error(world, virtual_rank, physical_rank, real_ranks, roles, timeout_s):
    """None when valid, else the words the ValueError must contain."""
    if not 1 <= world <= MAX_WORLD:
        return ("world_size", str(world))
    if not 0 <= virtual_rank < world:
        return ("virtual_rank", str(virtual_rank))
    if roles and len(roles) != world:
        return ("roles",)
    if not (math.isfinite(timeout_s) and 0 < timeout_s <= 1e9):
        return ("timeout_s",)
    seen = set()
    for i, rank in enumerate(real_ranks):
        if not 0 <= rank < world:
            return (f"real_ranks[{i}]", str(rank))
        if rank in seen:
            return ("real_ranks", "more than once", str(rank))
        seen.add(rank)
    if virtual_rank not in seen:
        return ("virtual_rank", "real_ranks")
    if not 0 <= physical_rank < len(real_ranks):
        return ("physical_rank", str(physical_rank))
    return None


def layout_error(ctx, members, self_index):
    """None when the group is valid for this process, else the words of the error."""
    if not members:
        return ("members is empty",)
    if not 0 <= self_index < len(members):
        return ("self_index", "group rank", str(self_index))
    for m, rank in enumerate(members):
        if not 0 <= rank < ctx["world"]:
            return (f"members[{m}] = {rank}", f"[0, {ctx['world']})")
    if len(set(members)) != len(members):
        return ("more than once", "members")
    if members[self_index] != ctx["virtual_rank"]:
        return (f"members[{self_index}] = {members[self_index]}", "this process's virtual rank")
    return None


def backend_error(ctx, group_rank, group_size, members, real):
    """(exception type, words) for an invalid create_backend call, or None when it must succeed."""
    if real is not None and not hasattr(real, "rank"):
        return TypeError, ("real must be a torch.distributed Backend",)
    if not 1 <= group_size <= ctx["world"]:
        return ValueError, ("group_size", str(group_size))
    if len(members) != group_size:
        return ValueError, ("members has", "group_size")
    if not 0 <= group_rank < group_size:
        return ValueError, ("group_rank", str(group_rank))
    words = layout_error(ctx, members, group_rank)
    if words:
        return ValueError, words
    positions = [m for m, rank in enumerate(members) if rank in ctx["real"]]
    if (len(positions) >= 2) != (real is not None):
        return ValueError, ("real must be",)
    if real is not None and (real.size() != len(positions) or real.rank() != positions.index(group_rank)):
        return ValueError, ("real sub-communicator has rank",)
    return None


# ---- the child: random cases against the native module ---------------------------------------------


def expect(function, args, error, what):
    """function(*args) must raise error = (type, words) or, with error None, succeed; returns its result."""
    try:
        result = function(*args)
    except Exception as raised:
        if error is None:
            raise Mismatch(f"{what}: raised {type(raised).__name__}: {raised}, expected success") from raised
        kind, words = error
        message = str(raised)
        if type(raised) is not kind or not all(word in message for word in words):
            raise Mismatch(
                f"{what}: raised {type(raised).__name__}: {message!r}, expected {kind.__name__} with {words}"
            ) from raised
        return None
    if error is not None:
        raise Mismatch(f"{what}: succeeded, expected {error[0].__name__} with {error[1]}")
    return result


def fake_backend(rank, size):
    from torch._C._distributed_c10d import FakeProcessGroup

    return FakeProcessGroup._create_internal(rank, size)


def random_config(rng):
    world = rng.choice([1, 2, 3, 8, 16, 64, 64, 256, 8192])
    num_real = rng.randint(1, min(world, 8))
    real = sorted(rng.sample(range(world), num_real))
    virtual_rank = rng.choice(real)
    roles = [rng.randrange(4) for _ in range(world)] if world <= 256 and rng.random() < 0.4 else []
    return world, virtual_rank, real.index(virtual_rank), real, roles, 300.0


def mutate_config(rng, args):
    world, virtual_rank, physical_rank, real, roles, timeout_s = args
    real = list(real)
    choice = rng.randrange(9)
    if choice == 0:
        world = rng.choice([0, -1, -(2**40), MAX_WORLD + 1])
    elif choice == 1:
        virtual_rank = rng.choice([-1, world, world + 7])
    elif choice == 2:
        physical_rank = rng.choice([-1, len(real), len(real) + 3])
    elif choice == 3:
        real.append(rng.choice([world, -1, world * 2]))
    elif choice == 4:
        real.append(real[0])
    elif choice == 5:
        real.remove(virtual_rank)
    elif choice == 6:
        roles = [0] * rng.choice([1, world + 1]) if world > 1 else [0, 0]
    elif choice == 7:
        timeout_s = rng.choice([0.0, -1.0, math.nan, math.inf, 1e30])
    else:
        real = rng.choices(range(-2, world + 2), k=rng.randint(0, 6))
    return world, virtual_rank, physical_rank, real, roles, timeout_s


def random_group(rng, ctx):
    """A valid (group_rank, members) of this process, sometimes with many real members."""
    world = ctx["world"]
    size = rng.randint(1, min(world, 48))
    others = rng.sample(range(world - 1), size - 1)  # ranks other than this process's
    others = [r + (r >= ctx["virtual_rank"]) for r in others]
    members = [*others]
    group_rank = rng.randrange(size)
    members.insert(group_rank, ctx["virtual_rank"])
    return group_rank, members


def mutate_group(rng, ctx, group_rank, members):
    members = list(members)
    world = ctx["world"]
    choice = rng.randrange(7)
    if choice == 0:
        members[rng.randrange(len(members))] = rng.choice([world, world + 1, -1, 2**40])
    elif choice == 1 and len(members) >= 2:
        i, j = rng.sample(range(len(members)), 2)
        members[i] = members[j]
    elif choice == 2:
        members[group_rank] = rng.choice([r for r in range(world) if r != ctx["virtual_rank"]] or [world])
    elif choice == 3:
        group_rank = rng.choice([-1, len(members), len(members) + 5])
    elif choice == 4:
        members = []
    elif choice == 5:  # the issue's reproduction, generalised: a group with no real member
        virtual = [r for r in range(world) if r not in ctx["real"]]
        members = rng.sample(virtual, min(len(virtual), rng.randint(1, 4))) if virtual else [world]
        group_rank = rng.randrange(len(members))
    else:
        members = rng.choices(range(-3, world + 3), k=rng.randint(0, 8))
        group_rank = rng.randint(-1, len(members))
    return group_rank, members


def random_real(rng, ctx, group_rank, members):
    """The right real argument for a valid group, or a wrong one now and then."""
    positions = [m for m, rank in enumerate(members) if rank in ctx["real"]]
    k = len(positions)
    right = fake_backend(positions.index(group_rank), k) if k >= 2 and group_rank in positions else None
    roll = rng.random()
    if roll < 0.8:
        return right
    if roll < 0.9:
        return fake_backend(0, k + 1) if right is not None or k < 2 else None
    return rng.choice(["gloo", 3, object()])


def fuzz_backend(rng, native, counts, num_cases):
    from tests.unit.test_backend_layout import reference

    ctx = None
    for case in range(num_cases):
        if ctx is None or rng.random() < 0.05:
            args = random_config(rng)
            if rng.random() < 0.5:
                args = mutate_config(rng, args)
            error = configure_error(*args)
            what = f"case {case}: configure{args if len(str(args)) < 300 else args[:3]}"
            expect(native.backend.configure, (*args, True), error and (ValueError, error), what)
            counts["configure"][error is None] += 1
            if error is None:
                world, virtual_rank, _, real, roles, _ = args
                ctx = {
                    "world": world,
                    "virtual_rank": virtual_rank,
                    "real": set(real),
                    "roles": roles or None,
                }
            continue  # an invalid configure leaves the previous activation in force
        group_rank, members = random_group(rng, ctx)
        if rng.random() < 0.6:
            group_rank, members = mutate_group(rng, ctx, group_rank, members)
        if rng.random() < 0.5:
            words = layout_error(ctx, members, group_rank)
            what = f"case {case}: describe_group({members}, {group_rank})"
            info = expect(
                native.backend.describe_group,
                (members, group_rank),
                words and (ValueError, words),
                what,
            )
            counts["describe_group"][words is None] += 1
            if info is not None:
                got = (info["real_positions"], info["stand_in"], info["counts"], info["source_stand_in"])
                if got != reference(members, ctx["real"], ctx["roles"]):
                    raise Mismatch(f"{what}: {got} differs from the mirror policy's reference")
        else:
            group_size = len(members) if rng.random() < 0.9 else rng.choice([0, -1, len(members) + 1, 2**31])
            real = random_real(rng, ctx, group_rank, members)
            error = backend_error(ctx, group_rank, group_size, members, real)
            what = f"case {case}: create_backend({group_rank}, {group_size}, {members}, real={real!r})"
            made = expect(
                native.backend.create_backend, (group_rank, group_size, members, "g", real), error, what
            )
            counts["create_backend"][error is None] += 1
            if made is not None and (made.rank(), made.size()) != (group_rank, group_size):
                raise Mismatch(f"{what}: made a backend of rank {made.rank()} of {made.size()}")


def fuzz_replay(rng, native, counts, num_cases):
    """The replay engine's rank-, member- and size-taking calls: ranks >= 0, members distinct."""
    replay = native.replay
    for case in range(num_cases):
        members = rng.sample(range(64), rng.randint(1, 6))
        if rng.random() < 0.3:
            members = rng.choice([[], [1, 1], [2, -1], [5, 3, 5]])
        size = rng.choice([0, 4096, -1]) if rng.random() < 0.3 else 1024
        kind = rng.choice([0, 2, SEND, RECV]) if rng.random() < 0.9 else rng.choice([-1, NUM_OP_KINDS])
        rank = rng.choice([0, 3, 63]) if rng.random() < 0.8 else -rng.randint(1, 5)
        latency_ns = rng.choice([10.0, 10.0, math.nan, math.inf])
        bad_members = not members or len(set(members)) != len(members) or min(members) < 0
        bad_kind = not 0 <= kind < NUM_OP_KINDS
        calls = {
            "cost_ns": (replay.cost_ns, (members, kind, size), bad_members or bad_kind or size < 0),
            "set_group_cost": (
                replay.set_group_cost,
                (members, kind, [(latency_ns, 0.5)]),
                bad_members or bad_kind or not math.isfinite(latency_ns),
            ),
            "p2p_completion_ns": (replay.p2p_completion_ns, (rank, True, size), rank < 0 or size < 0),
            "load_schedule": (
                replay.load_schedule,
                (rank, [(members, [(kind, size, 0, -1)])], [(rank + 1, True, [])], 1000),
                rank < 0 or bad_members or bad_kind or size < 0,
            ),
            "record_p2p": (
                replay.record_p2p,
                (kind if bad_kind else SEND, 0, rank, -1, size, "float32", 0, 0, 1, False, True),
                bad_kind or rank < 0 or size < 0,
            ),
            "set_virtual_rank": (replay.set_virtual_rank, (rank,), rank < 0),
        }
        name = rng.choice(sorted(calls))
        function, args, bad = calls[name]
        expect(function, args, (ValueError, ()) if bad else None, f"case {case}: replay.{name}")
        counts["replay"][not bad] += 1
    replay.reset_engine()
    replay.clear_log()


NAMED_CASES = ("no-real-member", "member-outside-world")


def named_case(native, name):
    """The issue's two reproductions: W=8 with virtual rank 0 the only real rank."""
    native.backend.configure(8, 0, 0, [0], [], 10.0, True)
    if name == "no-real-member":  # was: Fatal Python error: Segmentation fault
        words = ("members[0] = 3", "this process's virtual rank 0")
        expect(native.backend.create_backend, (0, 2, [3, 5], "g", None), (ValueError, words), name)
    elif name == "member-outside-world":  # was: garbage read, then a misleading error
        words = ("members[1] = 9", "[0, 8)")
        expect(native.backend.create_backend, (0, 2, [0, 9], "g", None), (ValueError, words), name)
    else:
        raise ValueError(f"unknown case {name!r}")


def child(argv):
    """The named cases, then the random ones; prints the summary as one JSON line."""
    parser = argparse.ArgumentParser()
    parser.add_argument("--seed", type=int, default=0)
    parser.add_argument("--cases", type=int, default=3000)
    args = parser.parse_args(argv)
    import torch  # noqa: F401  (before _C: the extension links libc10)

    from prism_megatron import _C as native

    summary = {"seed": args.seed, "named": {}}
    try:
        for name in NAMED_CASES:
            try:
                named_case(native, name)
                summary["named"][name] = "ok"
            except Mismatch as mismatch:
                summary["named"][name] = str(mismatch)
        rng = random.Random(args.seed)
        counts = {name: [0, 0] for name in ("configure", "describe_group", "create_backend", "replay")}
        fuzz_backend(rng, native, counts, args.cases)
        fuzz_replay(rng, native, counts, args.cases // 3)
        native.replay.set_virtual_rank(0)
    except Mismatch as mismatch:
        print(f"MISMATCH {mismatch}", file=sys.stderr)
        return 1
    finally:
        native.backend.clear()
    summary["counts"] = {name: {"raised": n[0], "ok": n[1]} for name, n in counts.items()}
    print(json.dumps(summary))
    return 0


# ---- the tests: one child runs every case; each test reads its part of the summary -----------------


@pytest.fixture(scope="module")
def summary():
    env = {
        **os.environ,
        "PYTHONPATH": os.pathsep.join(filter(None, [str(REPO), os.environ.get("PYTHONPATH")])),
    }
    done = subprocess.run(
        [sys.executable, "-X", "faulthandler", __file__, "--seed", "21", "--cases", "3000"],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=REPO,
    )
    assert done.returncode == 0, f"the child exited {done.returncode}:\n{done.stderr[-3000:]}"
    return json.loads(done.stdout.strip().splitlines()[-1])


def test_issue_reproduction_group_without_this_process_raises_instead_of_crashing(summary):
    assert summary["named"]["no-real-member"] == "ok"


def test_issue_reproduction_member_outside_the_world_raises_instead_of_reading_garbage(summary):
    assert summary["named"]["member-outside-world"] == "ok"


def test_thousands_of_random_arguments_raise_or_succeed_as_the_oracle_says_and_never_crash(summary):
    counts = summary["counts"]
    # The generator must exercise both outcomes of every entry point, or the test proves little.
    for name in ("configure", "describe_group", "create_backend", "replay"):
        assert counts[name]["raised"] >= 20 and counts[name]["ok"] >= 20, counts
    assert sum(c["raised"] + c["ok"] for c in counts.values()) >= 3000, counts


if __name__ == "__main__":
    sys.exit(child(sys.argv[1:]))
