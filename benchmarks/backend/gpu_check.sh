#!/usr/bin/env bash
# The backend's check on a lent GPU machine (its own python3 and CUDA torch, no megatron-core, no
# internet), given a copy of this repository's working tree: build the backend, replay engine and
# clock (benchmarks/backend/gpu_build.py) from scratch in its own build folder, smoke-check it
# (benchmarks/backend/build_smoke.py; on a crash, the native stack from cuda-gdb), run the CUDA backend
# tests and the CPU backend tests under that torch, and the CPU backend benchmark on an idle many-core
# host. Each step is time-boxed; everything lands in $OUT (default benchmarks/results):
# <date>-backend-gpu.log and the benchmark's JSON and Markdown. Exit status 1 when a step failed.
set -uo pipefail
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 2
PY=${PYTHON:-python3}
OUT=${OUT:-$REPO/benchmarks/results}
mkdir -p "$OUT"
LOG=$OUT/$(date +%F)-backend-gpu.log
: >"$LOG"
export PYTHONPATH="$REPO${PYTHONPATH:+:$PYTHONPATH}" PYTHONUNBUFFERED=1
if [[ -z "${CUDA_HOME:-}" ]] && command -v nvcc >/dev/null; then
  CUDA_HOME=$(dirname "$(dirname "$(readlink -f "$(command -v nvcc)")")")
  export CUDA_HOME
fi
export MAX_JOBS=${MAX_JOBS:-$(nproc)}
failed=0

step() {  # step NAME LIMIT_S COMMAND...
  local name=$1 limit=$2 t0=$SECONDS rc
  shift 2
  echo "=== $name (limit ${limit} s): $*" | tee -a "$LOG"
  timeout -k 5 "$limit" "$@" 2>&1 | tee -a "$LOG" | tail -n 40
  rc=${PIPESTATUS[0]}
  echo "--- $name: exit $rc after $((SECONDS - t0)) s" | tee -a "$LOG"
  ((rc == 0)) || failed=1
  return "$rc"
}

step environment 60 bash -c "nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader; \
  $PY -c 'import torch, platform; print(platform.python_version(), torch.__version__, torch.version.cuda, torch.cuda.is_available())'; \
  echo CUDA_HOME=\$CUDA_HOME MAX_JOBS=\$MAX_JOBS"
if [[ "${1:-}" != "--skip-build" ]]; then
  # A fresh folder of its own: objects left by setup.py, the clock-only build or an earlier copy of
  # the sources (a warm machine keeps ignored files) are never linked into this build.
  rm -rf build/gpu-backend
  step build 300 "$PY" benchmarks/backend/gpu_build.py build_ext --inplace --build-temp build/gpu-backend ||
    { echo "build failed" | tee -a "$LOG"; exit 1; }
fi
if ! step smoke 120 "$PY" -X faulthandler benchmarks/backend/build_smoke.py; then
  # The native stack of the failure (the image has no gdb; cuda-gdb debugs host code too).
  if command -v cuda-gdb >/dev/null; then
    step smoke_backtrace 180 cuda-gdb -batch -ex run -ex bt --args "$PY" benchmarks/backend/build_smoke.py --single-process
  fi
fi
step cuda_tests 150 "$PY" -m pytest -q -p no:cacheprovider tests/gpu/test_backend_cuda.py
step cpu_tests 180 "$PY" -m pytest -q -p no:cacheprovider tests/unit/test_backend_ops.py \
  tests/unit/test_replay_engine.py tests/unit/test_backend_layout.py tests/unit/test_backend_scale.py
step benchmark 150 "$PY" -m benchmarks.backend.run --quick --out "$OUT"
exit $failed
