"""An activation-memory estimate for one rank, for the configured recompute.

Parameters, gradients and optimizer state are counted exactly from megatron-core's own objects
(build.py); activations depend on what autograd keeps alive during a step and are estimated here.
The per-layer terms generalise Table 2 of Korthikanti et al. 2022, "Reducing Activation Recomputation in
Large Transformer Models" (arXiv 2205.05198), from GPT's 4h MLP and multi-head attention to the
job's FFN size, gated MLP, grouped-query attention and mixture of experts; bytes are for 16-bit
activations and 1-byte dropout masks (kept only when the dropout probability is above zero).

Per transformer layer and microbatch, with s = sequence / CP, b = micro batch, h = hidden size,
t = TP, q = heads x kv_channels, k = query groups x kv_channels, f = FFN size, g = 2 for a gated MLP:
  * tensors that TP does not split (divided by t only with sequence parallelism): the inputs of the
    two layer norms and of the QKV and FC1 projections, 2sbh each, and the two dropout masks, sbh each;
  * tensors that TP splits (divided by t): Q 2sbq, K and V 2sbk each, the attention output 2sbq, the
    FC1 output 2sbfg and the activation output 2sbf (for 4h MHA these give Korthikanti's 24sbh/t);
  * attention scores 5as^2b/t only for an attention that materialises them (`--attention-backend
    unfused` or `local`) and is not recomputed (`--recompute-granularity selective`); flash and fused
    attention keep only softmax statistics, which are neglected;
  * an MoE layer replaces the MLP tensors with those of the routed tokens: each of the rank's tokens
    reaches top-k experts, assumed perfectly balanced across expert-parallel ranks; a shared expert
    adds a dense MLP of its own size. Router logits and permutation buffers are neglected.
With `--recompute-granularity full` a recomputed layer keeps only its input (2sbh, divided by t with
sequence parallelism or `--distribute-saved-activations`).

The first stage adds token ids (8 bytes per token) and the embedding-dropout mask; the last stage adds
the final-norm and output-layer inputs and fp32 logits, 4sb x vocab / t. A stage holds the activations
of as many microbatches as its pipeline schedule keeps in flight (megatron-core schedules.py: p - r
for 1F1B on stage r of p; (p - r - 1) x 2 + (v - 1) x p + 1 model-chunk microbatches interleaved),
capped by the number of microbatches.

Limits: this counts activations stored between forward and backward at the schedule's fullest point;
transient workspace (GEMM outputs being reduced, the recomputed layer during its backward, collective
buffers) and allocator fragmentation are not counted.
"""

from __future__ import annotations

import dataclasses
import math

from prism_megatron.megatron.job.job import Job


@dataclasses.dataclass(frozen=True, kw_only=True)
class ChunkShape:
    """What one model chunk of the rank holds, as counted on the built model."""

    num_dense_layers: int
    num_moe_layers: int
    has_embedding: bool
    has_output_layer: bool
    num_mtp_layers: int = 0


@dataclasses.dataclass(frozen=True, kw_only=True)
class ActivationEstimate:
    bytes: int
    per_microbatch_bytes: list[int]
    """Stored activations of one microbatch, per model chunk."""
    in_flight_microbatches: int
    """Model-chunk microbatches whose activations the schedule holds at once on this stage."""
    formula: str


