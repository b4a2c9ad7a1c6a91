"""Megatron-LM's flags, and the configuration files that hold them, read into the target job."""
