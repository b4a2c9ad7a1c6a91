"""Megatron-LM hooks (placeholder until step 6)."""


def megatron_lm_records() -> tuple:
    return ()
