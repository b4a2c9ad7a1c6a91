"""Shrink a production configuration in size only: the same job at its full world size, a tiny model.

Unlike `megatron/plan/shrink.py` (2 of each parallelism, a few ranks), a size shrink keeps every
parallel size, the world size, the batch, the precision, the optimizer, the schedule and every switch
as written, and makes only the model small enough that its slice ranks run on a CPU: the fewest
layers the pipeline layout allows, narrow layers, a short sequence and a small vocabulary. Exactly the
flags of `SIZE_FLAGS` may change (`launch/README.md` lists them with the rule for each); everything
else is the production file's own.

The rules keep what the parallel sizes need: heads and key/value groups divisible by TP, a sequence
that splits into 2 x CP chunks each divisible by TP, expert FFNs divisible by expert TP.
"""

from __future__ import annotations

import math

from prism_megatron.megatron.job.job import job_from_flags

SIZE_FLAGS = (
    "--num-layers",
    "--decoder-first-pipeline-num-layers",
    "--decoder-last-pipeline-num-layers",
    "--num-layers-per-virtual-pipeline-stage",
    "--moe-layer-freq",
    "--hidden-size",
    "--ffn-hidden-size",
    "--num-attention-heads",
    "--num-query-groups",
    "--kv-channels",
    "--seq-length",
    "--max-position-embeddings",
    "--vocab-size",
    "--moe-ffn-hidden-size",
    "--moe-shared-expert-intermediate-size",
    "--q-lora-rank",
    "--kv-lora-rank",
    "--qk-head-dim",
    "--qk-pos-emb-head-dim",
    "--v-head-dim",
    "--train-iters",
)
"""The flags a size shrink may change; nothing else differs from the production file."""

HEAD_DIM = 8
MIN_SEQUENCE = 32
VOCAB = 255  # with the NullTokenizer's end-of-document token, 256 before padding to 128 x TP


def _stage_layers(a) -> dict[str, int]:
    """The fewest layers for the pipeline layout: 1 per model chunk when interleaved, 2 per middle
    stage when the first/last stage is uneven (an end stage keeps its production difference, at
    least 1 layer), else 2 per stage; the embedding and the loss take a layer's place where the split
    counts them as layers."""
    pp, vpp = a.pipeline_model_parallel_size, a.virtual_pipeline_model_parallel_size
    first, last = a.decoder_first_pipeline_num_layers, a.decoder_last_pipeline_num_layers
    if first is not None or last is not None:
        ends = [n for n in (first, last) if n is not None]
        middle = (a.num_layers - sum(ends)) // (pp - len(ends))
        flags = {}
        if first is not None:
            flags["--decoder-first-pipeline-num-layers"] = max(1, 2 - (middle - first))
        if last is not None:
            flags["--decoder-last-pipeline-num-layers"] = max(1, 2 - (middle - last))
        flags["--num-layers"] = sum(flags.values()) + 2 * (pp - len(ends))
        return flags
    counted = int(bool(a.account_for_embedding_in_pipeline_split)) + int(
        bool(a.account_for_loss_in_pipeline_split)
    )
    if vpp is not None:
        return {"--num-layers": pp * vpp - counted, "--num-layers-per-virtual-pipeline-stage": 1}
    return {"--num-layers": 2 * pp - counted}


def _width(a) -> dict[str, int]:
    tp, cp = a.tensor_model_parallel_size, a.context_parallel_size
    heads = max(2 * tp, 4)
    hidden = heads * HEAD_DIM
    chunk = 2 * cp * tp  # 2 x CP chunks, each CP rank's sequence split over TP (sequence parallelism)
    sequence = math.ceil(MIN_SEQUENCE / chunk) * chunk
    flags = {
        "--hidden-size": hidden,
        "--num-attention-heads": heads,
        "--kv-channels": HEAD_DIM,
        "--ffn-hidden-size": 2 * hidden,
        "--seq-length": sequence,
        "--max-position-embeddings": sequence,
        "--vocab-size": VOCAB,
    }
    if a.group_query_attention:
        flags["--num-query-groups"] = tp
    if a.multi_latent_attention:
        flags.update(
            {"--q-lora-rank": 2 * HEAD_DIM, "--kv-lora-rank": 2 * HEAD_DIM, "--qk-head-dim": HEAD_DIM,
             "--qk-pos-emb-head-dim": HEAD_DIM, "--v-head-dim": HEAD_DIM}
        )  # fmt: skip
    return flags


def _experts(a, num_layers: int, hidden: int) -> dict[str, object]:
    if a.num_experts is None:
        return {}
    flags: dict[str, object] = {"--moe-ffn-hidden-size": 2 * hidden}
    if a.moe_shared_expert_intermediate_size:
        flags["--moe-shared-expert-intermediate-size"] = 2 * hidden
    if isinstance(a.moe_layer_freq, list):
        dense = next((i for i, moe in enumerate(a.moe_layer_freq) if moe), len(a.moe_layer_freq))
        dense = min(dense, num_layers - 1)
        flags["--moe-layer-freq"] = f"([0]*{dense}+[1]*{num_layers - dense})"
    return flags


def shrink_size(argv: list[str], *, train_iters: int = 2) -> list[str]:
    """Production flags `argv` (with --prism-world-size) with only the model's size shrunk; the
    overrides are appended (Megatron-LM's parser keeps a flag's last value)."""
    a = job_from_flags(argv).args
    layers = _stage_layers(a)
    width = _width(a)
    overrides = {
        **layers,
        **width,
        **_experts(a, layers["--num-layers"], width["--hidden-size"]),
        "--train-iters": train_iters,
    }
    words = list(argv)
    for flag, value in overrides.items():
        words += [flag, str(value)]
    return words
