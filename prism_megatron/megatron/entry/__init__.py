"""The built-in megatron-core training entry (`prism_megatron.launch builtin`).

`MOCK_VOCAB_SIZE` is here, not in `arguments.py`, so that the run plan reads the entry's default
without importing megatron-core (a user mistake is reported before that import's seconds).
"""

MOCK_VOCAB_SIZE = 32000
"""The mock data's vocabulary before padding when --vocab-size is not given (Megatron-LM needs a
tokenizer there; the entry has only mock data)."""