def _layer_bytes(job: Job, moe: bool) -> tuple[float, float]:
    """(bytes kept by a layer that is not recomputed, bytes kept by a fully recomputed layer)."""
    a = job.args
    s = a.seq_length / a.context_parallel_size
    b, h, t = a.micro_batch_size, a.hidden_size, a.tensor_model_parallel_size
    sp_divisor = t if a.sequence_parallel else 1
    if a.multi_latent_attention:
        q_dim = k_dim = a.num_attention_heads * (a.qk_head_dim + a.qk_pos_emb_head_dim)
        v_dim = out_dim = a.num_attention_heads * a.v_head_dim
    else:
        groups = a.num_query_groups if a.group_query_attention else a.num_attention_heads
        q_dim = out_dim = a.num_attention_heads * a.kv_channels
        k_dim = v_dim = groups * a.kv_channels
    gate = 2 if a.swiglu else 1
    mask = 1 if a.hidden_dropout > 0 else 0
    replicated = s * b * h * (2 + 2 + 2 + 2 + 2 * mask) / sp_divisor
    attention = s * b * 2 * (q_dim + k_dim + v_dim + out_dim) / t
    stores_scores = (
        a.attention_backend.name in ("unfused", "local") and a.recompute_granularity != "selective"
    )
    scores = 5 * a.num_attention_heads * s * s * b / t if stores_scores else 0.0
    if moe:
        tokens = s * b / sp_divisor * a.moe_router_topk
        f = a.moe_ffn_hidden_size
        mlp = tokens * (2 * h + 2 * f * gate + 2 * f)
        if a.moe_shared_expert_intermediate_size:
            fs = a.moe_shared_expert_intermediate_size
            mlp += s * b * (2 * fs * gate + 2 * fs) / t
    else:
        f = a.ffn_hidden_size
        mlp = s * b * (2 * f * gate + 2 * f) / t
    distribute = a.sequence_parallel or a.distribute_saved_activations
    recomputed = 2 * s * b * h / (t if distribute else 1)
    return replicated + attention + scores + mlp, recomputed


def _layers_kept(job: Job, num_layers: int) -> tuple[int, int]:
    """(layers whose activations are kept, layers that keep only their input) in one chunk."""
    a = job.args
    if a.recompute_granularity != "full" or num_layers == 0:
        return num_layers, 0
    n = a.recompute_num_layers or 1
    if a.recompute_method == "block":
        recomputed = min(n, num_layers)
        return num_layers - recomputed, recomputed
    # uniform: the chunk's layers are checkpointed in groups of n; each group keeps one input.
    return 0, math.ceil(num_layers / n)


def chunk_bytes(job: Job, chunk: ChunkShape) -> int:
    """Stored activations of one microbatch in one model chunk."""
    a = job.args
    s = a.seq_length / a.context_parallel_size
    b, h, t = a.micro_batch_size, a.hidden_size, a.tensor_model_parallel_size
    total = 0.0
    for moe, count in ((False, chunk.num_dense_layers + chunk.num_mtp_layers), (True, chunk.num_moe_layers)):
        if count == 0:
            continue
        full, recomputed = _layer_bytes(job, moe)
        kept, checkpoints = _layers_kept(job, count)
        total += kept * full + checkpoints * recomputed
    if chunk.has_embedding:
        total += 8 * s * b + (s * b * h if a.hidden_dropout > 0 else 0)
    if chunk.has_output_layer:
        sp_divisor = t if a.sequence_parallel else 1
        total += 4 * s * b * h / sp_divisor + 4 * s * b * a.padded_vocab_size / t
    return int(total)


def in_flight_microbatches(job: Job, pipeline_rank: int) -> int:
    """Model-chunk microbatches held at once by pipeline stage `pipeline_rank` (see module docstring)."""
    a = job.args
    p, m = a.pipeline_model_parallel_size, a.num_microbatches
    vpp = a.virtual_pipeline_model_parallel_size
    if p == 1:
        return 1
    if vpp is None:
        return min(p - pipeline_rank, m)
    group = a.microbatch_group_size_per_vp_stage or p
    warmup = (p - pipeline_rank - 1) * 2 + (vpp - 1) * group
    return min(warmup + 1, m * vpp)


def estimate(job: Job, pipeline_rank: int, chunks: list[ChunkShape]) -> ActivationEstimate:
    """Activations a rank on stage `pipeline_rank` holding `chunks` keeps at the schedule's peak."""
    per_chunk = [chunk_bytes(job, chunk) for chunk in chunks]
    in_flight = in_flight_microbatches(job, pipeline_rank)
    mean_chunk = sum(per_chunk) / len(per_chunk)
    recompute = job.args.recompute_granularity or "none"
    return ActivationEstimate(
        bytes=int(mean_chunk * in_flight),
        per_microbatch_bytes=per_chunk,
        in_flight_microbatches=in_flight,
        formula=(
            f"Korthikanti et al. 2022 Table 2, generalised (recompute={recompute}, "
            f"sequence_parallel={job.args.sequence_parallel}); {in_flight} chunk-microbatches in flight"
        ),
    )
