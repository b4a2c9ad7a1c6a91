"""A case's passes, planned and launched by the product's own code; only the process start is ours.

The suite must measure what users run, so nothing here decides how a pass works:

* the plan is `prism-megatron emulate`'s (`emulation.plan.plan_run`) for the case's job: Megatron's
  flags of its parallel sizes (and the GPT's model flags) plus --prism-emulate, --prism-world-size,
  --prism-ranks, --prism-device cpu, --prism-straggler, --prism-cluster (a file of the calibrated
  costs, `network.measured`) and --prism-out;
* the launches are the driver's (`driver.capture_launches`, `driver.emulate_launch`) and each
  process's command line is what `launches.command` hands `python -m prism_megatron.launch`; the
  all-real run's is `commands.emulate.launcher_command`'s (a plain run, no virtual world);
* the graph is built from the capture files as --prism-graph builds it from a folder of them
  (`closed_loop.load_or_build_graph`), saved as the run's graph/, and simulated by the driver's
  `simulate` (which also writes the replay schedules);
* a process is forked from the suite with torchrun's environment instead of being started by
  torchrun (torch and megatron-core are imported once; 16 processes start in a second on two cores)
  and runs that command line (`workload.run`).

Capture passes run one after the other, one process each (`--nproc-per-node 1`, the default for one
real rank), as `prism-megatron emulate` runs them. One thing differs from torchrun's start: a
captured or emulated process gets the LOCAL_RANK its virtual rank has in the all-real run (all W on
this machine), so that its share of the machine (`--prism-cpu-threads-per-rank`: cores chosen by
local rank) is the same cores in every pass. On a quiet machine the cores are alike; on a loaded one
they are not, and a rank moved to another core would measure the other core's load.
"""

from __future__ import annotations

import io
import os

from benchmarks.fidelity import workload
from benchmarks.fidelity.processes import run_processes

LAUNCH_MODULE = "prism_megatron.launch"


def job_flags(job: workload.Job) -> list[str]:
    """Megatron's flags of the job: the GPT's model flags, or the sleep model's shape (what the plan
    reads: parallel sizes, layers, micro-batches)."""
    flags = ["--tensor-model-parallel-size", str(job.tp), "--pipeline-model-parallel-size", str(job.pp)]
    if job.vpp:
        flags += ["--virtual-pipeline-model-parallel-size", str(job.vpp)]
    if job.gpt_flags:
        return [*job.gpt_flags, *flags]
    if job.vpp:
        # The sleep model's config keeps megatron-core's batched, not overlapped, p2p (`sleep_model`);
        # Megatron-LM overlaps it under the interleaved schedule unless told so, and the roles'
        # classes follow the flags.
        flags.append("--no-overlap-p2p-communication")
    return [
        *flags,
        "--num-layers",
        str(job.num_layers),
        "--micro-batch-size",
        "1",
        "--global-batch-size",
        str(job.num_microbatches * job.dp),
    ]


def stragglers_flags(job: workload.Job) -> list[str]:
    if not job.stragglers:
        return []
    return ["--prism-straggler", ",".join(f"{rank}:{factor}" for rank, factor in job.stragglers)]


def plan(job: workload.Job, *, real_ranks, out_dir: str, cost_file: str, iterations: int, capture_iters: int):
    """The `prism-megatron emulate` plan of the job with `real_ranks` real (one process each)."""
    from prism_megatron.emulation.plan import plan_run

    args = [
        *job_flags(job),
        "--train-iters",
        str(iterations),
        "--prism-emulate",
        "--prism-world-size",
        str(job.world_size),
        "--prism-ranks",
        ",".join(map(str, real_ranks)),
        "--prism-device",
        "cpu",
        *stragglers_flags(job),
        "--prism-cluster",
        cost_file,
        "--prism-capture-iters",
        str(capture_iters),
        "--prism-out",
        out_dir,
        "--prism-overwrite",
    ]
    return plan_run(args, script="builtin")


def launch_argv(run_plan, launch) -> list[str]:
    """What the product's launch hands `python -m prism_megatron.launch` for this launch."""
    from prism_megatron.emulation.launches import command

    argv = command(launch, run_plan.script, run_plan.megatron_args, log_dir=run_plan.path("logs"))
    return argv[argv.index(LAUNCH_MODULE) + 1 :]


def real_argv(job: workload.Job, *, out_dir: str, iterations: int) -> list[str]:
    """The all-real run's command line: `prism-megatron emulate --nproc-per-node W -- FLAGS` without
    --prism-emulate launches the program unchanged on W processes."""
    from prism_megatron.commands.emulate import launcher_command

    flags = [
        *job_flags(job),
        "--train-iters",
        str(iterations),
        "--prism-device",
        "cpu",
        "--prism-out",
        out_dir,
        "--prism-overwrite",
    ]
    argv = launcher_command(job.world_size, "builtin", flags)
    return argv[argv.index(LAUNCH_MODULE) + 1 :]


def _requests(job, mode: str, argv: list[str], iterations: int, count: int, **extra) -> list:
    request = workload.Request(job=job, mode=mode, argv=tuple(argv), iterations=iterations, **extra)
    return [request] * count


def capture(run_plan, job: workload.Job, **extra):
    """The product's capture passes, then the graph they make (saved as the run's graph/)."""
    return capture_with_results(run_plan, job, **extra)[0]


def capture_with_results(run_plan, job: workload.Job, **extra) -> tuple:
    """`capture`, and every capture process's result (slice order)."""
    from prism_megatron import files
    from prism_megatron.emulation import driver
    from prism_megatron.graph import save_graph
    from prism_megatron.passes.closed_loop import load_or_build_graph

    results = []
    for launch in driver.prepare_capture(run_plan):
        argv = launch_argv(run_plan, launch)
        requests = _requests(
            job, "capture", argv, launch.num_iterations, len(launch.ranks), memory_iterations=0, **extra
        )
        results += run_processes(workload.run, requests, local_ranks=launch.ranks)
    graph = load_or_build_graph(run_plan.path(files.CAPTURE_DIR), run_plan.layout)
    save_graph(graph, run_plan.path(files.GRAPH_DIR))
    return graph, results


def simulate(run_plan, graph):
    """The driver's simulation of the whole job (over --prism-cluster; the straggler as a what-if);
    it also writes the replay schedules into the run folder."""
    from prism_megatron import files
    from prism_megatron.emulation import driver
    from prism_megatron.emulation.progress import Progress
    from prism_megatron.graph import save_graph

    if not os.path.isfile(run_plan.path(files.GRAPH_DIR, files.GRAPH_FILE)):
        save_graph(graph, run_plan.path(files.GRAPH_DIR))
    return driver.simulate(run_plan, graph, Progress(io.StringIO()), {})


def emulate(run_plan, job: workload.Job, iterations: int, **extra) -> list[dict]:
    """The product's emulation pass; one result per real rank, in --prism-ranks order."""
    from prism_megatron.emulation import driver

    launch = driver.emulate_launch(run_plan)
    argv = launch_argv(run_plan, launch)
    requests = _requests(job, "emulate", argv, iterations, len(launch.ranks), **extra)
    return run_processes(workload.run, requests, local_ranks=launch.ranks)


def real(job: workload.Job, out_dir: str, iterations: int, **extra) -> list[dict]:
    """The all-real run: W processes, results by rank."""
    argv = real_argv(job, out_dir=out_dir, iterations=iterations)
    return run_processes(workload.run, _requests(job, "real", argv, iterations, job.world_size, **extra))
