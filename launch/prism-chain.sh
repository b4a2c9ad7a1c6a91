#!/usr/bin/env bash
# One submission, the whole run on SLURM: capture, emulate and report as a chain of dependent jobs.
#   launch/prism-chain.sh CONFIG --out RUN [--ranks SPEC] [--nodes N] [--gpus-per-node G] [-- FLAGS...]
#
# Submits (from the repository root, RUN on a filesystem every node sees):
#   1. one capture job per batch of the slice (one rank per class of roles that run the same program,
#      written to RUN/capture/role-classes.json; G ranks per batch, one node each;
#      the batches are what `prism-megatron emulate --nproc-per-node G` would run), all at once:
#        PHASE=capture  launch/prism.sbatch CONFIG BATCH -- --prism-out RUN/capture FLAGS...
#   2. the emulation, after every capture job succeeded (--dependency=afterok:...), on N nodes:
#        PHASE=emulate  launch/prism.sbatch CONFIG SPEC -- --prism-graph RUN/capture --prism-out RUN FLAGS...
#   3. the report, after the emulation succeeded, one task (a bash script on sbatch's stdin):
#        prism-megatron emulate --report-only -- <CONFIG's flags> ... --prism-out RUN
# Paths and flags travel as arrays (sbatch's script arguments; %q in the report's script), so a path
# with spaces or a newline reaches every job whole. The job is checked first as `emulate` checks it.
# --ranks SPEC        the real ranks of the emulation (the --prism-ranks language); they must be N x G
#                     ranks (default: the slice, which then needs N x G = the number of roles)
# --nodes N           nodes of the emulation job (default 1)
# --gpus-per-node G   GPUs per node (default: $GPUS_PER_NODE, else 8)
# FLAGS after --      appended to every job's flags (e.g. -- --prism-cluster dgx-h100)
# Environment: SCRIPT (as for emulate.sh), PYTHON (default python3), SBATCH (default sbatch),
#              SBATCH_ARGS (word-split, given to every sbatch: --account, --partition ...),
#              DRY_RUN=1 prints the sbatch commands with made-up job ids instead of submitting.
# Prints the job ids; `scontrol show job ID` follows them. A failed job cancels nothing by itself:
# its dependants stay pending with reason DependencyNeverSatisfied (scancel them).
set -euo pipefail

usage() { sed -n '2,26p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

config="" out="" ranks="" nodes=1 gpus="${GPUS_PER_NODE:-8}" extra=()
while (($#)); do
  case "$1" in
    --out) out="${2:?--out needs the run folder}"; shift 2 ;;
    --ranks) ranks="${2:?--ranks needs a SPEC}"; shift 2 ;;
    --nodes) nodes="${2:?--nodes needs a number}"; shift 2 ;;
    --gpus-per-node) gpus="${2:?--gpus-per-node needs a number}"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "prism-chain.sh: unknown option $1 (Megatron-LM flags go after --)" >&2; exit 2 ;;
    *)
      [[ -z $config ]] || { echo "prism-chain.sh: one CONFIG only, got '$config' and '$1'" >&2; exit 2; }
      config="$1"; shift ;;
  esac
done
[[ -f $config ]] || { echo "prism-chain.sh: CONFIG file not found: '${config}' (see launch/configs/)" >&2; exit 2; }
[[ -n $out ]] || { echo "prism-chain.sh: --out RUN is required (a folder every node sees)" >&2; exit 2; }
[[ $nodes =~ ^[1-9][0-9]*$ ]] || { echo "prism-chain.sh: --nodes must be a whole number >= 1, got '$nodes'" >&2; exit 2; }
[[ $gpus =~ ^[1-9][0-9]*$ ]] || { echo "prism-chain.sh: --gpus-per-node must be a whole number >= 1, got '$gpus'" >&2; exit 2; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
python="${PYTHON:-python3}"
read -r -a sbatch <<<"${SBATCH:-sbatch}"
read -r -a sbatch_args <<<"${SBATCH_ARGS:-}"
rank_flags=()
[[ -z $ranks ]] || rank_flags=(--prism-ranks "$ranks")

# The slice's capture batches, G ranks each, from the library's plan of the run (it checks the job as
# `prism-megatron emulate` does, and that the real ranks fill the emulation's N x G processes).
# Unless DRY_RUN, the plan's role classes go into RUN/capture, so the graph built there gives every
# role of a class the spans of the class's captured rank.
plan="$("$python" - "$gpus" "$nodes" "$out" "$config" "${SCRIPT:-builtin}" ${rank_flags[@]+"${rank_flags[@]}"} ${extra[@]+"${extra[@]}"} <<'EOF'
import os, sys, warnings
warnings.simplefilter("ignore")  # megatron-core's import notices would bury the one-line refusal
from prism_megatron.commands import CommandLineError
from prism_megatron.commands.emulate import checked_plan
from prism_megatron.emulation.capture_slice import capture_ranks
from prism_megatron.graph.classes import save_classes
from prism_megatron.megatron.job.configs import read_config
gpus, nodes, out, script = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3], sys.argv[5]
try:
    # RUN itself, so the plan's checks of the run folder are RUN's (an earlier run's captures there
    # would mix into this graph).
    flags = [*read_config(sys.argv[4]), "--prism-emulate", *sys.argv[6:], "--prism-out", out]
    plan = checked_plan(flags, script=script, nproc=gpus * nodes)
