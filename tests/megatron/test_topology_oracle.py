"""The topology package against megatron-core 0.16.1 itself.

Two oracles: megatron-core's `RankGenerator` (the arithmetic `initialize_model_parallel` uses) over a
sweep of jobs, comparing every group of every kind in full; and `initialize_model_parallel` itself,
run in one process over torch's `fake` backend as one virtual rank of a W-rank world, comparing
every group and global-rank list that rank gets.
"""

import itertools
from types import SimpleNamespace

import pytest

pytest.importorskip("megatron.core")

import torch.distributed as dist
import torch.testing._internal.distributed.fake_pg  # noqa: F401  (registers the fake backend)
from megatron.core import parallel_state
from megatron.core.parallel_state import RankGenerator, default_embedding_ranks
from megatron.core.transformer.multi_token_prediction import get_mtp_ranks
from torch.testing._internal.distributed.fake_pg import FakeStore

from prism_megatron.topology import GROUP_KINDS, Layout

# kind -> (which generator, megatron-core's token), as initialize_model_parallel builds them.
MEGATRON_TOKENS = {
    "tp": ("decoder", "tp"),
    "pp": ("decoder", "pp"),
    "dp": ("decoder", "dp"),
    "dp_cp": ("decoder", "dp-cp"),
    "cp": ("decoder", "cp"),
    "mp": ("decoder", "tp-pp"),
    "tp_dp": ("decoder", "tp-dp"),
    "tp_cp": ("decoder", "tp-cp"),
    "tp_dp_cp": ("decoder", "tp-dp-cp"),
    "ep": ("expert", "ep"),
    "expt_tp": ("expert", "tp"),
    "expt_dp": ("expert", "dp"),
    "tp_ep": ("expert", "tp-ep"),
    "tp_ep_pp": ("expert", "tp-ep-pp"),
}

LARGE_JOBS = [
    dict(world_size=8192, tp=8, pp=16),
    dict(world_size=8192, tp=8, pp=8, cp=2, ep=8),
    dict(world_size=8192, tp=8, pp=8, cp=2, ep=8, etp=1),
    dict(world_size=8192, tp=8, pp=16, order="tp-cp-ep-pp-dp"),
    dict(world_size=8192, tp=4, pp=8, cp=2, ep=8, etp=1, order="tp-cp-ep-pp-dp"),
    dict(world_size=8192, tp=8, pp=8, vpp=4),
    dict(world_size=8192, tp=2, pp=4, ep=64, etp=4),
]


def _sweep():
    """Every job Megatron accepts over small sizes, both orders, expert-TP unlike TP, some VPP."""
    jobs = []
    for world_size, tp, pp, cp, ep, etp, order in itertools.product(
        (16, 48), (1, 2, 4), (1, 2, 4), (1, 2), (1, 2, 4), (None, 1), ("tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp")
    ):
        job = dict(world_size=world_size, tp=tp, pp=pp, cp=cp, ep=ep, etp=etp, order=order)
        if pp > 1 and (tp + ep) % 2:
            job["vpp"] = 2
        jobs.append(job)
    return jobs


def _megatron_generators(layout):
    decoder = RankGenerator(tp=layout.tp, ep=1, dp=layout.dp, pp=layout.pp, cp=layout.cp, order=layout.order)
    expert = RankGenerator(tp=layout.etp, ep=layout.ep, dp=layout.edp, pp=layout.pp, cp=1, order=layout.order)
    return {"decoder": decoder, "expert": expert}


