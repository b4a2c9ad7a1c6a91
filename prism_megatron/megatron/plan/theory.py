"""Megatron-LM's own theoretical memory estimate, for comparison with the plan.

Megatron-LM prints "Theoretical memory footprints" on rank 0 (`megatron/training/
theoretical_memory_usage.py` at tag core_v0.16.1, `report_theoretical_memory`). Megatron-LM is not a
dependency, so its formulas are restated here, in our words and with its own simplifications kept on
purpose, because the point is to show where that estimate and the real rank differ:

* Parameters per layer: attention 2h^2 (1 + groups/heads) q/h (or MLA's low-rank terms), MLP
  2h f (x 3/2 when gated), MoE layers num_experts x moe_ffn (+ shared expert) in place of f, two
  norms; embeddings h x padded vocab (twice when untied); MTP layers.
* The "most loaded shard" (pipeline stage 0): (block / PP + MTP + embedding) / TP, plus a second
  embedding when untied and PP = 1. Other stages: block / (PP x TP); Megatron computes this number
  but reports only the most loaded shard.
* Bytes per parameter: 18, or 6 + 12 / DP with the distributed optimizer.
* Activations: with sequence parallelism and selective recompute, s b h (18 + 4 f / h) per layer
  (Korthikanti et al. Table 2) for all layers of the model, plus embedding terms x PP, scaled by the
  interleaving penalty or min(1, microbatches / PP), plus output terms when PP = 1, all / TP.
  Otherwise s b h (10 + 24 / TP) per layer, the same pipeline scaling, PP = 1 logits, x 1.05.

The estimate ignores expert parallelism (every rank is charged all experts), context parallelism (the
full sequence), uneven pipeline splits and the last stage's output layer. `differences` names the ones
that apply to a job.
"""

from __future__ import annotations

import dataclasses

from prism_megatron.megatron.job.job import Job

SOURCE = "Megatron-LM megatron/training/theoretical_memory_usage.py (core_v0.16.1), restated"


@dataclasses.dataclass(frozen=True, kw_only=True)
class MegatronEstimate:
    num_params: int
    """Parameters Megatron's formula assigns to this rank's pipeline stage, per TP rank."""
    bytes_per_param: float
    weight_and_optimizer_bytes: int
    activation_bytes: int
    """Megatron's activation estimate (always computed for pipeline stage 0)."""
    activation_formula: str


def _parameter_counts(job: Job) -> tuple[float, float, float, float]:
    """(transformer block, MTP block, one embedding, expert parameters in the block), whole model:
    the target job's count (`ModelShape.parameter_counts`, the one every report and plan uses), with
    multi-latent attention's low-rank projections where the job has them."""
    a = job.args
    heads, h = a.num_attention_heads, a.hidden_size
    norm = 1 if a.normalization == "RMSNorm" else 2
    attention = None
    if a.multi_latent_attention:
        qk = a.qk_head_dim + a.qk_pos_emb_head_dim
        q_term = h * heads * qk if a.q_lora_rank is None else a.q_lora_rank * (h + heads * qk + norm)
        attention = (
            q_term
            + a.kv_lora_rank * (h + heads * (a.qk_head_dim + a.v_head_dim) + norm)
            + h * a.qk_pos_emb_head_dim
            + heads * a.v_head_dim * h
        )
    return job.target.model.parameter_counts(norms_per_layer=2 * norm, attention=attention)


def _interleaving_factor(job: Job) -> float:
    a = job.args
    p, vpp, m = a.pipeline_model_parallel_size, a.virtual_pipeline_model_parallel_size, a.num_microbatches
    if vpp is not None:
        return 1 + (p - 1) / (p * vpp)
    if p > 1:
        return min(1, m / p)
    return 1.0


