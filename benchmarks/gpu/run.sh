#!/usr/bin/env bash
# The one prepared script for a lent single-GPU machine (an H200 with its own python3 and torch 2.11,
# no megatron-core unless carried as a wheel, no network), given a copy of this repository's working
# tree. Setup first: what the build links against, the carried wheels, then the extension: the
# prebuilt module carried in .prebuilt/ when it was built from these sources for this torch (`make
# prebuilt-gpu`), else a forced build there (the fallback), and a check that the module has CUDA.
# Then the stages, the most important first, each once and time-boxed, the whole run inside a budget
# (default 540 s): the main claim (a rank without prism against the same rank emulated), the GPU
# model's kernel times against the same kernels on this GPU, stream
# order to a collective's consumer, more than 32 jobs of two real ranks on one GPU, the op families,
# the wait kernel, the memory ground truth, the GPT capture against the profiler, tests/gpu, stream
# overlap, a Llama-3-8B rank, the CPU waits. A step that crashes (SIGSEGV, SIGABRT, SIGBUS, SIGFPE,
# SIGILL) is followed by its native backtrace (gdb, else cuda-gdb) and one rerun under glibc's malloc
# checking. The last lines are one PASS / FAIL / NOT RUN row per stage and check (verdicts.py).
#
# Usage: benchmarks/gpu/run.sh [--only STAGE[,STAGE...]] [--skip-build] [--dry-run]
#   --only STAGES  run these stages (setup always runs); the others get NOT RUN rows
#   --skip-build   use the prism_megatron/_C*.so already in the tree
#   --dry-run      on a machine without a GPU: every stage that needs no GPU, on the CPU and the
#                  asynchronous test device (small sizes), with the GPU's stages NOT RUN; checks of
#                  timing are not judged. CI runs it, so the script itself cannot fail on the GPU.
# Environment: OUT (results directory; default benchmarks/results, a scratch folder in a dry run),
#   PYTHON (default python3), CUDA_HOME (default: found from nvcc), PRISM_GPU_BUDGET_S (default 540),
#   CC, CXX, LDSHARED and the *FLAGS pass through to a build.
# Results: <date>-gpu.json (every step's status and numbers), <date>-gpu.md (summary and verdict)
#   and, under OUT only, <date>-gpu.log (every step's output). Exit status 1 when a row is FAIL.
#
# Adding a stage: a module that takes --out DIR (and --device cpu, if it can run without a GPU) and
# leaves NAME.json / NAME.md there; a stage line below; its checks in verdicts.py.
set -uo pipefail

skip_build=0 dry_run=0 only=""
while (($#)); do
  case "$1" in
    --skip-build) skip_build=1 ;;
    --dry-run) dry_run=1 ;;
    --only) only=${2:-}; shift ;;
    --only=*) only=${1#--only=} ;;
    -h | --help) sed -n '2,29p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option '$1' (valid: --only STAGES, --skip-build, --dry-run, --help)" >&2; exit 2 ;;
  esac
  shift
done

