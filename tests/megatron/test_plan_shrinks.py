"""The plan of a configuration's 2- and 8-rank shrinks equals what a real CPU run of them allocates.

For every shipped configuration, the shrink (megatron/plan/shrink.py: same structure, tiny sizes) is planned on
the meta device in a fake world, rank by rank, and also run for real: 2 or 8 processes over gloo each
build their rank's megatron-core model, DDP wrapper and Megatron optimizer on the CPU (with the CPU
device shims) and take one optimizer step, which materialises the optimizer state. The real run's
bytes are then counted from what it holds, storage by storage:
* parameters: the DDP parameter buffers (distributed optimizer) or the model's parameters;
* gradients: the DDP gradient buffers;
* optimizer main parameters, fp32 gradient copies and moments: the tensors the inner torch optimizer
  holds (its parameters, their `.grad`, its state except the `step` counters), less anything that
  is a view of the buffers above.
Each must equal the plan's number exactly, on every rank.

What the real run does not do is a forward pass (the local layers cannot run sequence parallelism,
context parallelism or multi-latent attention on a CPU); memory for parameters, gradients and
optimizer state does not depend on it.
"""

from __future__ import annotations

import json
import os
import socket
from pathlib import Path

import pytest
import torch
import torch.multiprocessing as mp

from prism_megatron.megatron.job.configs import read_config
from prism_megatron.megatron.job.job import job_from_flags
from prism_megatron.megatron.plan.rank_plan import plan_ranks
from prism_megatron.megatron.plan.shrink import shrink

CONFIGS = sorted(Path(__file__).resolve().parents[2].joinpath("launch", "configs").glob("*.args"))
CATEGORIES = (
    "parameters",
    "gradients",
    "optimizer_main_params",
    "optimizer_grad_copies",
    "optimizer_moments",
)


def _free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _storage_bytes(tensors, exclude: set[int]) -> tuple[int, set[int]]:
    """Bytes of the distinct storages behind `tensors`, skipping storages in `exclude`."""
    seen: dict[int, int] = {}
    for tensor in tensors:
        storage = tensor.untyped_storage()
        if storage.data_ptr() not in exclude:
            seen[storage.data_ptr()] = storage.nbytes()
    return sum(seen.values()), set(seen)


def measure(ddp_chunks, optimizer, distributed_optimizer: bool) -> dict[str, int]:
    """What a real rank holds, by the plan's categories (see the module docstring)."""
    buffers = [b for ddp in ddp_chunks for b in (*ddp.buffers, *ddp.expert_parallel_buffers)]
    if distributed_optimizer:
        param_tensors = [b.param_data for b in buffers]
    else:
        param_tensors = [p for ddp in ddp_chunks for p in ddp.module.parameters()]
    param_bytes, param_ptrs = _storage_bytes(param_tensors, set())
    grad_bytes, grad_ptrs = _storage_bytes([b.grad_data for b in buffers], set())
    inner = getattr(optimizer, "chained_optimizers", [optimizer])
    torch_params = [p for opt in inner for group in opt.optimizer.param_groups for p in group["params"]]
    moments = [
        value
        for opt in inner
        for state in opt.optimizer.state.values()
        for key, value in state.items()
        if key != "step" and torch.is_tensor(value)
    ]
    main_bytes, _ = _storage_bytes(torch_params, param_ptrs)
    copies_bytes, _ = _storage_bytes(
        [p.grad for p in torch_params if p.grad is not None], grad_ptrs | param_ptrs
    )
    moment_bytes, _ = _storage_bytes(moments, set())
    return {
        "parameters": param_bytes,
        "gradients": grad_bytes,
        "optimizer_main_params": main_bytes,
        "optimizer_grad_copies": copies_bytes,
        "optimizer_moments": moment_bytes,
        "num_params": sum(p.numel() for ddp in ddp_chunks for p in ddp.module.parameters()),
    }


