#!/usr/bin/env bash
# One submission, the whole run on SLURM: capture, emulate and report as a chain of dependent jobs.
#   launch/prism-chain.sh CONFIG --out RUN [--ranks SPEC] [--nodes N] [--gpus-per-node G] [-- FLAGS...]
#
# Submits (from the repository root, RUN on a filesystem every node sees):
#   1. one capture job per batch of the slice (one rank per class of roles that run the same program,
#      written to RUN/capture/role-classes.json; G ranks per batch, one node each;
#      the batches are what `prism-megatron emulate --nproc-per-node G` would run), all at once:
#        PHASE=capture  launch/prism.sbatch CONFIG BATCH   with --prism-out RUN/capture
#   2. the emulation, after every capture job succeeded (--dependency=afterok:...), on N nodes:
#        PHASE=emulate  launch/prism.sbatch CONFIG SPEC    with --prism-graph RUN/capture --prism-out RUN
#   3. the report, after the emulation succeeded, one task:
#        prism-megatron emulate --report-only -- <CONFIG's flags> ... --prism-out RUN
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

usage() { sed -n '2,24p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

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

# The slice's capture batches, G ranks each, from the library's plan of the run (it also checks the
# flags, and that the real ranks fill the emulation's N x G processes).
# Unless DRY_RUN, the plan's role classes go into RUN/capture, so the graph built there gives every
# role of a class the spans of the class's captured rank.
plan="$("$python" - "$gpus" "$nodes" "$out" "$config" ${rank_flags[@]+"${rank_flags[@]}"} ${extra[@]+"${extra[@]}"} <<'EOF'
import os, sys
from prism_megatron.emulation import plan_run
from prism_megatron.emulation.capture_slice import capture_ranks
from prism_megatron.graph.classes import save_classes
from prism_megatron.megatron.job.configs import read_config
gpus, nodes, out = int(sys.argv[1]), int(sys.argv[2]), sys.argv[3]
try:
    # RUN itself, so the plan's checks of the run folder are RUN's (an earlier run's captures there
    # would mix into this graph).
    flags = [*read_config(sys.argv[4]), "--prism-emulate", *sys.argv[5:], "--prism-out", out]
    plan = plan_run(flags, nproc=gpus * nodes)
except ValueError as exc:
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
submit() {  # submit VAR=VALUE... -- SBATCH-ARGS...; prints the job id
  # Variables travel in sbatch's environment (it exports ALL by default): --export would split them
  # at commas, and flags hold commas (rank lists).
  local env_vars=()
  while [[ $1 != -- ]]; do env_vars+=("$1"); shift; done
  shift
  if [[ ${DRY_RUN:-0} == 1 ]]; then
    printf '%q ' env ${env_vars[@]+"${env_vars[@]}"} "${sbatch[@]}" ${sbatch_args[@]+"${sbatch_args[@]}"} --parsable "$@" >&2
    echo >&2
    local id=$(($(cat "$counter") + 1))
    echo "$id" >"$counter"
    echo "$id"
  else
    env ${env_vars[@]+"${env_vars[@]}"} "${sbatch[@]}" ${sbatch_args[@]+"${sbatch_args[@]}"} --parsable "$@" | cut -d';' -f1
  fi
}
quoted() { printf '%q ' "$@"; }

capture_ids=()
for batch in "${batches[@]}"; do
  size=$(($(tr -cd ',' <<<"$batch" | wc -c) + 1))
  flags="--prism-out $out/capture ${extra[*]+${extra[*]}}"
  capture_ids+=("$(submit PHASE=capture "GPUS_PER_NODE=$size" "EXTRA_FLAGS=$flags" -- \
    --job-name prism-capture --nodes 1 "$here/prism.sbatch" "$config" "$batch")")
done
dependency="afterok:$(IFS=:; echo "${capture_ids[*]}")"
flags="--prism-graph $out/capture --prism-out $out ${extra[*]+${extra[*]}}"
emulate_id="$(submit PHASE=emulate "GPUS_PER_NODE=$gpus" "EXTRA_FLAGS=$flags" -- \
  --job-name prism-emulate --nodes "$nodes" --dependency "$dependency" "$here/prism.sbatch" "$config" ${ranks:+"$ranks"})"
script_flags=()
[[ ${SCRIPT:-builtin} == builtin ]] || script_flags=(--script "$SCRIPT")
report="$(quoted "$python" -m prism_megatron.cli emulate --report-only ${script_flags[@]+"${script_flags[@]}"} -- \
  "${config_flags[@]}" --prism-emulate ${rank_flags[@]+"${rank_flags[@]}"} ${extra[@]+"${extra[@]}"} \
  --prism-graph "$out/capture" --prism-out "$out")"
report_id="$(submit -- --job-name prism-report --nodes 1 --ntasks 1 --dependency "afterok:$emulate_id" \
  --output "prism-report-%j.out" --wrap "$report")"

echo "capture jobs: ${capture_ids[*]} (batches: ${batches[*]})"
echo "emulate job:  $emulate_id (after the captures)"
echo "report job:   $report_id (after the emulation; writes $out/report.md)"
