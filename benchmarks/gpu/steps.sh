# The step machinery of benchmarks/gpu/run.sh, sourced by it (and by its test, which checks the crash
# follow-up on CPU). Needs WORK (a folder for each step's output and steps.tsv), LOG, BUDGET_S,
# START_S (SECONDS at the start) and failed (set to 1 when a step fails); LIMIT_FACTOR (default 1)
# multiplies every step's limit (a dry run on the CPU, slower than the GPU it stands in for).
#
# run_step NAME LIMIT_S PREREQ -- COMMAND... runs one time-boxed step and records it in
# WORK/steps.tsv as ok, skipped, timeout, failed or crashed; a crash (SIGSEGV, SIGABRT, SIGBUS,
# SIGFPE, SIGILL) is followed by NAME_backtrace (gdb, else cuda-gdb) and NAME_malloc_check (one
# rerun under glibc's malloc checking).

say() { echo "$*" | tee -a "$LOG"; }

record() {  # name status seconds note
  printf '%s\t%s\t%s\t%s\n' "$1" "$2" "$3" "$4" >>"$WORK/steps.tsv"
  say "--- $1: $2 (${3} s) $4"
}

first_error() {  # the first compiler, Python or C++ runtime error line of a step's output, for the table
  local line
  line=$(grep -m1 -E '\b(error|ERROR|[A-Za-z]*Error|[A-Za-z]*Exception):|^terminate called' "$1" | tr -d '|\t' | cut -c1-200)
  [[ -n "$line" ]] && echo ": $line"
}

# A crash, as timeout reports it: 128 + SIGILL, SIGABRT, SIGBUS, SIGFPE or SIGSEGV (not SIGKILL,
# which is timeout's own -k).
is_crash() { case "$1" in 132 | 134 | 135 | 136 | 139) return 0 ;; *) return 1 ;; esac; }
# "signal 11 (SEGV)" for an exit status of 128 + 11.
signal_of() { echo "signal $(($1 - 128)) ($(kill -l $(($1 - 128)) 2>/dev/null || echo '?'))"; }

# The debugger for native backtraces: gdb, else cuda-gdb (which debugs host code too; the lent
# image has no gdb), on PATH or in CUDA_HOME.
debugger() {
  command -v gdb || command -v cuda-gdb ||
    { [[ -x "${CUDA_HOME:-}/bin/cuda-gdb" ]] && echo "$CUDA_HOME/bin/cuda-gdb"; }
}
have_debugger() { debugger >/dev/null || { echo "no gdb or cuda-gdb"; return 1; }; }
# glibc >= 2.34 checks malloc (MALLOC_CHECK_) only with its debug library preloaded.
malloc_debug_library() {
  local lib
  for lib in /lib/x86_64-linux-gnu /usr/lib/x86_64-linux-gnu /lib64 /usr/lib64 /lib/aarch64-linux-gnu; do
    [[ -e "$lib/libc_malloc_debug.so.0" ]] && { echo "$lib/libc_malloc_debug.so.0"; return 0; }
  done
  return 1
}

# After step NAME crashed running COMMAND: its native backtrace, then one rerun with glibc's malloc
# checking, which reports heap corruption where it happens instead of where it later crashes. Each
# is a step of its own (NAME_backtrace, NAME_malloc_check); neither is followed up again.
crash_followup() {
  local name=$1 limit_s=$2
  shift 2
  local gdb_bin preload
  gdb_bin=$(debugger)
  following_up=1
  run_step "${name}_backtrace" "$limit_s" have_debugger -- "$gdb_bin" -batch -return-child-result \
    -ex 'set pagination off' -ex 'set print thread-events off' -ex 'handle SIGPIPE nostop noprint pass' \
    -ex run -ex bt \
    --args "$@"
  if preload=$(malloc_debug_library); then
    say "(malloc check: MALLOC_CHECK_=3, LD_PRELOAD=$preload)"
    run_step "${name}_malloc_check" "$limit_s" : -- env MALLOC_CHECK_=3 LD_PRELOAD="$preload${LD_PRELOAD:+:$LD_PRELOAD}" "$@"
  else
    say "(malloc check: glibc's libc_malloc_debug.so.0 not found; MALLOC_CHECK_=3 alone)"
    run_step "${name}_malloc_check" "$limit_s" : -- env MALLOC_CHECK_=3 "$@"
  fi
  following_up=0
}
following_up=0

# run_step NAME LIMIT_S PREREQ -- COMMAND...: PREREQ is a function printing why it is unmet (or
# ":" for none); the command's output goes to the console and the log; {out} in it becomes WORK/NAME.
# A crash is followed by crash_followup with the same command.
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
  limit_s=$((limit_s * ${LIMIT_FACTOR:-1}))
  ((limit_s > left_s)) && limit_s=$left_s
  mkdir -p "$WORK/$name"
  local cmd=("${@//\{out\}/$WORK/$name}")
  say "=== $name (limit ${limit_s} s): ${cmd[*]}"
  local t0=$SECONDS rc
  timeout -k 10 "$limit_s" "${cmd[@]}" 2>&1 | tee -a "$LOG" "$WORK/$name.out"
  rc=${PIPESTATUS[0]}
  local elapsed_s=$((SECONDS - t0)) first
  first=$(first_error "$WORK/$name.out")
  if ((rc == 0)); then
    record "$name" ok "$elapsed_s" ""
  elif ((rc == 124 || (rc == 137 && elapsed_s >= limit_s))); then
    record "$name" timeout "$elapsed_s" "killed at ${limit_s} s (SIGTERM, SIGKILL 10 s later)$first"
    failed=1
  elif is_crash "$rc" && ((following_up == 0)); then
    record "$name" crashed "$elapsed_s" "$(signal_of "$rc")$first"
    failed=1
    crash_followup "$name" "$limit_s" "${cmd[@]}"
  elif ((rc > 128)); then  # killed by a signal of its own (SIGKILL before the limit: out of memory?)
    record "$name" crashed "$elapsed_s" "$(signal_of "$rc")$first"
    failed=1
  else
    record "$name" failed "$elapsed_s" "exit status $rc$first"
    failed=1
  fi
}

# A prerequisite: step NAME ran and did not pass (failed, timeout or crashed).
step_failed() {
  local status
  status=$(awk -F'\t' -v name="$1" '$1 == name {print $2}' "$WORK/steps.tsv" 2>/dev/null)
  [[ -n "$status" && "$status" != ok && "$status" != skipped ]] || { echo "$1 did not fail"; return 1; }
}