def _run_case(argv: list[str]) -> dict[str, int]:
    """Build, wrap and step one rank of a shrink inside the current gloo world."""
    import torch.distributed as dist
    from megatron.core import parallel_state
    from megatron.core.optimizer import OptimizerConfig, get_megatron_optimizer

    from prism_megatron.megatron.job.job import transformer_config
    from prism_megatron.megatron.plan import build as plan_build

    job = job_from_flags(argv)
    a = job.args
    before = set(dist.distributed_c10d._world.pg_map)
    plan_build.initialize_groups(job)
    try:
        config = plan_build.build_config(transformer_config(job))
        chunks = plan_build.build_model_chunks(job, config, "cpu")
        ddp = plan_build.wrap_in_ddp(job, config, chunks, "cpu")
        optimizer_config = OptimizerConfig(
            optimizer=a.optimizer, lr=1e-4, bf16=a.bf16, fp16=a.fp16, params_dtype=a.params_dtype,
            use_distributed_optimizer=a.use_distributed_optimizer, clip_grad=1.0,
        )  # fmt: skip
        optimizer = get_megatron_optimizer(optimizer_config, ddp, use_gloo_process_groups=False)
        for chunk in ddp:
            chunk.zero_grad_buffer()
        optimizer.step()
        return measure(ddp, optimizer, a.use_distributed_optimizer)
    finally:
        parallel_state.destroy_model_parallel()
        # megatron-core forgets its groups but does not destroy them: every gloo group keeps its
        # threads, and 17 cases of dozens of groups on 8 ranks left thousands spinning.
        for group in set(dist.distributed_c10d._world.pg_map) - before:
            dist.destroy_process_group(group)


def _worker(rank: int, world_size: int, port: int, cases: dict[str, list[str]], out_dir: str) -> None:
    import torch.distributed as dist

    from prism_megatron.patches import cpu_shim, registry

    torch.set_num_threads(1)
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=rank, world_size=world_size)
    results = {}
    try:
        with registry.patched(cpu_shim.MEGATRON_CORE_SHIMS):
            for name, argv in cases.items():
                results[name] = _run_case(argv)
    finally:
        dist.destroy_process_group()
    Path(out_dir, f"rank-{rank}.json").write_text(json.dumps(results), encoding="utf-8")


def real_runs(cases: dict[str, list[str]], world_size: int, out_dir: Path) -> list[dict]:
    """Every case run for real by `world_size` gloo processes; per rank, per case, the measured bytes."""
    os.environ.setdefault("OMP_NUM_THREADS", "1")
    mp.start_processes(
        _worker, args=(world_size, _free_port(), cases, str(out_dir)), nprocs=world_size, start_method="spawn"
    )
    return [json.loads(Path(out_dir, f"rank-{r}.json").read_text()) for r in range(world_size)]


def shrinks(world_size: int) -> dict[str, list[str]]:
    return {path.stem: shrink(read_config(path), world_size) for path in CONFIGS}


@pytest.mark.parametrize("world_size", [2, pytest.param(8, marks=pytest.mark.slow)])
def test_plan_of_every_shrink_equals_what_the_real_cpu_run_allocates(world_size, tmp_path):
    cases = shrinks(world_size)
    measured = real_runs(cases, world_size, tmp_path)
    mismatches, padded, uneven_shards = [], 0, 0
    for name, argv in cases.items():
        plans = plan_ranks(job_from_flags(argv), list(range(world_size)))
        padded += any(b.numel_padded > b.num_params for p in plans for b in p.buffers)
        uneven_shards += len({p.optimizer_moments.bytes for p in plans if p.coords["pp"] == 0}) > 1
        for plan in plans:
            real = measured[plan.virtual_rank][name]
            planned = {c: getattr(plan, c).bytes for c in CATEGORIES} | {"num_params": plan.num_params}
            if planned != real:
                mismatches.append(f"{name} rank {plan.virtual_rank}: plan {planned} != real {real}")
    assert not mismatches, "\n".join(mismatches)
    # The comparison covers Megatron's padding, and, where DP > 1, shards that differ between ranks.
    assert padded > 0
    assert uneven_shards > 0 or world_size == 2


def test_shrinks_keep_each_configurations_parallelisms_and_features():
    for path in CONFIGS:
        full = job_from_flags(read_config(path)).args
        small = job_from_flags(shrink(read_config(path), 8)).args
        assert small.world_size == 8 and small.hidden_size == 64, path.stem
        for size in ("tensor_model_parallel_size", "pipeline_model_parallel_size", "context_parallel_size"):
            assert (getattr(small, size) > 1) == (getattr(full, size) > 1), (path.stem, size)
        assert (small.expert_model_parallel_size > 1) == (full.expert_model_parallel_size > 1), path.stem
        for feature in (
            "virtual_pipeline_model_parallel_size", "decoder_first_pipeline_num_layers", "num_experts",
            "moe_shared_expert_intermediate_size", "mtp_num_layers",
        ):  # fmt: skip
            assert (getattr(small, feature) is None) == (getattr(full, feature) is None), (path.stem, feature)
        for same in ("use_distributed_optimizer", "bf16", "fp16", "swiglu", "group_query_attention",
                     "multi_latent_attention", "untie_embeddings_and_output_weights", "overlap_grad_reduce",
                     "recompute_granularity", "normalization", "add_bias_linear"):  # fmt: skip
            assert getattr(small, same) == getattr(full, same), (path.stem, same)