# The measured stages, most important first: "name limit_s needs", needs one of gpu (a GPU only),
# any (the GPU, or the CPU in a dry run), megatron (any, and megatron-core importable), gpu+megatron
# (a GPU and megatron-core).
STAGES=(
  "smoke 120 any"
  "main_claim 200 megatron"
  "model_kernels 75 gpu+megatron"
  "memory_ground_truth 120 megatron"
  "kernel_profile 160 gpu+megatron"
  "emulated_llama_rank 180 megatron"
  "stream_ordering 40 any"
  "shared_gpu_jobs 60 any"
  "backend_ops 60 any"
  "wait_precision 45 gpu"
  "gpt_capture_profile 90 gpu"
  "gpu_tests 90 gpu"
  "stream_overlap 40 gpu"
  "cpu_clock 60 any"
)
stage_names=$(printf '%s\n' "${STAGES[@]}" | cut -d' ' -f1 | paste -sd, -)
for name in ${only//,/ }; do
  [[ ",$stage_names," == *",$name,"* ]] || { echo "run.sh: --only: no stage '$name' (stages: $stage_names)" >&2; exit 2; }
done

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 2
PY=${PYTHON:-python3}
DATE=$(date +%F)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/prism-gpu.XXXXXX")
if ((dry_run)); then
  BUDGET_S=${PRISM_GPU_BUDGET_S:-3000} LIMIT_FACTOR=8 DEVICE=cpu
  RESULTS_DIR=${OUT:-$WORK/results}
  export PRISM_GPU_DRY_RUN=1  # stages judge correctness only: the CPU's times say nothing of a GPU's
else
  BUDGET_S=${PRISM_GPU_BUDGET_S:-540} LIMIT_FACTOR=1 DEVICE=cuda
  RESULTS_DIR=${OUT:-$REPO/benchmarks/results}
fi
mkdir -p "$RESULTS_DIR"
if [[ -n "${OUT:-}" ]]; then LOG=$OUT/$DATE-gpu.log; else LOG=$WORK/run.log; fi
: >"$LOG"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
START_S=$SECONDS
failed=0

# The step machinery (run_step, record, the crash follow-up), shared with its test.
# shellcheck source=benchmarks/gpu/steps.sh
source "$REPO/benchmarks/gpu/steps.sh"

# Prerequisites of the setup steps: print why unmet and return 1, or return 0.
not_dry() { ((dry_run == 0)) || { echo "dry run: no GPU"; return 1; }; }
have_wheels() { not_dry && { compgen -G ".whl/*.whl" >/dev/null || { echo "no wheels carried in .whl/"; return 1; }; }; }
build_wanted() { not_dry && { ((skip_build == 0)) || { echo "--skip-build"; return 1; }; }; }
prebuilt_unused() { build_wanted && { [[ -z "${PRISM_NATIVE_DIR:-}" ]] || { echo "the prebuilt module fits"; return 1; }; }; }
# A prebuilt module that does not fit (other sources, another torch, not loading) is no failure: the
# build below is the fallback, so the reason goes into the skipped step's note.
prebuilt_fits() { build_wanted && "$PY" -m benchmarks.gpu.prebuilt --check .prebuilt; }
full_build_failed() { step_failed build; }
backend_build_failed() { step_failed build && step_failed build_backend_only; }

if [[ -z "${CUDA_HOME:-}" ]]; then
  if [[ -x /usr/local/cuda/bin/nvcc ]]; then CUDA_HOME=/usr/local/cuda
  elif command -v nvcc >/dev/null; then CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  else CUDA_HOME=""; fi
fi
export CUDA_HOME TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-$(nproc)}
say "prism-megatron GPU run$( ((dry_run)) && echo ' (DRY RUN: CPU and test device)'): repo $REPO, python $PY," \
  "CUDA_HOME=${CUDA_HOME:-unset}, budget ${BUDGET_S} s, stages ${only:-all}, work $WORK"

# --- Setup -------------------------------------------------------------------------------------
# First, before anything is built or imported from the tree: what the build will link against.
run_step build_env 60 : -- "$PY" -m tools.build_env --json {out}/build_env.json
run_step environment 60 : -- "$PY" -m benchmarks.gpu.environment --out {out}
# Carried wheels (`make wheels-gpu`: megatron-core and what a torch-only Python may lack) go to a
# private target, never the system, and only those this Python lacks (no network: pip --no-index).
run_step wheels 90 have_wheels -- "$PY" -m benchmarks.gpu.carried_wheels --wheels .whl --target "$WORK/site"
[[ -d "$WORK/site" ]] && export PYTHONPATH="$PYTHONPATH:$WORK/site"
# The module made here for this machine's pair (`make prebuilt-gpu`, carried in .prebuilt/), used
# only when it was built from these very sources for this torch; else the build below.
run_step prebuilt 30 prebuilt_fits -- "$PY" -m benchmarks.gpu.prebuilt --check .prebuilt
if [[ "$(awk -F'\t' '$1 == "prebuilt" {print $2}' "$WORK/steps.tsv")" == ok ]]; then
  export PRISM_NATIVE_DIR=$REPO/.prebuilt/prism_megatron
fi
# Every build forced, from empty folders of its own, with symbols (-g1) for native backtraces
# (tools/native_build.py): objects or a module left by an earlier copy of the sources (a warm
# machine keeps ignored files) are never linked in or copied into place.
run_step build 300 prebuilt_unused -- "$PY" -m tools.native_build --inplace --debug-symbols --work "$WORK/build-full"
# If another component fails to build here, the backend, else the clock, still gets its GPU checks.
run_step build_backend_only 240 full_build_failed -- "$PY" -m tools.native_build --part backend --inplace \
  --debug-symbols --work "$WORK/build-backend-only"
run_step build_clock_only 200 backend_build_failed -- "$PY" -m tools.native_build --part clock --inplace \
  --debug-symbols --work "$WORK/build-clock-only"
