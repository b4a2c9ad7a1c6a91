"""Megatron-LM's training loop hooks: what changes when its own script (e.g. `pretrain_gpt.py`) runs
as a prism real rank (`prism_megatron.megatron.run.script` applies them). The hooks are records like
every patch, bound to the run through the protocol of `run.py`:

- arguments (arguments.py): `--prism-*` on Megatron-LM's parser; W and the virtual rank in
  `validate_args`; do_train/do_valid/do_test when rank 0 is virtual;
- `_initialize_distributed`: the virtual world (or a plain gloo world on the CPU), then Megatron's own
  `initialize_model_parallel`, then the p2p communicator and control-flow fixes;
- `train_step`: mark each iteration's start for the replay engine, and record its grad norm and loss;
- `get_batch_on_this_tp_rank`: plausible token batches when the TP source rank is virtual (in
  megatron.training.utils up to 0.16, reading the data iterator; in megatron.core.utils from 0.19,
  broadcasting a batch dict the script fetched);
- the last-rank duties (iteration line, TensorBoard and W&B writers) on the last real rank
  (last_rank.py);
- CPU only: `initialize_megatron(allow_no_cuda=True)`, no `_compile_dependencies` (fused kernels need
  nvcc), and a one-device torch.cuda face (`device_count`, `set_device`, an sm90 capability); the local
  layers' sequence- and context-parallel norm and attention (`local_layers`).
"""

from __future__ import annotations

import inspect
from typing import Any

import torch

from prism_megatron.patches import arguments, last_rank, local_layers
from prism_megatron.patches.registry import Patch, variants
from prism_megatron.patches.run import Run, StepRecord
from prism_megatron.patches.versions import EVERY_VERIFIED, MEGATRON_CORE_0_16, MEGATRON_CORE_0_19

_SM90 = (9, 0)


def _record(name: str, target: str, make, reason: str, **kw: Any) -> Patch:
    return Patch(name=name, target=target, make=make, verified_on=EVERY_VERIFIED, reason=reason, **kw)


def _initialize_distributed(original, *, run: Run):
    # 0.19 added skip_model_parallel_init (passed through untouched).
    def _initialize_distributed(get_embedding_ranks, get_position_embedding_ranks, store, *args, **kwargs):
        if not torch.distributed.is_initialized() and (run.device == "cpu" or run.config.emulation.emulate):
            run.bring_up()
        original(get_embedding_ranks, get_position_embedding_ranks, store, *args, **kwargs)
        run.before_model()

    return _initialize_distributed


def _train_step(original, *, training_record: StepRecord):
    def train_step(forward_step_func, data_iterator, model, optimizer, *args, **kwargs):
        training_record.before_step(model, optimizer)
        returned = original(forward_step_func, data_iterator, model, optimizer, *args, **kwargs)
        training_record.after_step(_step_of(returned))
        return returned

    return train_step


def _step_of(returned: tuple) -> dict[str, Any]:
    """Loss and grad norm from what Megatron-LM's `train_step` returns (loss dict first, grad norm sixth)."""
    loss_dict, grad_norm = returned[0], returned[5]
    loss = loss_dict.get("lm loss") if isinstance(loss_dict, dict) else None
    return {
        "loss": None if loss is None else float(loss),
        "grad_norm": None if grad_norm is None else float(grad_norm),
    }


def _plausible_batch(batch: dict, vocab_size: int, seed: int) -> None:
    """Token ids in the vocabulary, every token counted, a causal mask, positions 0..s-1."""
    generator = torch.Generator().manual_seed(seed)
    with torch.no_grad():
        for key in ("tokens", "labels"):
            if isinstance(batch.get(key), torch.Tensor):
                ids = torch.randint(0, vocab_size, batch[key].shape, generator=generator)
                batch[key].copy_(ids.to(batch[key].dtype))
        if isinstance(batch.get("loss_mask"), torch.Tensor):
            batch["loss_mask"].fill_(1)
        if isinstance(batch.get("attention_mask"), torch.Tensor):
            s = batch["attention_mask"].shape[-1]
            batch["attention_mask"].copy_(
                torch.triu(torch.ones(s, s, dtype=torch.bool), diagonal=1).expand_as(batch["attention_mask"])
            )
        if isinstance(batch.get("position_ids"), torch.Tensor):
            s = batch["position_ids"].shape[-1]
            batch["position_ids"].copy_(torch.arange(s).expand_as(batch["position_ids"]))


