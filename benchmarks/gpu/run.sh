#!/usr/bin/env bash
# The one prepared script for a lent single-GPU machine (an H200 with its own python3 and torch, no
# megatron-core unless carried as a wheel, no internet), given a copy of this repository's working
# tree. It builds the extension there, runs tests/gpu, measures the device wait kernel and the CPU
# waits, and checks stream overlap; later stages are steps skipped until their prerequisites exist.
# Every step is time-boxed and the whole run stays inside a budget (default 460 s, under 8 minutes).
#
# Usage: benchmarks/gpu/run.sh [--skip-build]
#   --skip-build   use the prism_megatron/_C*.so already in the tree
# Environment: OUT (results directory; default benchmarks/results), PYTHON (default python3),
#   CUDA_HOME (default: found from nvcc), PRISM_GPU_BUDGET_S (default 460).
# Results: <date>-gpu.json (every step's status and numbers), <date>-gpu.md (summary) and, under
#   OUT only, <date>-gpu.log (every step's output). Exit status 1 when a step failed.
#
# Adding a stage: write a module that takes --out DIR and leaves *.json / *.md there, then add a
# run_step line below with its limit and a prerequisite check; summarize.py picks its files up.
set -uo pipefail

skip_build=0
for arg in "$@"; do
  case "$arg" in
    --skip-build) skip_build=1 ;;
    -h | --help) sed -n '2,16p' "$0"; exit 0 ;;
    *) echo "run.sh: unknown option '$arg' (valid: --skip-build, --help)" >&2; exit 2 ;;
  esac
done

REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 2
PY=${PYTHON:-python3}
BUDGET_S=${PRISM_GPU_BUDGET_S:-460}
DATE=$(date +%F)
WORK=$(mktemp -d "${TMPDIR:-/tmp}/prism-gpu.XXXXXX")
RESULTS_DIR=${OUT:-$REPO/benchmarks/results}
mkdir -p "$RESULTS_DIR"
if [[ -n "${OUT:-}" ]]; then LOG=$OUT/$DATE-gpu.log; else LOG=$WORK/run.log; fi
: >"$LOG"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
START_S=$SECONDS
failed=0

say() { echo "$*" | tee -a "$LOG"; }

record() {  # name status seconds note
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$WORK/steps.tsv"
  say "--- $1: $2 (${3} s) $4"
}

first_error() {  # the first compiler or Python error line of a step's output, for the summary table
  local line
  line=$(grep -m1 -E '\b(error|ERROR|[A-Za-z]*Error):' "$1" | tr -d '|\t' | cut -c1-200)
  [[ -n "$line" ]] && echo ": $line"
}

# run_step NAME LIMIT_S PREREQ -- COMMAND...: PREREQ is a function printing why it is unmet (or
# ":" for none); the command's output goes to the console and the log; {out} in it becomes WORK/NAME.
run_step() {
  local name=$1 limit_s=$2 prereq=$3
  shift 4
  local why
  if ! why=$($prereq 2>&1); then
    record "$name" skipped 0 "$why"
    return 0
  fi
  local left_s=$((BUDGET_S - (SECONDS - START_S)))
  if ((left_s < 15)); then
    record "$name" skipped 0 "out of time budget (${BUDGET_S} s)"
    return 0
  fi
  ((limit_s > left_s)) && limit_s=$left_s
  mkdir -p "$WORK/$name"
  local cmd=("${@//\{out\}/$WORK/$name}")
  say "=== $name (limit ${limit_s} s): ${cmd[*]}"
  local t0=$SECONDS rc
  timeout -k 10 "$limit_s" "${cmd[@]}" 2>&1 | tee -a "$LOG" "$WORK/$name.out"
  rc=${PIPESTATUS[0]}
  if ((rc == 0)); then
    record "$name" ok $((SECONDS - t0)) ""
  elif ((rc == 124 || rc == 137)); then
    record "$name" timeout $((SECONDS - t0)) "killed at ${limit_s} s"
    failed=1
  else
    record "$name" failed $((SECONDS - t0)) "exit status $rc$(first_error "$WORK/$name.out")"
    failed=1
  fi
}

