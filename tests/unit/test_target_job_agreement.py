"""One target job for every reader: the report (through the emulation's run plan) and the memory plan
read each shipped production configuration into the same `TargetJob`, and so give the same padded
vocabulary, model FLOPs and parameter count. No process starts."""

from __future__ import annotations

import pathlib

import pytest

from prism_megatron.emulation import outputs, plan_run
from prism_megatron.megatron.job.configs import read_config
from prism_megatron.megatron.job.job import job_from_flags
from prism_megatron.megatron.plan import theory
from prism_megatron.report import model_flops_per_iteration

CONFIGS = sorted((pathlib.Path(__file__).resolve().parents[2] / "launch" / "configs").glob("*.args"))


def test_every_shipped_configuration_is_in_the_table():
    assert len(CONFIGS) == 17


@pytest.mark.parametrize("path", CONFIGS, ids=[p.stem for p in CONFIGS])
def test_the_report_and_the_plan_read_one_job(path, tmp_path):
    argv = read_config(path)
    planned = job_from_flags(argv)  # `prism-megatron plan`'s reading
    run = plan_run([*argv, "--prism-emulate", "--prism-out", str(tmp_path / "run")])  # `emulate`'s
    assert run.job == planned.target

    model = run.job.model
    assert model.padded_vocab_size == planned.args.padded_vocab_size  # after Megatron-LM's padding
    assert model.padded_vocab_size % (128 * run.job.sizes.tp) == 0

    flops = outputs.model_flops(run)  # what report.json's model_flops_per_iteration holds
    assert flops is not None and flops > 0
    assert flops == model_flops_per_iteration(planned.target.model, planned.args.global_batch_size)

    block, mtp, embedding, _ = theory._parameter_counts(planned)  # Megatron's estimate, restated
    expected = block + mtp + embedding * (2 if planned.args.untie_embeddings_and_output_weights else 1)
    if planned.args.multi_latent_attention:  # the pure count has no MLA projections: the plan adds them
        assert run.job.model.parameter_counts(norms_per_layer=2)[2] == embedding
        return
    norms = 2 if planned.args.normalization == "RMSNorm" else 4
    counted = model.num_parameters(untie_embeddings=run.job.sizes.untie_embeddings, norms_per_layer=norms)
    assert counted == int(expected)
