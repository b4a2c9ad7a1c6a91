"""The built-in GPT training entry: megatron-core only, mock data, Megatron-LM's flag names."""
