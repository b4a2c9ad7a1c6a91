#!/usr/bin/env bash
# Emulate a production job on this machine: launch/emulate.sh CONFIG [--ranks SPEC] [--nproc-per-node N] [-- FLAGS...]
#
# Reads CONFIG (launch/configs/*.args: Megatron-LM flags, '#' comments; the same rules as
# prism_megatron/megatron/plan_config.py) and runs, under torchrun, one process per real rank of
#   python -m prism_megatron.launch SCRIPT <CONFIG's flags> --prism-emulate [--prism-ranks SPEC] [FLAGS...]
# --ranks SPEC        the real ranks (the --prism-ranks language: slice, 0,8191, 'pp=0,15;tp=0'); default:
#                     the launcher's default (one rank per role)
# --nproc-per-node N  processes on this node, one per real rank (default 1)
# FLAGS after --      appended last, so they override CONFIG (e.g. -- --prism-device cpu)
# Environment: SCRIPT  training script (default: builtin, the megatron-core entry shipped with the
#                      package; set it to the path of Megatron-LM's pretrain_gpt.py to run that)
#              TORCHRUN  torchrun command (default: torchrun); TORCHRUN_ARGS  extra torchrun options, word-split
#                      (launch/prism.sbatch passes --nnodes and the rendezvous here)
#              DRY_RUN=1  print the command, one word per line, instead of running it
set -euo pipefail

usage() { sed -n '2,15p' "${BASH_SOURCE[0]}" | sed 's/^# \{0,1\}//'; }

config="" ranks="" nproc=1 extra=()
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

command=("${torchrun[@]}" ${torchrun_args[@]+"${torchrun_args[@]}"} --nproc-per-node "$nproc"
  -m prism_megatron.launch "$script" ${flags[@]+"${flags[@]}"} --prism-emulate
  ${rank_flags[@]+"${rank_flags[@]}"} ${extra[@]+"${extra[@]}"})
if [[ ${DRY_RUN:-0} == 1 ]]; then
  printf '%s\n' "${command[@]}"
  exit 0
fi
exec "${command[@]}"
