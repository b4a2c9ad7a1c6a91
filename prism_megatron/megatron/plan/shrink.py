"""Shrink a production configuration to a few ranks and a tiny model, keeping its structure.

A shrink keeps what decides how memory is laid out (which parallelisms are on, uneven pipeline
stages, interleaving, tied or untied embeddings, gated MLP, grouped-query or multi-latent attention,
MoE with shared experts and dense first layers, multi-token prediction, precision, the distributed
optimizer and its bucketing) and makes everything small: 2 of each parallelism that the job uses
(as many as the world allows), hidden size 64, a vocabulary of 256. A 2- or 8-rank shrink runs for
real on a CPU, so the plan of the shrink can be held against what the real run allocates.

Overrides are appended to the production flags; Megatron-LM's parser keeps the last value of a flag.
"""

from __future__ import annotations

from prism_megatron.megatron.job.job import Job, job_from_flags

_TINY_MODEL = {
    "--hidden-size": 64,
    "--num-attention-heads": 4,
    "--kv-channels": 16,
    "--ffn-hidden-size": 128,
    "--seq-length": 32,
    "--max-position-embeddings": 32,
    "--micro-batch-size": 1,
    "--vocab-size": 255,
}
_TINY_MLA = {
    "--q-lora-rank": 32,
    "--kv-lora-rank": 16,
    "--qk-head-dim": 16,
    "--qk-pos-emb-head-dim": 8,
    "--v-head-dim": 16,
}
_BUCKET_ELEMENTS = 4000
"""DDP bucket size of the shrinks that overlap the gradient reduce: small enough that a tiny model
still fills several buckets, so bucket padding is exercised."""


def _parallel_sizes(job: Job, world_size: int) -> dict[str, int]:
    """2 of each parallelism the job uses, pipeline first, while the world allows; DP takes the rest."""
    a = job.args
    sizes = {"pp": 1, "tp": 1, "cp": 1}
    for name, used in (
        ("pp", a.pipeline_model_parallel_size),
        ("tp", a.tensor_model_parallel_size),
        ("cp", a.context_parallel_size),
    ):
        if used > 1 and world_size % (2 * sizes["pp"] * sizes["tp"] * sizes["cp"]) == 0:
            sizes[name] = 2
    sizes["dp"] = world_size // (sizes["pp"] * sizes["tp"] * sizes["cp"])
    sizes["etp"] = min(a.expert_tensor_parallel_size, sizes["tp"])
    expert_room = sizes["tp"] * sizes["cp"] * sizes["dp"] // sizes["etp"]
    sizes["ep"] = 2 if a.expert_model_parallel_size > 1 and expert_room % 2 == 0 else 1
    return sizes


def _layer_flags(job: Job, pp: int) -> dict[str, object]:
    a = job.args
    flags: dict[str, object] = {}
    uneven = a.decoder_first_pipeline_num_layers is not None or a.decoder_last_pipeline_num_layers is not None
    if uneven and pp > 1:
        # One layer on the first stage, two on the last, one on each stage between.
        flags.update({"--decoder-first-pipeline-num-layers": 1, "--decoder-last-pipeline-num-layers": 2})
        flags["--num-layers"] = 1 + 2 + (pp - 2)
    elif a.virtual_pipeline_model_parallel_size is not None and pp > 1:
        flags.update({"--num-layers": 2 * pp, "--num-layers-per-virtual-pipeline-stage": 1})
    else:
        flags["--num-layers"] = 2 * pp
    if a.num_experts is not None and isinstance(a.moe_layer_freq, list):
        num_layers = flags["--num-layers"]
        flags["--moe-layer-freq"] = f"([{a.moe_layer_freq[0]}]*1+[1]*{num_layers - 1})"
    return flags


def _moe_flags(job: Job, ep: int) -> dict[str, object]:
    a = job.args
    if a.num_experts is None:
        return {}
    flags: dict[str, object] = {
        "--num-experts": 4,
        "--moe-ffn-hidden-size": 32,
        "--moe-router-topk": min(a.moe_router_topk, 2),
        "--expert-model-parallel-size": ep,
    }
    if a.moe_shared_expert_intermediate_size:
        flags["--moe-shared-expert-intermediate-size"] = 32
    if a.moe_router_num_groups:
        flags.update({"--moe-router-num-groups": 2, "--moe-router-group-topk": 1})
    return flags


def shrink(argv: list[str], world_size: int) -> list[str]:
    """Production flags `argv` shrunk to `world_size` ranks and a tiny model of the same structure."""
    job = job_from_flags(argv)
    a = job.args
    sizes = _parallel_sizes(job, world_size)
    overrides: dict[str, object] = {
        **_TINY_MODEL,
        "--tensor-model-parallel-size": sizes["tp"],
        "--pipeline-model-parallel-size": sizes["pp"],
        "--context-parallel-size": sizes["cp"],
        "--expert-tensor-parallel-size": sizes["etp"],
        "--global-batch-size": sizes["dp"] * 2 * sizes["pp"],
        "--prism-world-size": world_size,
        **_layer_flags(job, sizes["pp"]),
        **_moe_flags(job, sizes["ep"]),
    }
    if a.group_query_attention:
        overrides["--num-query-groups"] = 2
    if a.multi_latent_attention:
        overrides.update(_TINY_MLA)
    if a.overlap_grad_reduce:
        overrides["--ddp-bucket-size"] = _BUCKET_ELEMENTS
    words = list(argv)
    for flag, value in overrides.items():
        words += [flag, str(value)]
    return words
