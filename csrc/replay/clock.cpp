// The host clock and the CPU timed wait of the replay engine (contract in clock.h).
//
// A timed sleep alone overshoots by 10-100+ us even with 1 ns timer slack, and the overshoot grows
// with the length of the sleep; a spin alone burns a core for the whole wait. So a wait sleeps in
// absolute-deadline steps until a spin window before the deadline, then spins the last stretch with a
// pause instruction. The window was chosen by measurement (benchmarks/clock/run.py).
//
// Light headers only (no torch, no pybind): this file compiles in about a second.
#include "replay/clock.h"

#include <sched.h>

#include <algorithm>
#include <atomic>
#include <ctime>

#if defined(__linux__)
#include <sys/prctl.h>
#endif

#if defined(__x86_64__) || defined(__i386__)
#include <immintrin.h>
#endif

namespace prism::clock {

namespace {

constexpr int64_t kNsPerSecond = 1'000'000'000;

// Spin the last stretch before a deadline. Measured on a 2-core KVM guest with 1 ns slack
// (benchmarks/clock/run.py): a sleep of <= 1 ms wakes 25-45 us late at the median and 50-100 us at
// p99, so a 100 us window makes the completion error ~0.1 us at the median and < 1 us at p99 on an
// idle core, while a 60 us window still let ~1-2 % of waits finish 30-100 us late. The price is up
// to 100 us of spinning per wait. On a loaded machine (more runnable threads than cores) a spinning
// thread can lose its core for a scheduler slice (~4 ms): no window helps there, so the goal holds
// only on an idle core.
constexpr int64_t kDefaultSpinWindowNs = 100'000;

// Longest single sleep step. Long sleeps wake later than short ones (there a single 10 ms sleep woke
// ~110 us late at the median, 1 ms steps ~35-55 us), so a long wait sleeps in steps and re-reads the
// clock between them; the wake-ups cost a few us of CPU each.
constexpr int64_t kMaxSleepStepNs = 1'000'000;

inline void cpu_relax() {
#if defined(__x86_64__) || defined(__i386__)
  _mm_pause();
#elif defined(__aarch64__)
  asm volatile("yield" ::: "memory");
#endif
}

timespec to_timespec(int64_t t_ns) {
  timespec ts;
  ts.tv_sec = static_cast<time_t>(t_ns / kNsPerSecond);
  ts.tv_nsec = static_cast<long>(t_ns % kNsPerSecond);
  return ts;
}

// Sleep until the monotonic clock reads wake_ns (absolute, so a signal or an early wake-up never
// lengthens the total); returns early only on EINTR, which the caller's loop absorbs.
void sleep_until_ns(int64_t wake_ns) {
  const timespec ts = to_timespec(wake_ns);
  clock_nanosleep(CLOCK_MONOTONIC, TIMER_ABSTIME, &ts, nullptr);
}

}  // namespace

int64_t now_ns() {
  timespec ts;
  clock_gettime(CLOCK_MONOTONIC, &ts);
  return static_cast<int64_t>(ts.tv_sec) * kNsPerSecond + ts.tv_nsec;
}

void lower_timer_slack() {
#if defined(__linux__)
  prctl(PR_SET_TIMERSLACK, 1UL, 0UL, 0UL, 0UL);
#endif
}

int64_t default_spin_window_ns() { return kDefaultSpinWindowNs; }

void wait_until_ns(int64_t deadline_ns, int64_t spin_window_ns) {
  const int64_t spin_from_ns = deadline_ns - std::max<int64_t>(spin_window_ns, 0);
  for (int64_t t_ns = now_ns(); t_ns < spin_from_ns; t_ns = now_ns()) {
    sleep_until_ns(std::min(spin_from_ns, t_ns + kMaxSleepStepNs));
  }
  while (now_ns() < deadline_ns) {
    cpu_relax();
  }
}

void wait_until_ns(int64_t deadline_ns) { wait_until_ns(deadline_ns, kDefaultSpinWindowNs); }

namespace {
std::atomic<bool>& active() {
  static std::atomic<bool> flag{false};
  return flag;
}
}  // namespace

void set_active_waits(bool on) { active().store(on); }

bool active_waits() { return active().load(std::memory_order_relaxed); }

void await_until_ns(int64_t deadline_ns) {
  if (!active_waits()) {
    wait_until_ns(deadline_ns);
    return;
  }
  while (now_ns() < deadline_ns - kDefaultSpinWindowNs) {
    sched_yield();  // the core stays this process's; its other threads (gloo's) still run at once
  }
  wait_until_ns(deadline_ns);  // inside the spin window now: it spins the rest
}

std::vector<int64_t> measure_wait_errors_ns(int64_t duration_ns, int num_waits, int64_t spin_window_ns) {
  std::vector<int64_t> errors_ns;
  errors_ns.reserve(static_cast<size_t>(std::max(num_waits, 0)));
  for (int i = 0; i < num_waits; ++i) {
    const int64_t deadline_ns = now_ns() + duration_ns;
    wait_until_ns(deadline_ns, spin_window_ns);
    errors_ns.push_back(now_ns() - deadline_ns);
  }
  return errors_ns;
}

}  // namespace prism::clock