except (ValueError, CommandLineError) as exc:
    sys.exit(f"prism-chain.sh: {exc}")
if len(plan.real_ranks) != gpus * nodes:
    sys.exit(f"prism-chain.sh: the emulation's {len(plan.real_ranks)} real ranks must fill --nodes {nodes} x "
             f"--gpus-per-node {gpus}; choose --ranks or --nodes to match")
if os.environ.get("DRY_RUN", "0") != "1":
    save_classes(plan.role_classes, os.path.join(out, "capture"))
# Capture jobs hold G ranks each: the spare places that confirm a class are those of G-rank batches.
ranks = capture_ranks(plan.layout, plan.role_classes, gpus)
for i in range(0, len(ranks), gpus):
    print(",".join(map(str, ranks[i : i + gpus])))
EOF
)"
mapfile -t batches <<<"$plan"
mapfile -t config_flags < <("$python" -c 'import sys
from prism_megatron.megatron.job.configs import read_config
print("\n".join(read_config(sys.argv[1])))' "$config")

dry_ids=1000  # DRY_RUN's made-up job ids; the counter lives in a file, as submit runs in $(...)
counter="$(mktemp)"
trap 'rm -f "$counter"' EXIT
echo "$dry_ids" >"$counter"
submit() {  # [job_script=TEXT] submit VAR=VALUE... -- SBATCH-ARGS...; prints the job id
  # Variables travel in sbatch's environment (it exports ALL by default): --export would split them
  # at commas, and flags hold commas (rank lists). With job_script set, that script goes to sbatch's
  # stdin (a job without a script file).
  local env_vars=(-u EXTRA_FLAGS)  # the flags go as arguments; an exported EXTRA_FLAGS would add to them
  while [[ $1 != -- ]]; do env_vars+=("$1"); shift; done
  shift
  if [[ ${DRY_RUN:-0} == 1 ]]; then
    printf '%q ' env "${env_vars[@]}" "${sbatch[@]}" ${sbatch_args[@]+"${sbatch_args[@]}"} --parsable "$@" >&2
    echo >&2
    [[ -z ${job_script:-} ]] || printf '<<SCRIPT\n%s\nSCRIPT\n' "$job_script" >&2
    local id=$(($(cat "$counter") + 1))
    echo "$id" >"$counter"
    echo "$id"
  elif [[ -n ${job_script:-} ]]; then
    printf '%s\n' "$job_script" | env "${env_vars[@]}" "${sbatch[@]}" ${sbatch_args[@]+"${sbatch_args[@]}"} --parsable "$@" | cut -d';' -f1
  else
    env "${env_vars[@]}" "${sbatch[@]}" ${sbatch_args[@]+"${sbatch_args[@]}"} --parsable "$@" </dev/null | cut -d';' -f1
  fi
}
quoted() { printf '%q ' "$@"; }

capture_ids=()
for batch in "${batches[@]}"; do
  size=$(($(tr -cd ',' <<<"$batch" | wc -c) + 1))
  capture_ids+=("$(submit PHASE=capture "GPUS_PER_NODE=$size" -- \
    --job-name prism-capture --nodes 1 "$here/prism.sbatch" "$config" "$batch" \
    -- --prism-out "$out/capture" ${extra[@]+"${extra[@]}"})")
done
dependency="afterok:$(IFS=:; echo "${capture_ids[*]}")"
emulate_id="$(submit PHASE=emulate "GPUS_PER_NODE=$gpus" -- \
  --job-name prism-emulate --nodes "$nodes" --dependency "$dependency" "$here/prism.sbatch" "$config" ${ranks:+"$ranks"} \
  -- --prism-graph "$out/capture" --prism-out "$out" ${extra[@]+"${extra[@]}"})"
script_flags=()
[[ ${SCRIPT:-builtin} == builtin ]] || script_flags=(--script "$SCRIPT")
# bash, not sh: %q may write $'...' (a newline in a path), which only bash reads back.
report_script="#!/bin/bash
exec $(quoted "$python" -m prism_megatron.cli emulate --report-only ${script_flags[@]+"${script_flags[@]}"} -- \
  "${config_flags[@]}" --prism-emulate ${rank_flags[@]+"${rank_flags[@]}"} ${extra[@]+"${extra[@]}"} \
  --prism-graph "$out/capture" --prism-out "$out")"
report_id="$(job_script="$report_script" submit -- --job-name prism-report --nodes 1 --ntasks 1 \
  --dependency "afterok:$emulate_id" --output "prism-report-%j.out")"

echo "capture jobs: ${capture_ids[*]} (batches: ${batches[*]})"
echo "emulate job:  $emulate_id (after the captures)"
echo "report job:   $report_id (after the emulation; writes $(quoted "$out")/report.md)"