def _fill_if_source_is_virtual(rt: Run, batch: dict, source: int, tp_rank: int) -> None:
    if tp_rank != 0 and rt.world is not None and not rt.world.is_real(source):
        _plausible_batch(batch, arguments.megatron_lm_args().padded_vocab_size, seed=rt.virtual_rank)


def _tp_batch_from_iterator(original, *, run: Run):
    """Up to 0.16: `get_batch_on_this_tp_rank(data_iterator, mtp_on_this_rank)` reads and broadcasts."""

    def get_batch_on_this_tp_rank(data_iterator, mtp_on_this_rank: bool = False):
        from megatron.core import parallel_state

        batch = original(data_iterator, mtp_on_this_rank=mtp_on_this_rank)
        source = parallel_state.get_tensor_model_parallel_src_rank()
        _fill_if_source_is_virtual(run, batch, source, parallel_state.get_tensor_model_parallel_rank())
        return batch

    return get_batch_on_this_tp_rank


def _tp_batch_from_dict(original, *, run: Run):
    """From 0.19: the script fetches the batch on TP rank 0 and passes the dict, the source rank and
    this rank's TP rank (with a dozen layout flags) to `megatron.core.utils.get_batch_on_this_tp_rank`."""
    signature = inspect.signature(original)

    def get_batch_on_this_tp_rank(*args, **kwargs):
        batch = original(*args, **kwargs)
        bound = signature.bind(*args, **kwargs).arguments
        _fill_if_source_is_virtual(run, batch, bound["broadcast_src_rank"], bound["tp_rank"])
        return batch

    return get_batch_on_this_tp_rank


def _allow_no_cuda(original):
    def initialize_megatron(*args, **kwargs):
        kwargs["allow_no_cuda"] = True
        return original(*args, **kwargs)

    return initialize_megatron


def _fake_device_properties(original):
    class Properties:
        name, major, minor, total_memory, multi_processor_count = "prism-cpu", *_SM90, 80 * 2**30, 132

    return lambda device=None: Properties()


def _nothing(original):
    return lambda *args, **kwargs: None


def cpu_records() -> tuple[Patch, ...]:
    """Megatron-LM on the CPU: what its training code needs beyond megatron-core's shims."""
    return (
        _record(
            "megatron_lm.allow_no_cuda",
            "megatron.training.initialize:initialize_megatron",
            _allow_no_cuda,
            "initialize_megatron asserts CUDA unless allow_no_cuda; the CPU device shim stands in",
            importers=("megatron.training.training", "megatron.training"),
            signature=None,
        ),
        _record(
            "megatron_lm.skip_compile_dependencies",
            "megatron.training.initialize:_compile_dependencies",
            _nothing,
            "the legacy fused kernels need nvcc; the dataset helpers ship compiled",
            signature="()",
        ),
        *variants(
            name="megatron_lm.skip_jit_warmup",
            target="megatron.training.initialize:_warmup_jit_function",
            make=_nothing,
            reason="the warm-up runs the torch.compile'd fusions; inductor then asks the shimmed GPU for "
            "properties it cannot give (the run uses no fusion: pass --no-*-fusion)",
            by_release={
                MEGATRON_CORE_0_16: {"signature": "()"},
                MEGATRON_CORE_0_19: {"signature": "(tp_size=None)"},
            },
        ),
        _record(
            "cpu.device_count",
            "torch.cuda:device_count",
            lambda original: lambda: 1,
            "_initialize_distributed builds the model-parallel groups and seeds only when a device exists",
            signature="() -> int",
        ),
        _record(
            "cpu.set_device",
            "torch.cuda:set_device",
            lambda original: lambda device: None,
            "one CPU device; nothing to select",
            signature="(device: torch.device | str | int | None) -> None",
        ),
        _record(
            "cpu.device_capability",
            "torch.cuda:get_device_capability",
            lambda original: lambda device=None: _SM90,
            "validate_args reads the architecture (TP/CP > 1); an sm90 answer keeps the GPU code path",
            signature="(device: torch.device | str | int | None = None) -> tuple[int, int]",
        ),
        _record(
            "cpu.device_properties",
            "torch.cuda:get_device_properties",
            _fake_device_properties,
            "counterpart of cpu.device_capability",
            signature=None,
        ),
    )


