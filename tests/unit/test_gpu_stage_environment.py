"""A GPU stage's child processes choose their attention backend by flag, whatever the parent built.

megatron-core's model build writes NVTE_FLASH_ATTN / NVTE_FUSED_ATTN / NVTE_UNFUSED_ATTN into its
process's environment and refuses a later build whose backend disagrees; a test process that built
a model with the default backend made `main_claim`'s `prism-megatron plan --attention-backend
unfused` child fail in the whole suite's dry run."""

from __future__ import annotations

from benchmarks.gpu.memory_ground_truth import ATTENTION_BACKEND_VARIABLES, child_environment


def test_children_do_not_inherit_the_attention_backend_variables(monkeypatch):
    for name in ATTENTION_BACKEND_VARIABLES:
        monkeypatch.setenv(name, "1")
    # A Transformer Engine setting of the user's, not megatron-core's record of a build: kept.
    monkeypatch.setenv("NVTE_BATCH_MHA_P2P_COMM", "1")
    env = child_environment({"RANK": "0"})
    assert not set(ATTENTION_BACKEND_VARIABLES) & set(env)
    assert env["NVTE_BATCH_MHA_P2P_COMM"] == "1" and env["RANK"] == "0"