# A module without CUDA imports and passes the CPU checks, so say it plainly before anything else.
run_step cuda_build 30 not_dry -- "$PY" -c 'import sys, torch; from prism_megatron import _C
where = _C.__file__
if not torch.cuda.is_available(): sys.exit(f"error: torch {torch.__version__} sees no GPU")
if not _C.with_cuda: sys.exit(f"error: {where} was built without CUDA (with_cuda False): no device path")
print(f"CUDA build {where} for torch {torch.__version__} on {torch.cuda.get_device_name(0)}")'

# Each probe once (a probe imports torch, megatron-core: seconds each).
probe() { "$PY" -c "$1" >/dev/null 2>&1; }
probe 'import torch; from prism_megatron import _C; _C.backend' && have_backend=1 || have_backend=0
probe 'import megatron.core' && have_megatron=1 || have_megatron=0
if ((dry_run)); then have_gpu=0; else
  probe 'import sys, torch; from prism_megatron import _C; sys.exit(not (_C.with_cuda and torch.cuda.is_available()))' &&
    have_gpu=1 || have_gpu=0
fi
say "probes: backend built $have_backend, megatron-core $have_megatron, GPU with a CUDA build $have_gpu"

# --- Stages ------------------------------------------------------------------------------------
selected() { [[ -z "$only" || ",$only," == *",$1,"* ]] || { echo "not selected (--only $only)"; return 1; }; }
can_run() {  # NAME NEEDS
  selected "$1" || return 1
  ((have_backend)) || { echo "no build of prism_megatron._C with the backend"; return 1; }
  case "$2" in
    gpu) ((have_gpu)) || { ((dry_run)) && echo "dry run: needs a GPU" || echo "no GPU or no CUDA build"; return 1; } ;;
    gpu+megatron)
      ((have_megatron)) || { echo "megatron-core not importable"; return 1; }
      ((have_gpu)) || { ((dry_run)) && echo "dry run: needs a GPU" || echo "no GPU or no CUDA build"; return 1; } ;;
    megatron) ((have_megatron)) || { echo "megatron-core not importable"; return 1; } ;&
    any) ((dry_run || have_gpu)) || { echo "no GPU or no CUDA build"; return 1; } ;;
  esac
}
stage_command() {  # NAME: the command line of a stage, on the GPU or (dry run) on the CPU
  local device=(--device "$DEVICE") tiny=()
  ((dry_run)) && tiny=(--tiny)
  case "$1" in
    smoke) echo "$PY -X faulthandler -m tools.build_smoke" ;;
    gpu_tests) echo "$PY -m pytest -q -p no:cacheprovider tests/gpu tests/unit/test_clock.py" ;;
    cpu_clock) echo "$PY -m benchmarks.clock.run --out {out}" ;;
    main_claim | emulated_llama_rank) echo "$PY -m benchmarks.gpu.$1 --out {out} ${device[*]} ${tiny[*]}" ;;
    stream_ordering | shared_gpu_jobs | backend_ops | memory_ground_truth)
      echo "$PY -m benchmarks.gpu.$1 --out {out} ${device[*]}" ;;
    *) echo "$PY -m benchmarks.gpu.$1 --out {out}" ;;
  esac
}
for stage in "${STAGES[@]}"; do
  read -r name limit_s needs <<<"$stage"
  prereq() { can_run "$name" "$needs"; }
  # shellcheck disable=SC2046  # the command's words, split as written above
  run_step "$name" "$limit_s" prereq -- $(stage_command "$name")
done

say "=== summary ($((SECONDS - START_S)) s of ${BUDGET_S} s)"
if ! "$PY" -m benchmarks.gpu.summarize --work "$WORK" --json "$RESULTS_DIR/$DATE-gpu.json" \
  --md "$RESULTS_DIR/$DATE-gpu.md" | tee -a "$LOG"; then
  column -t -s $'\t' "$WORK/steps.tsv" | tee -a "$LOG"
  failed=1
fi
# Last: one PASS / FAIL / NOT RUN row per stage and check.
dry=()
((dry_run)) && dry=(--dry-run)
"$PY" -m benchmarks.gpu.verdicts --work "$WORK" --stages "build_env,environment,wheels,prebuilt,build,cuda_build,$stage_names" \
  "${dry[@]}" --md "$WORK/verdicts.md" | tee -a "$LOG"
verdict=${PIPESTATUS[0]}
[[ -f "$WORK/verdicts.md" ]] && cat "$WORK/verdicts.md" >>"$RESULTS_DIR/$DATE-gpu.md"
say "results: $RESULTS_DIR/$DATE-gpu.json, $RESULTS_DIR/$DATE-gpu.md; log: $LOG"
# The verdict decides: a step that failed is a FAIL row there (a stage's own checks may fail it too).
((verdict == 0 && failed == 0)) || exit 1
exit 0
