"""Per-rank results of a training run: what the report and the tests read.

One JSON file per real rank, `<--prism-out>/rank-<virtual rank>.json`, written atomically. It holds
the iterations (loss where this rank computes it, grad norm, time), peak memory by category, the
sizes of the DDP gradient buffers and the distributed-optimizer shard (the full-scale memory a rank
of the target job allocates), the patches used, pipeline p2p counts, and versions and machine.
"""

from __future__ import annotations

import importlib.metadata
import os
import platform
from typing import Any

import torch
from megatron.core import parallel_state

import prism_megatron
from prism_megatron import files
from prism_megatron.config import PrismConfig
from prism_megatron.passes import memory

RESULTS_SCHEMA_VERSION = 1


def environment() -> dict[str, Any]:
    """Versions and machine, as every results file and benchmark records them."""
    return {
        "python": platform.python_version(),
        "torch": torch.__version__,
        "megatron_core": importlib.metadata.version("megatron-core"),
        "prism_megatron": prism_megatron.__version__,
        "platform": platform.platform(),
        "cpu_count": os.cpu_count(),
    }


def role() -> dict[str, int]:
    """This rank's coordinates in the target job, from Megatron's own getters."""
    ps = parallel_state
    return {
        "tp_rank": ps.get_tensor_model_parallel_rank(),
        "tp_size": ps.get_tensor_model_parallel_world_size(),
        "pp_rank": ps.get_pipeline_model_parallel_rank(),
        "pp_size": ps.get_pipeline_model_parallel_world_size(),
        "dp_rank": ps.get_data_parallel_rank(),
        "dp_size": ps.get_data_parallel_world_size(),
        "dp_cp_size": ps.get_data_parallel_world_size(with_context_parallel=True),
        "ep_rank": ps.get_expert_model_parallel_rank(),
        "ep_size": ps.get_expert_model_parallel_world_size(),
        "expert_dp_size": ps.get_expert_data_parallel_world_size(),
    }


def grad_buffers(ddp_model: list) -> list[dict[str, Any]]:
    """Every DDP buffer of every chunk: allocated and unpadded element counts, dtype, bucket count."""
    rows = []
    for chunk_index, chunk in enumerate(ddp_model):
        for kind, buffers in (("dense", chunk.buffers), ("expert", chunk.expert_parallel_buffers)):
            for buffer in buffers:
                rows.append(
                    {
                        "chunk": chunk_index,
                        "kind": kind,
                        "grad_dtype": str(buffer.grad_dtype),
                        "numel": buffer.numel,
                        "numel_unpadded": buffer.numel_unpadded,
                        "grad_bytes": buffer.grad_data.numel() * buffer.grad_data.element_size(),
                        "num_buckets": len(buffer.buckets),
                    }
                )
    return rows


def optimizer_shard_numel(optimizer: Any) -> int:
    """Elements of the parameters the torch optimizer(s) update on this rank (its shard with DistOpt)."""
    return sum(
        p.numel()
        for inner in memory._inner_optimizers(optimizer)
        for group in inner.param_groups
        for p in group["params"]
    )


def collect(*, rt, ddp_model, optimizer, iterations, memory_report) -> dict[str, Any]:
    """This rank's results after training (`memory_report` None when nothing measured memory)."""
    world = rt.world
    return {
        "schema_version": RESULTS_SCHEMA_VERSION,
        "virtual_rank": rt.virtual_rank,
        "physical_rank": world.physical_rank if world else rt.virtual_rank,
        "world_size": torch.distributed.get_world_size(),
        "real_ranks": list(world.real_ranks) if world else None,
        "backend": world.backend if world else torch.distributed.get_backend(),
        "device": rt.device,
        "cpu_share": rt.cpu.as_dict() if rt.cpu is not None else None,
        "role": role(),
        "iterations": iterations,
        "memory": memory_report.as_dict() if memory_report is not None else None,
        "num_parameters": sum(p.numel() for chunk in ddp_model for p in chunk.module.parameters()),
        "num_parameter_tensors": sum(1 for chunk in ddp_model for _ in chunk.module.parameters()),
        "grad_buffers": grad_buffers(ddp_model),
        "optimizer_shard_numel": optimizer_shard_numel(optimizer),
        "patches_used": rt.patch_calls(),
        "p2p": dict(getattr(rt.p2p_class, "counts", {})),
        "p2p_real_checksums": dict(getattr(rt.p2p_class, "checksums", {})),
        "num_groups_created": len(rt.group_log.records),
        "num_groups_member": len(rt.group_log.member_groups()),
        "environment": environment(),
    }


def collect_megatron_lm(*, rt, record, memory_report) -> dict[str, Any]:
    """Results of a Megatron-LM script run, from what the train_step hook recorded."""
    model = [chunk for chunk in record.model if hasattr(chunk, "buffers")]
    out = collect(
        rt=rt,
        ddp_model=model,
        optimizer=record.optimizer,
        iterations=record.iterations,
        memory_report=memory_report,
    )
    if record.modelled is not None:
        out["modelled_device"] = record.modelled.summary()
    return out


def path_for(config: PrismConfig, virtual_rank: int) -> str:
    return files.results_path(config.output.out, virtual_rank)


def check_writable(config: PrismConfig, virtual_rank: int) -> None:
    """Refuse before training to overwrite an earlier result unless --prism-overwrite."""
    path = path_for(config, virtual_rank)
    if os.path.exists(path) and not config.output.overwrite:
        raise ValueError(
            f"--prism-out {config.output.out} already holds {os.path.basename(path)}; pass --prism-overwrite or another --prism-out"
        )


def write(config: PrismConfig, virtual_rank: int, out: dict[str, Any]) -> str:
    """Write atomically and return the path."""
    return files.write_json(out, path_for(config, virtual_rank), indent=1, default=str)