def _activation_bytes(job: Job) -> tuple[int, str]:
    a = job.args
    s, b, h, t, p = (
        a.seq_length,
        a.micro_batch_size,
        a.hidden_size,
        a.tensor_model_parallel_size,
        a.pipeline_model_parallel_size,
    )
    embedding_terms = 8 * s * b * p + s * b * h * p
    if a.sequence_parallel and a.recompute_granularity == "selective":
        total = s * b * h * (18 + 4 * a.ffn_hidden_size / h) * a.num_layers + embedding_terms
        total *= _interleaving_factor(job)
        if p == 1:
            total += s * b * h * 4 * (1 + a.padded_vocab_size / h)
        return int(total / t), "sbh(18 + 4f/h) per layer, with sequence parallelism and selective recompute"
    total = s * b * h * (10 + 24 / t) * a.num_layers + embedding_terms
    total *= _interleaving_factor(job)
    if p == 1:
        total += (s * b * a.padded_vocab_size / t + s * b * h) * 2
    return int(total * 1.05), "sbh(10 + 24/t) per layer, without sequence parallelism, x 1.05"


def estimate(job: Job, pipeline_rank: int) -> MegatronEstimate:
    """Megatron-LM's estimate for a rank on pipeline stage `pipeline_rank`."""
    a = job.args
    block, mtp, embedding, _ = _parameter_counts(job)
    p, t = a.pipeline_model_parallel_size, a.tensor_model_parallel_size
    if pipeline_rank == 0:
        params = (block / p + mtp + embedding) / t
        if a.untie_embeddings_and_output_weights and p == 1:
            params += embedding / t
    else:
        params = block / (p * t)
    per_param = 6 + 12 / a.data_parallel_size if a.use_distributed_optimizer else 18
    activations, formula = _activation_bytes(job)
    return MegatronEstimate(
        num_params=int(params),
        bytes_per_param=per_param,
        weight_and_optimizer_bytes=int(params * per_param),
        activation_bytes=activations,
        activation_formula=formula,
    )


def differences(job: Job, pipeline_rank: int, has_output_layer: bool) -> list[str]:
    """The blind spots of Megatron's estimate that apply to this job and rank, with their size."""
    a = job.args
    notes = []
    _, _, embedding, expert_params = _parameter_counts(job)
    ep, etp, t = a.expert_model_parallel_size, a.expert_tensor_parallel_size, a.tensor_model_parallel_size
    if a.num_experts is not None and (ep > 1 or etp != t):
        stage_share = expert_params / a.pipeline_model_parallel_size
        over = stage_share / t - stage_share / (ep * etp)
        notes.append(
            f"expert parallelism ignored: Megatron charges every rank all {a.num_experts} experts / TP; "
            f"this rank holds {a.num_experts // ep} experts / ETP {etp} (~{over / 1e6:.0f}M parameters fewer)"
        )
    if a.context_parallel_size > 1:
        notes.append(
            f"context parallelism ignored: Megatron's activations use the full sequence {a.seq_length}; "
            f"each rank holds {a.seq_length // a.context_parallel_size} tokens (CP={a.context_parallel_size})"
        )
    if a.decoder_first_pipeline_num_layers is not None or a.decoder_last_pipeline_num_layers is not None:
        notes.append("uneven pipeline split ignored: Megatron assumes num_layers / PP layers on every stage")
    if has_output_layer and a.untie_embeddings_and_output_weights and a.pipeline_model_parallel_size > 1:
        notes.append(
            f"the last stage's output layer ({embedding / t / 1e6:.0f}M parameters per TP rank) is not in "
            "Megatron's per-stage count"
        )
    if a.use_distributed_optimizer and not a.accumulate_allreduce_grads_in_fp32:
        notes.append(
            "Megatron's 6 + 12/DP bytes per parameter assumes fp32 gradients; this job reduces in 16-bit"
        )
    if not a.use_distributed_optimizer and a.fp16 and not a.accumulate_allreduce_grads_in_fp32:
        notes.append(
            "Megatron's 18 bytes per parameter counts fp32 gradients; fp16 training keeps 16-bit "
            "gradient buffers plus fp32 copies made at the optimizer step"
        )
    if pipeline_rank != 0:
        notes.append("Megatron computes activations for stage 0 only; the plan counts this stage's schedule")
    if a.sequence_parallel and a.recompute_granularity != "selective":
        notes.append(
            "Megatron uses its sequence-parallel activation formula only with selective recompute; "
            "here it charges the non-sequence-parallel sbh(10 + 24/t) per layer"
        )
    if a.recompute_granularity == "full":
        notes.append("Megatron's activation formula ignores full recompute (it charges every layer in full)")
    if a.num_experts is not None:
        notes.append("Megatron's activation formula charges MoE layers as dense layers of FFN size f")
    return notes
