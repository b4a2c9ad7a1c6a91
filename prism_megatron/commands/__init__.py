"""The `prism-megatron` subcommands, one module each (`cli.py` dispatches to them)."""


class CommandLineError(Exception):
    """A user mistake on the command line; its message names the flag and what would be valid."""
