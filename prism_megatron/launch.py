"""The entry every real process runs: `python -m prism_megatron.launch SCRIPT [ARGS...]`.

Run it under torchrun or srun, one process per real rank (`prism-megatron emulate` spawns it through
torch's own launcher). SCRIPT is either `builtin` (the megatron-core GPT entry shipped with the
package) or the path of a Megatron-LM training script such as `$MEGATRON_LM_DIR/pretrain_gpt.py`,
which then runs unmodified. ARGS are the script's Megatron flags plus `--prism-*`.

Under srun without torchrun, the SLURM task variables stand in for torchrun's (RANK, WORLD_SIZE,
LOCAL_RANK); MASTER_ADDR and MASTER_PORT must be set by the job script.

Which pass the processes run is `--prism-phase` (see `prism_megatron.passes.rank`): `capture`
records the ops of the ranks `--prism-ranks` selects into `--prism-out`; `emulate` replays every
virtual peer from `--prism-graph` (a graph folder, or a folder of capture files that each process
builds into the same graph) with the closed loop; without either, virtual peers answer at once.
`prism-megatron emulate` runs them in order on one machine; across machines, launch each pass
yourself with a run folder every node sees (`prism_megatron.emulation` says how).
"""

from __future__ import annotations

import contextlib
import gc
import os
import sys
from collections.abc import Iterator

from prism_megatron.commands import CommandLineError
from prism_megatron.config import parse_prism_flags
from prism_megatron.emulation.preflight import BUILTIN

USAGE = "usage: python -m prism_megatron.launch {builtin | SCRIPT.py} [megatron and --prism-* flags]"
_SLURM_TO_TORCHRUN = {"RANK": "SLURM_PROCID", "WORLD_SIZE": "SLURM_NTASKS", "LOCAL_RANK": "SLURM_LOCALID"}


def adopt_slurm_environment(environ: dict[str, str]) -> None:
    """Fill RANK, WORLD_SIZE, LOCAL_RANK from SLURM's task variables when torchrun did not set them."""
    if "RANK" in environ or "SLURM_PROCID" not in environ:
        return
    for torchrun_name, slurm_name in _SLURM_TO_TORCHRUN.items():
        if slurm_name in environ:
            environ[torchrun_name] = environ[slurm_name]


@contextlib.contextmanager
def imports_frozen() -> Iterator[None]:
    """Import the training entry (torch, megatron-core: millions of objects that live as long as the
    process) without the cyclic garbage collector, and freeze what is there after: each full
    collection walks every tracked object, six ran inside these imports (about 0.7 s of a modelled
    405B rank's 15 CPU seconds) and each later one walked them all again. Imports leave little
    cyclic garbage (hundreds of objects), which a frozen heap keeps."""
    gc.disable()
    try:
        yield
    finally:
        gc.freeze()
        gc.enable()


def run_megatron_lm(script_path: str, script_args: list[str]) -> int:
    """Run a Megatron-LM script as a prism real rank and write this rank's results."""
    if not os.path.isfile(script_path):
        raise CommandLineError(
            f"SCRIPT {script_path!r} is not a file; pass 'builtin' or a Megatron-LM training script"
        )
    with imports_frozen():
        from prism_megatron.emulation.preflight import check_script
        from prism_megatron.megatron.run import results, runtime, script
        from prism_megatron.patches import catalog

    check_script(script_path, "SCRIPT")  # its checkout must give megatron.training, before any set-up
    config = parse_prism_flags(script_args)
    if config.patches.list_patches:
        print(catalog.table())
        return 0
    rt = runtime.Runtime.start(config)
    try:
        record = script.run_script(script_path, script_args, rt)
        memory_report = record.finish()
        if record.model is not None:
            out = results.collect_megatron_lm(rt=rt, record=record, memory_report=memory_report)
            rt.finish_phase(out)
            results.write(rt.config, rt.virtual_rank, out)
    finally:
        rt.close()
    return 0


def main(argv: list[str] | None = None) -> int:
    argv = list(sys.argv[1:] if argv is None else argv)
    if not argv or argv[0] in ("-h", "--help"):
        print(USAGE, file=sys.stderr)
        return 0 if argv else 2
    adopt_slurm_environment(os.environ)
    script, script_args = argv[0], argv[1:]
    try:
        if script == BUILTIN:
            with imports_frozen():
                from prism_megatron.megatron.entry import pretrain

            return pretrain.main(script_args)
        return run_megatron_lm(script, script_args)
    except (CommandLineError, ValueError) as exc:
        if os.environ.get("PRISM_DEBUG") == "1":
            raise
        print(f"prism_megatron.launch: error: {exc}", file=sys.stderr)
        return 2


if __name__ == "__main__":
    sys.exit(main())
