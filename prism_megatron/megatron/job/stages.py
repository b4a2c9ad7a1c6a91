"""The pipeline split of the target job: the virtual-pipeline size and the layers of each stage.

Megatron-LM derives the chunks per pipeline rank (`virtual_pipeline_model_parallel_size`) in
`validate_args` from one of two flags, and megatron-core checks the split in
`TransformerConfig.__post_init__`; `derive_schedule` does both, once, for every command
(`prism_megatron.megatron.job.target`), with messages that name the flags. Pure (no torch, no Megatron).
"""

from __future__ import annotations

import argparse


def _split_layers(args: argparse.Namespace) -> int | None:
    """Layers the pipeline split counts: the transformer layers, plus the embedding and the loss under
    --account-for-embedding/loss-in-pipeline-split (Megatron-LM's rule)."""
    if args.num_layers is None:
        return None
    return (
        args.num_layers
        + args.account_for_embedding_in_pipeline_split
        + args.account_for_loss_in_pipeline_split
    )


def _uneven(args: argparse.Namespace) -> bool:
    return (
        args.decoder_first_pipeline_num_layers is not None
        or args.decoder_last_pipeline_num_layers is not None
    )


def derive_schedule(args: argparse.Namespace) -> None:
    """The virtual-pipeline size (its one derivation) and the pipeline split, as Megatron-LM checks them."""
    pp, per_chunk = args.pipeline_model_parallel_size, args.num_layers_per_virtual_pipeline_stage
    chunks = args.num_virtual_stages_per_pipeline_rank
    if per_chunk is not None and chunks is not None:
        raise ValueError(
            "give --num-layers-per-virtual-pipeline-stage or --num-virtual-stages-per-pipeline-rank, not both"
        )
    if _uneven(args) and (
        args.account_for_embedding_in_pipeline_split or args.account_for_loss_in_pipeline_split
    ):
        raise ValueError(
            "--decoder-first/last-pipeline-num-layers cannot be combined with "
            "--account-for-embedding/loss-in-pipeline-split (megatron-core refuses it)"
        )
    vpp = chunks
    if per_chunk is not None:
        vpp = _chunks_from_layers_per_chunk(args, per_chunk)
    elif chunks is not None and chunks < 1:
        raise ValueError(f"--num-virtual-stages-per-pipeline-rank must be a positive integer, got {chunks}")
    args.virtual_pipeline_model_parallel_size = vpp if vpp != 1 else None
    if _uneven(args):
        _check_uneven_stages(args)
    elif per_chunk is None and args.num_layers is not None and _split_layers(args) % pp:
        raise ValueError(
            f"--num-layers {args.num_layers}{_counted_extras(args)} must be divisible by "
            f"--pipeline-model-parallel-size {pp}"
        )
    _check_interleaving(args)


def _counted_extras(args: argparse.Namespace) -> str:
    extras = [name for name, on in (("embedding", args.account_for_embedding_in_pipeline_split),
                                    ("loss", args.account_for_loss_in_pipeline_split)) if on]  # fmt: skip
    return f" (+1 for the {' and the '.join(extras)})" if extras else ""


