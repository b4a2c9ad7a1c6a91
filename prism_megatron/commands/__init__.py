"""Subcommands of `prism-megatron`, one module each (see prism_megatron/cli.py)."""