# Prerequisites: print why unmet and return 1, or return 0.
have_cuda_build() {
  "$PY" -c 'import torch, sys; from prism_megatron import _C
sys.exit(0 if _C.with_cuda and torch.cuda.is_available() else 1)' >/dev/null 2>&1 ||
    { echo "no CUDA build of prism_megatron._C or no GPU"; return 1; }
}
have_build() { "$PY" -c 'import torch; from prism_megatron import _C' >/dev/null 2>&1 || { echo "no build"; return 1; }; }
have_wheels() { compgen -G ".whl/*.whl" >/dev/null || { echo "no wheels carried in .whl/"; return 1; }; }
have_megatron() { "$PY" -c 'import megatron.core' >/dev/null 2>&1 || { echo "megatron-core not importable"; return 1; }; }
have_module() { [[ -f "$1" ]] || { echo "$1 not written yet"; return 1; }; }
full_build_failed() { [[ "$(awk -F'\t' '$1 == "build" {print $2}' "$WORK/steps.tsv")" == failed ]] || { echo "full build did not fail"; return 1; }; }
build_wanted() { ((skip_build == 0)) || { echo "--skip-build"; return 1; }; }
# The emulation on cuda needs the device wait kernel: a CUDA build, not only megatron-core.
need_memory_step() { have_cuda_build && have_megatron && have_module benchmarks/gpu/memory_ground_truth.py; }
need_llama_step() { have_cuda_build && have_megatron && have_module benchmarks/gpu/emulated_llama_rank.py; }
need_gpt_step() { have_cuda_build && have_megatron; }

if [[ -z "${CUDA_HOME:-}" ]]; then
  if [[ -x /usr/local/cuda/bin/nvcc ]]; then CUDA_HOME=/usr/local/cuda
  elif command -v nvcc >/dev/null; then CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  else CUDA_HOME=""; fi
fi
export CUDA_HOME TORCH_CUDA_ARCH_LIST=${TORCH_CUDA_ARCH_LIST:-9.0} MAX_JOBS=${MAX_JOBS:-$(nproc)}
say "prism-megatron GPU run: repo $REPO, python $PY, CUDA_HOME=${CUDA_HOME:-unset}, budget ${BUDGET_S} s, work $WORK"

run_step environment 60 : -- "$PY" -m benchmarks.gpu.environment --out {out}
# Carried wheels (`make wheels-gpu`: megatron-core and what a torch-only Python may lack) go to a
# private target, never the system, and only those this Python lacks (no network: pip --no-index).
run_step wheels 90 have_wheels -- "$PY" -m benchmarks.gpu.carried_wheels --wheels .whl --target "$WORK/site"
[[ -d "$WORK/site" ]] && export PYTHONPATH="$PYTHONPATH:$WORK/site"
# Each build from scratch in a fresh folder of its own: objects left in the shared build/ folder by
# an earlier copy of the sources (a warm machine keeps ignored files) are never linked in.
run_step build 300 build_wanted -- "$PY" setup.py build_ext --inplace --build-temp "$WORK/build-full"
# If another component fails to build here, the clock alone still gets its GPU checks.
run_step build_clock_only 200 full_build_failed -- "$PY" benchmarks/gpu/build_clock_only.py build_ext --inplace \
  --build-temp "$WORK/build-clock-only"
run_step gpu_tests 120 have_cuda_build -- "$PY" -m pytest -q -p no:cacheprovider tests/gpu tests/unit/test_clock.py
run_step wait_precision 90 have_cuda_build -- "$PY" -m benchmarks.gpu.wait_precision --out {out}
run_step stream_overlap 60 have_cuda_build -- "$PY" -m benchmarks.gpu.stream_overlap --out {out}
# The device path: backend creation and every op family on CUDA tensors, 1 and 2 real processes.
run_step backend_ops 60 have_cuda_build -- "$PY" -m benchmarks.gpu.backend_ops --out {out}
# The device timeline: a GPT capture's compute spans against torch.profiler's trace of the iteration.
run_step gpt_capture_profile 90 need_gpt_step -- "$PY" -m benchmarks.gpu.gpt_capture_profile --out {out}
# Later stages: they run once their module exists and megatron-core is importable.
run_step memory_ground_truth 120 need_memory_step -- "$PY" -m benchmarks.gpu.memory_ground_truth --out {out}
run_step emulated_llama_rank 180 need_llama_step -- "$PY" -m benchmarks.gpu.emulated_llama_rank --out {out}
# The CPU waits last: they matter least to the GPU checks above.
run_step cpu_clock 90 have_build -- "$PY" -m benchmarks.clock.run --out {out}

say "=== summary ($((SECONDS - START_S)) s of ${BUDGET_S} s)"
if ! "$PY" -m benchmarks.gpu.summarize --work "$WORK" --json "$RESULTS_DIR/$DATE-gpu.json" \
  --md "$RESULTS_DIR/$DATE-gpu.md" | tee -a "$LOG"; then
  column -t -s $'\t' "$WORK/steps.tsv" | tee -a "$LOG"
  failed=1
fi
# Last: one PASS / FAIL / NOT RUN line per check of the GPU timing path.
"$PY" -m benchmarks.gpu.verdicts --work "$WORK" --md "$WORK/verdicts.md" | tee -a "$LOG" || failed=1
[[ -f "$WORK/verdicts.md" ]] && cat "$WORK/verdicts.md" >>"$RESULTS_DIR/$DATE-gpu.md"
say "results: $RESULTS_DIR/$DATE-gpu.json, $RESULTS_DIR/$DATE-gpu.md; log: $LOG"
exit "$failed"
