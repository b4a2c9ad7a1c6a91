#!/usr/bin/env bash
# Emulate a production job on this machine: launch/emulate.sh CONFIG [--ranks SPEC] [--nproc-per-node N] [-- FLAGS...]
#
# Reads CONFIG (launch/configs/*.args: Megatron-LM flags, '#' comments; the same rules as
# prism_megatron/megatron/job/configs.py). On one machine it runs both passes and the report:
#   prism-megatron emulate [--script SCRIPT] [--nproc-per-node N] -- <CONFIG's flags> --prism-emulate [--prism-ranks SPEC] [FLAGS...]
# Across machines (TORCHRUN_ARGS set, e.g. by launch/prism.sbatch) it runs ONE pass, PHASE, under torchrun:
#   torchrun ... -m prism_megatron.launch SCRIPT <CONFIG's flags> --prism-emulate --prism-phase PHASE ...
# --ranks SPEC        the real ranks (the --prism-ranks language: slice, 0,8191, 'pp=0,15;tp=0'); default:
#                     the launcher's default (one rank per role)
# --nproc-per-node N  processes on this node at once (one machine: default one per selected rank;
#                     across machines: one per real rank on the node, default 1)
# FLAGS after --      appended last, so they override CONFIG (e.g. -- --prism-device cpu --prism-out RUN)
# Environment: SCRIPT  training script (default: builtin, the megatron-core entry shipped with the
#                      package; set it to the path of Megatron-LM's pretrain_gpt.py to run that)
#              PHASE  across machines: capture or emulate (the recipe: python -m prism_megatron.emulation)
#              TORCHRUN  torchrun command (default: torchrun); TORCHRUN_ARGS  extra torchrun options, word-split
#              PYTHON  the interpreter for one machine (default: python3)
#              DRY_RUN=1  print the command, one word per line, instead of running it
# Stopping: the command replaces this shell (exec), so Ctrl-C or SIGTERM reach prism-megatron emulate
# (or torchrun) directly, which end every process they started.
set -euo pipefail

usage() { sed -n '2,21p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

config="" ranks="" nproc="" extra=()
while (($#)); do
  case "$1" in
    --ranks) ranks="${2:?--ranks needs a SPEC}"; shift 2 ;;
    --nproc-per-node) nproc="${2:?--nproc-per-node needs a number}"; shift 2 ;;
    --) shift; extra=("$@"); break ;;
    -h | --help) usage; exit 0 ;;
    -*) echo "emulate.sh: unknown option $1 (Megatron-LM flags go after --)" >&2; exit 2 ;;
    *)
      [[ -z $config ]] || { echo "emulate.sh: one CONFIG only, got '$config' and '$1'" >&2; exit 2; }
      config="$1"; shift ;;
  esac
done
[[ -f $config ]] || { echo "emulate.sh: CONFIG file not found: '${config}' (see launch/configs/)" >&2; exit 2; }

here="$(cd "$(dirname "${BASH_SOURCE[0]}")" && pwd)"
script="${SCRIPT:-builtin}"

# Flags of CONFIG: drop comments ('#' at the start of a line or after whitespace), split on whitespace,
# expand nothing (read -a neither globs nor expands variables).
flags=()
while IFS= read -r line || [[ -n $line ]]; do
  line="$(sed -E 's/(^|[[:space:]])#.*$//' <<<"$line")"
  read -r -a words <<<"$line"
  flags+=(${words[@]+"${words[@]}"})
done <"$config"

rank_flags=()
[[ -z $ranks ]] || rank_flags=(--prism-ranks "$ranks")
read -r -a torchrun_args <<<"${TORCHRUN_ARGS:-}"
read -r -a torchrun <<<"${TORCHRUN:-torchrun}"

if ((${#torchrun_args[@]} == 0)); then  # one machine: both passes and the report
  script_flags=() nproc_flags=()
  [[ $script == builtin ]] || script_flags=(--script "$script")
  [[ -z $nproc ]] || nproc_flags=(--nproc-per-node "$nproc")
  command=("${PYTHON:-python3}" -m prism_megatron.cli emulate ${script_flags[@]+"${script_flags[@]}"}
    ${nproc_flags[@]+"${nproc_flags[@]}"} -- ${flags[@]+"${flags[@]}"} --prism-emulate
    ${rank_flags[@]+"${rank_flags[@]}"} ${extra[@]+"${extra[@]}"})
else  # several machines: one pass, named
  case "${PHASE:-}" in
    capture | emulate) ;;
    *) echo "emulate.sh: across machines (TORCHRUN_ARGS set) set PHASE=capture or PHASE=emulate, got '${PHASE:-}' (recipe: python -c 'import prism_megatron.emulation as e; print(e.__doc__)')" >&2; exit 2 ;;
  esac
  command=("${torchrun[@]}" "${torchrun_args[@]}" --nproc-per-node "${nproc:-1}"
    -m prism_megatron.launch "$script" ${flags[@]+"${flags[@]}"} --prism-emulate --prism-phase "$PHASE"
    ${rank_flags[@]+"${rank_flags[@]}"} ${extra[@]+"${extra[@]}"})
fi
if [[ ${DRY_RUN:-0} == 1 ]]; then
  printf '%s\n' "${command[@]}"
  exit 0
fi
exec "${command[@]}"
