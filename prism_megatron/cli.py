"""The `prism-megatron` command: a thin dispatcher over `prism_megatron.commands`.

Each module in `prism_megatron/commands/` is one subcommand. It defines `NAME`, `HELP`,
`add_arguments(parser)` and `run(args) -> int`; the logic it needs lives in the library packages.
Subcommands are imported only when chosen, so `prism-megatron topology` never imports Megatron.

User mistakes exit with status 2 and one line naming the flag (see `CommandLineError`). Nothing
else reaches a user as a traceback either: any other error is one line and exit status 1, Ctrl-C
exit status 130; `PRISM_DEBUG=1` keeps the traceback (this is the one place that decides).
"""

from __future__ import annotations

import argparse
import importlib
import importlib.util
import os
import pkgutil
import sys
import warnings

from prism_megatron import __version__, commands
from prism_megatron.commands import CommandLineError


class OneLineParser(argparse.ArgumentParser):
    """An argparse parser whose errors are one line on stderr and exit status 2."""

    def error(self, message: str) -> None:  # argparse's hook; never returns
        self.exit(2, f"{self.prog}: error: {message}\n")


def _subcommand_modules() -> dict[str, str]:
    return {info.name: f"{commands.__name__}.{info.name}" for info in pkgutil.iter_modules(commands.__path__)}


def build_parser(argv: list[str]) -> tuple[OneLineParser, object | None]:
    """Return the parser and the chosen subcommand's module (None when none was chosen)."""
    parser = OneLineParser(
        prog="prism-megatron",
        description="Emulate a production-scale Megatron-LM job on a few devices.",
    )
    parser.add_argument("--version", action="version", version=f"prism-megatron {__version__}")
    subparsers = parser.add_subparsers(dest="command", metavar="COMMAND", parser_class=OneLineParser)
    modules = _subcommand_modules()
    chosen = next((a for a in argv if not a.startswith("-")), None)
    chosen_module = None
    for name in sorted(modules):
        if name == chosen:
            chosen_module = importlib.import_module(modules[name])
            sub = subparsers.add_parser(chosen_module.NAME, help=chosen_module.HELP)
            chosen_module.add_arguments(sub)
        else:
            # Help text without importing the module (some import torch or Megatron).
            subparsers.add_parser(name.replace("_", "-"), help=_first_doc_line(modules[name]))
    return parser, chosen_module


def _first_doc_line(module_name: str) -> str:
    spec = importlib.util.find_spec(module_name)
    if spec is None or spec.origin is None:
        return ""
    with open(spec.origin, encoding="utf-8") as f:
        for line in f:
            line = line.strip().strip('"').strip()
            if line:
                return line
    return ""


FALLBACK_NOTICES = r"(Apex|Transformer Engine)\b.* not installed"
"""megatron-core's notices, at import on a machine without apex or Transformer Engine, that it falls
back to torch's own layers: a CPU run wants exactly those, and eight such lines before a command's
one-line answer hide it, so the command does not print them (PRISM_DEBUG=1 does)."""


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    debug = os.environ.get("PRISM_DEBUG") == "1"
    if not debug:
        warnings.filterwarnings("ignore", message=FALLBACK_NOTICES, category=UserWarning)
    parser, module = build_parser(argv)
    args = parser.parse_args(argv)
    if module is None:
        parser.print_help()
        return 2
    try:
        return int(module.run(args) or 0)
    except BrokenPipeError:
        # `prism-megatron ... | head`: the reader left; not an error of ours.
        sys.stderr.close()
        return 0
    except (CommandLineError, ValueError) as exc:
        # ValueError is what config and topology validation raise for user input.
        if debug:
            raise
        print(f"prism-megatron {args.command}: error: {exc}", file=sys.stderr)
        return 2
    except KeyboardInterrupt:
        if debug:
            raise
        print(f"prism-megatron {args.command}: interrupted", file=sys.stderr)
        return 130
    except Exception as exc:  # a fault of ours or of the system: one line, the traceback on request
        if debug:
            raise
        print(
            f"prism-megatron {args.command}: error: {type(exc).__name__}: {_one_line(exc)} "
            "(PRISM_DEBUG=1 shows the traceback)",
            file=sys.stderr,
        )
        return 1


def _one_line(exc: BaseException) -> str:
    """The message on one line (a multi-line message keeps its first line and says how many more)."""
    lines = str(exc).strip().splitlines() or [type(exc).__name__]
    more = f" (+{len(lines) - 1} more lines; PRISM_DEBUG=1 shows them)" if len(lines) > 1 else ""
    return lines[0] + more


if __name__ == "__main__":
    sys.exit(main())