def _chunks_from_layers_per_chunk(args: argparse.Namespace, per_chunk: int) -> int:
    pp = args.pipeline_model_parallel_size
    if _uneven(args):
        raise ValueError(
            "--num-layers-per-virtual-pipeline-stage cannot be combined with "
            "--decoder-first/last-pipeline-num-layers; pass --num-virtual-stages-per-pipeline-rank"
        )
    if args.num_layers is None:
        raise ValueError(
            "--num-layers-per-virtual-pipeline-stage needs --num-layers to derive the chunks per stage"
        )
    if per_chunk < 1:
        raise ValueError(
            f"--num-layers-per-virtual-pipeline-stage must be a positive integer, got {per_chunk}"
        )
    layers = _split_layers(args)
    if layers % pp:
        raise ValueError(
            f"--num-layers {args.num_layers}{_counted_extras(args)} must be divisible by "
            f"--pipeline-model-parallel-size {pp}"
        )
    if (layers // pp) % per_chunk:
        raise ValueError(
            f"--num-layers-per-virtual-pipeline-stage {per_chunk} must divide the {layers // pp} layers of "
            f"each pipeline stage (--num-layers {args.num_layers} / --pipeline-model-parallel-size {pp})"
        )
    return layers // pp // per_chunk


def _check_uneven_stages(args: argparse.Namespace) -> None:
    """megatron-core's rule for uneven first and last stages (`TransformerConfig.__post_init__`): the
    layers left between them split evenly over the middle stages, and every count over the chunks."""
    if args.num_layers is None:
        raise ValueError("--decoder-first/last-pipeline-num-layers need --num-layers")
    vpp = args.virtual_pipeline_model_parallel_size or 1
    middle_layers, middle_stages = args.num_layers, args.pipeline_model_parallel_size
    for flag, layers in (
        ("--decoder-first-pipeline-num-layers", args.decoder_first_pipeline_num_layers),
        ("--decoder-last-pipeline-num-layers", args.decoder_last_pipeline_num_layers),
    ):
        if layers is None:
            continue
        if layers <= 0 or layers % vpp:
            raise ValueError(
                f"{flag} {layers} must be a positive multiple of the {vpp} model chunks per stage"
            )
        middle_layers -= layers
        middle_stages -= 1
    per_middle_stage = middle_layers // middle_stages if middle_stages > 0 else 0
    if (
        middle_stages < 0
        or middle_layers < 0
        or bool(middle_layers) != bool(middle_stages)
        or (middle_stages and (middle_layers % middle_stages or per_middle_stage % vpp))
    ):
        raise ValueError(
            f"--num-layers {args.num_layers} minus --decoder-first/last-pipeline-num-layers leaves "
            f"{middle_layers} layers for {middle_stages} middle stages of --pipeline-model-parallel-size "
            f"{args.pipeline_model_parallel_size}; they must split evenly (into whole model chunks)"
        )


def _check_interleaving(args: argparse.Namespace) -> None:
    """Megatron-LM's rule for the interleaved schedule; without it, no p2p overlap."""
    pp, vpp = args.pipeline_model_parallel_size, args.virtual_pipeline_model_parallel_size
    if vpp is None:
        args.overlap_p2p_comm = False
        return
    if pp < 2:
        given = (
            f"--num-layers-per-virtual-pipeline-stage {args.num_layers_per_virtual_pipeline_stage}"
            if args.num_layers_per_virtual_pipeline_stage is not None
            else f"--num-virtual-stages-per-pipeline-rank {vpp}"
        )
        raise ValueError(
            f"{given} ({vpp} model chunks per rank: the interleaved pipeline) needs "
            f"--pipeline-model-parallel-size > 1, got {pp}"
        )
    if pp < 3 and not args.overlap_p2p_comm:
        raise ValueError(
            "the interleaved schedule with --no-overlap-p2p-communication needs "
            f"--pipeline-model-parallel-size > 2, got {pp}"
        )


def layers_per_stage(args: argparse.Namespace) -> tuple[int, ...] | None:
    """Transformer layers of each pipeline stage under the derived split."""
    if args.num_layers is None:
        return None
    pp = args.pipeline_model_parallel_size
    first, last = args.decoder_first_pipeline_num_layers, args.decoder_last_pipeline_num_layers
    if first is not None or last is not None:
        ends = [n for n in (first, last) if n is not None]
        middle_stages = pp - len(ends)
        middle = (args.num_layers - sum(ends)) // middle_stages if middle_stages else 0
        stages = [middle] * pp
        if first is not None:
            stages[0] = first
        if last is not None:
            stages[-1] = last
        return tuple(stages)
    per_stage = _split_layers(args) // pp
    stages = [per_stage] * pp
    stages[0] -= args.account_for_embedding_in_pipeline_split
    stages[-1] -= args.account_for_loss_in_pipeline_split
    return tuple(stages)