def _megatron_accepts(job):
    """Whether initialize_model_parallel would accept the job (its own checks, reproduced)."""
    world_size, tp, pp, cp, ep = (job[k] for k in ("world_size", "tp", "pp", "cp", "ep"))
    etp = job["etp"] or tp
    if world_size % (tp * pp * cp) or world_size % (etp * ep * pp):
        return False
    decoder = RankGenerator(tp=tp, ep=1, dp=world_size // (tp * pp * cp), pp=pp, cp=cp, order=job["order"])
    expert = RankGenerator(tp=etp, ep=ep, dp=world_size // (etp * ep * pp), pp=pp, cp=1, order=job["order"])
    same_dp = world_size // (tp * pp * cp) == world_size // (etp * ep * pp)
    return (job["order"].endswith("pp") or pp == 1 or same_dp) and decoder.get_ranks(
        "pp"
    ) == expert.get_ranks("pp")


def _assert_all_groups_match(layout):
    generators = _megatron_generators(layout)
    expected = {kind: generators[gen].get_ranks(token) for kind, (gen, token) in MEGATRON_TOKENS.items()}
    for kind, groups in expected.items():
        assert [list(members) for members in layout.groups(kind)] == groups, kind
    pp_groups = expected["pp"]
    assert [list(m) for m in layout.groups("embd")] == [default_embedding_ranks(g) for g in pp_groups]
    assert [list(m) for m in layout.groups("pos_embd")] == [[g[0]] for g in pp_groups]
    # Per rank, on a spread of ranks: the arithmetic answer is the enumerated group.
    for virtual_rank in range(0, layout.world_size, max(1, layout.world_size // 97)):
        for kind, groups in expected.items():
            assert list(layout.group(kind, virtual_rank)) == groups[layout.group_index(kind, virtual_rank)], (
                kind
            )


SWEEP = _sweep()


def test_sweep_is_broad():
    accepted = [job for job in SWEEP if _megatron_accepts(job)]
    assert len(accepted) + len(LARGE_JOBS) >= 50
    assert {job["order"] for job in accepted} == {"tp-cp-ep-dp-pp", "tp-cp-ep-pp-dp"}
    assert any(job["etp"] == 1 and job["tp"] > 1 and job["ep"] > 1 for job in accepted)
    assert any("vpp" in job for job in accepted)


@pytest.mark.parametrize("job", SWEEP, ids=str)
def test_layout_accepts_what_megatron_accepts_and_builds_the_same_groups(job):
    if not _megatron_accepts(job):
        with pytest.raises(ValueError):
            Layout(**job)
        return
    _assert_all_groups_match(Layout(**job))


@pytest.mark.parametrize("job", LARGE_JOBS, ids=str)
def test_production_size_jobs_build_megatrons_groups(job):
    _assert_all_groups_match(Layout(**job))


# ---- initialize_model_parallel over the fake backend -------------------------------------------------


def _pretrain_gpt_embedding_ranks(layout):
    """Megatron-LM's `pretrain_gpt.get_embedding_ranks` for the layout's flags, its MTP stages from
    megatron-core's own `get_mtp_ranks` (the last stage, without a pipeline layout)."""
    config = SimpleNamespace(mtp_num_layers=1 if layout.mtp else None, pipeline_model_parallel_layout=None)

    def get_embedding_ranks(pp_ranks):
        ranks = [pp_ranks[0]]
        if len(pp_ranks) > 1:
            if not layout.untie_embeddings:
                ranks.append(pp_ranks[-1])
            ranks.extend(get_mtp_ranks(pp_ranks, config))
        return sorted(set(ranks))

    return get_embedding_ranks


@pytest.fixture
def virtual_world(monkeypatch):
    """Start a fake-backend default group as one rank of a big world; always tear Megatron down."""

    # destroy_model_parallel() leaves most *_GLOBAL_RANKS lists set; clear them so that a rank
    # outside a group reads None as it would in a fresh process.
    for name in dir(parallel_state):
        if name.startswith("_") and name.endswith(
            ("_GLOBAL_RANKS", "_GLOBAL_RANKS_WITH_CP", "_PARALLEL_RANKS")
        ):
            monkeypatch.setattr(parallel_state, name, None)

    def start(virtual_rank, layout):
        dist.init_process_group("fake", store=FakeStore(), rank=virtual_rank, world_size=layout.world_size)
        parallel_state.initialize_model_parallel(
            tensor_model_parallel_size=layout.tp,
            pipeline_model_parallel_size=layout.pp,
            virtual_pipeline_model_parallel_size=layout.vpp,
            context_parallel_size=layout.cp,
            expert_model_parallel_size=layout.ep,
            expert_tensor_parallel_size=layout.etp,
            order=layout.order,
            get_embedding_ranks=_pretrain_gpt_embedding_ranks(layout),
            create_gloo_process_groups=False,
        )

    yield start
    parallel_state.destroy_model_parallel()
    if dist.is_initialized():
        dist.destroy_process_group()


def _megatron_groups():
    """Every group the current rank got from initialize_model_parallel, by our kind names."""
    ps = parallel_state
    getters = {
        "tp": ps.get_tensor_model_parallel_group,
        "pp": ps.get_pipeline_model_parallel_group,
        "dp": ps.get_data_parallel_group,
        "dp_cp": lambda: ps.get_data_parallel_group(with_context_parallel=True),
        "cp": ps.get_context_parallel_group,
        "mp": ps.get_model_parallel_group,
        "tp_dp": ps.get_tensor_and_data_parallel_group,
        "tp_cp": ps.get_tensor_and_context_parallel_group,
        "tp_dp_cp": lambda: ps.get_tensor_and_data_parallel_group(with_context_parallel=True),
        "ep": ps.get_expert_model_parallel_group,
        "expt_tp": ps.get_expert_tensor_parallel_group,
        "expt_dp": ps.get_expert_data_parallel_group,
        "tp_ep": ps.get_expert_tensor_and_model_parallel_group,
        "tp_ep_pp": ps.get_expert_tensor_model_pipeline_parallel_group,
    }
    groups = {kind: getter() for kind, getter in getters.items()}
    groups["embd"] = ps._EMBEDDING_GROUP
    groups["pos_embd"] = ps._POSITION_EMBEDDING_GROUP
    return groups


def _megatron_global_rank_lists():
    ps = parallel_state
    lists = {
        "tp": ps._TENSOR_MODEL_PARALLEL_GLOBAL_RANKS,
        "pp": ps._PIPELINE_GLOBAL_RANKS,
        "dp": ps._DATA_PARALLEL_GLOBAL_RANKS,
        "dp_cp": ps._DATA_PARALLEL_GLOBAL_RANKS_WITH_CP,
        "cp": ps._CONTEXT_PARALLEL_GLOBAL_RANKS,
        "mp": ps._MODEL_PARALLEL_GLOBAL_RANKS,
        "ep": ps._EXPERT_MODEL_PARALLEL_RANKS,
        "embd": ps._EMBEDDING_GLOBAL_RANKS,
        "pos_embd": ps._POSITION_EMBEDDING_GLOBAL_RANKS,
    }
    return {kind: () if ranks is None else tuple(ranks) for kind, ranks in lists.items()}


INITIALIZED_JOBS = [
    (dict(world_size=8192, tp=8, pp=16), (0, 5, 4100, 8191)),
    (dict(world_size=8192, tp=8, pp=8, cp=2, ep=8), (0, 1234, 8191)),
    (dict(world_size=8192, tp=8, pp=16, order="tp-cp-ep-pp-dp"), (3, 777, 8190)),
    (dict(world_size=4096, tp=4, pp=8, vpp=4, untie_embeddings=True), (0, 3585, 4095)),
    (dict(world_size=4096, tp=4, pp=4, cp=2, ep=8, etp=1), (6, 2049, 4095)),
    # DeepSeek-V3's layout: untied, but the last stage holds the MTP layer and so the embedding.
    (dict(world_size=2048, pp=16, ep=64, untie_embeddings=True, mtp=True), (0, 1920, 2047, 5)),
]


@pytest.mark.parametrize(
    ("job", "virtual_rank"),
    [(job, virtual_rank) for job, ranks in INITIALIZED_JOBS for virtual_rank in ranks],
    ids=str,
)
def test_initialize_model_parallel_gives_each_rank_our_groups(virtual_world, job, virtual_rank):
    layout = Layout(**job)
    virtual_world(virtual_rank, layout)
    groups = _megatron_groups()
    assert set(groups) == set(GROUP_KINDS)
    for kind, group in groups.items():
        members = () if group is None else tuple(dist.get_process_group_ranks(group))
        assert layout.group(kind, virtual_rank) == members, kind
        if group is not None:
            assert dist.get_rank(group) == layout.rank_in_group(kind, virtual_rank), kind
    for kind, ranks in _megatron_global_rank_lists().items():
        assert layout.group(kind, virtual_rank) == ranks, kind