_TRAIN_STEP_0_16 = (
    "(forward_step_func, data_iterator, model, optimizer, opt_param_scheduler, config, "
    "forward_backward_func, iteration=None)"
)
# 0.19 added a process-group collection and a communicator for cross-grid pipelines; Megatron-LM's
# pretrain passes neither (None), so the schedules still build the patched P2PCommunicator.
_TRAIN_STEP_0_19 = (
    "(forward_step_func, data_iterator, model, optimizer, opt_param_scheduler, config, "
    "forward_backward_func, iteration=None, pg_collection: Union[megatron.core.process_groups_config."
    "ProcessGroupCollection, megatron.core.process_groups_config.MultiModuleProcessGroupCollection, "
    "NoneType] = None, p2p_communicator: Optional[megatron.core.pipeline_parallel.p2p_communication."
    "P2PCommunicator] = None)"
)
_TP_BATCH_0_19 = (
    "(batch: dict[str, torch.Tensor], has_cu_seqlens: bool, is_hybrid_cp: bool, "
    "create_attention_mask_in_dataloader: bool, broadcast_src_rank: int, broadcast_group: "
    "torch.distributed.distributed_c10d.ProcessGroup, cp_size: int, tp_rank: int, micro_batch_size: int, "
    "seq_length: int, mtp_on_this_rank: bool, pipeline_model_parallel_size: int = 1, "
    "is_pipeline_first_stage: bool = False, is_pipeline_last_stage: bool = False)"
)


def emulation_records() -> tuple[Patch, ...]:
    """Megatron-LM hooks (both devices); a run binds them with itself (`run`, a `run.Run`) and its
    training record (`training_record`, a `run.StepRecord`)."""
    return (
        *arguments.ARGUMENT_RECORDS,
        *last_rank.writer_records(),
        *variants(
            name="megatron_lm.initialize_distributed",
            target="megatron.training.initialize:_initialize_distributed",
            make=_initialize_distributed,
            needs=("run",),
            reason="brings up the virtual world before Megatron builds its groups in it, and installs the "
            "p2p communicator and control-flow fixes before the model is built",
            by_release={
                MEGATRON_CORE_0_16: {
                    "signature": "(get_embedding_ranks, get_position_embedding_ranks, store)"
                },
                MEGATRON_CORE_0_19: {
                    "signature": "(get_embedding_ranks, get_position_embedding_ranks, store, "
                    "skip_model_parallel_init=False)"
                },
            },
        ),
        *variants(
            name="megatron_lm.train_step",
            target="megatron.training.training:train_step",
            make=_train_step,
            needs=("training_record",),
            reason="marks each iteration's start for the replay engine and records grad norm and loss",
            by_release={
                MEGATRON_CORE_0_16: {"signature": _TRAIN_STEP_0_16},
                MEGATRON_CORE_0_19: {"signature": _TRAIN_STEP_0_19},
            },
        ),
        *variants(
            name="megatron_lm.tp_batch_from_virtual_source",
            reason="TP ranks other than 0 receive the batch from TP rank 0; when it is virtual they get "
            "plausible tokens, so a rank that is not a data source trains",
            importers=("megatron.training.training",),
            needs=("run",),
            by_release={
                MEGATRON_CORE_0_16: {
                    "target": "megatron.training.utils:get_batch_on_this_tp_rank",
                    "make": _tp_batch_from_iterator,
                    "signature": "(data_iterator, mtp_on_this_rank: bool = False)",
                },
                # Moved into megatron-core; pretrain_gpt.py imports it by name when it runs, after
                # the patch, so only the training module binds the original.
                MEGATRON_CORE_0_19: {
                    "target": "megatron.core.utils:get_batch_on_this_tp_rank",
                    "make": _tp_batch_from_dict,
                    "signature": _TP_BATCH_0_19,
                },
            },
        ),
    )


def all_records() -> tuple[Patch, ...]:
    """Every Megatron-LM record (for the catalog)."""
    return (
        *emulation_records(),
        *cpu_records(),
        *local_layers.records(),
        local_layers.MODELLED_ATTENTION,
    )
