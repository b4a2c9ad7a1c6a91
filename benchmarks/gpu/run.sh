#!/usr/bin/env bash
# The one prepared script for a lent single-GPU machine (an H200 with its own python3 and torch, no
# megatron-core unless carried as a wheel, no internet), given a copy of this repository's working
# tree. It first records what the build links against (interpreter, torch's file and version, link
# flags), builds the extension there (forced, from empty folders, with symbols), smoke-checks the
# backend, runs tests/gpu, measures the device wait kernel and the CPU waits, and checks stream
# overlap; later stages are steps skipped until their prerequisites exist. A step that crashes
# (SIGSEGV, SIGABRT, SIGBUS, SIGFPE, SIGILL) is followed by its native backtrace (gdb, else cuda-gdb)
# and one rerun under glibc's malloc checking. Every step is time-boxed and the whole run stays
# inside a budget (default 460 s, under 8 minutes).
#
# Usage: benchmarks/gpu/run.sh [--skip-build]
#   --skip-build   use the prism_megatron/_C*.so already in the tree
# Environment: OUT (results directory; default benchmarks/results), PYTHON (default python3),
#   CUDA_HOME (default: found from nvcc), PRISM_GPU_BUDGET_S (default 460); CC, CXX, LDSHARED and
#   the *FLAGS pass through to the build (a plain LDSHARED="gcc -shared" rules out a distribution
#   Python's link flags).
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
    -h | --help) sed -n '2,22p' "$0"; exit 0 ;;
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

# The step machinery (run_step, record, the crash follow-up), shared with its test.
# shellcheck source=benchmarks/gpu/steps.sh
source "$REPO/benchmarks/gpu/steps.sh"

# Prerequisites: print why unmet and return 1, or return 0.
have_cuda_build() {
  "$PY" -c 'import torch, sys; from prism_megatron import _C
sys.exit(0 if _C.with_cuda and torch.cuda.is_available() else 1)' >/dev/null 2>&1 ||
    { echo "no CUDA build of prism_megatron._C or no GPU"; return 1; }
}
have_build() { "$PY" -c 'import torch; from prism_megatron import _C' >/dev/null 2>&1 || { echo "no build"; return 1; }; }
have_backend_build() {
  "$PY" -c 'import torch; from prism_megatron import _C; _C.backend' >/dev/null 2>&1 ||
    { echo "no build with the backend"; return 1; }
}
have_wheels() { compgen -G ".whl/*.whl" >/dev/null || { echo "no wheels carried in .whl/"; return 1; }; }
have_megatron() { "$PY" -c 'import megatron.core' >/dev/null 2>&1 || { echo "megatron-core not importable"; return 1; }; }
have_module() { [[ -f "$1" ]] || { echo "$1 not written yet"; return 1; }; }
full_build_failed() { step_failed build; }
backend_build_failed() { step_failed build && step_failed build_backend_only; }
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

# First, before anything is built or imported from the tree: what the build will link against.
run_step build_env 60 : -- "$PY" -m tools.build_env --json {out}/build_env.json
run_step environment 60 : -- "$PY" -m benchmarks.gpu.environment --out {out}
# Carried wheels (`make wheels-gpu`: megatron-core and what a torch-only Python may lack) go to a
# private target, never the system, and only those this Python lacks (no network: pip --no-index).
run_step wheels 90 have_wheels -- "$PY" -m benchmarks.gpu.carried_wheels --wheels .whl --target "$WORK/site"
[[ -d "$WORK/site" ]] && export PYTHONPATH="$PYTHONPATH:$WORK/site"
# Every build forced, from empty folders of its own, with symbols (-g1) for native backtraces
# (tools/native_build.py): objects or a module left by an earlier copy of the sources (a warm
# machine keeps ignored files) are never linked in or copied into place.
run_step build 300 build_wanted -- "$PY" -m tools.native_build --inplace --debug-symbols --work "$WORK/build-full"
# If another component fails to build here, the backend, else the clock, still gets its GPU checks.
run_step build_backend_only 240 full_build_failed -- "$PY" -m tools.native_build --part backend --inplace \
  --debug-symbols --work "$WORK/build-backend-only"
run_step build_clock_only 200 backend_build_failed -- "$PY" -m tools.native_build --part clock --inplace \
  --debug-symbols --work "$WORK/build-clock-only"
# The first construction of a prism backend under this torch, one process then two (CPU tensors).
run_step smoke 120 have_backend_build -- "$PY" -X faulthandler -m tools.build_smoke
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
