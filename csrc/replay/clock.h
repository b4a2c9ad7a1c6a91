// Time primitives of the replay engine: one clock for the host, precise waits on CPU, and (CUDA
// builds) wait-until kernels that spin on the GPU global timer so other streams keep running.
//
// Contract shared by the backend and the engine; implementations in clock.cpp and wait_kernel.cu.
#pragma once

#include <cstdint>
#include <vector>

#ifdef PRISM_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace prism::clock {

// CLOCK_MONOTONIC in ns: the same clock as Python's time.monotonic_ns(), so Python and C++ agree.
int64_t now_ns();

// Lower the calling thread's timer slack to 1 ns (Linux; a no-op elsewhere). Threads created
// afterwards by this thread inherit it. Cuts ~50 us from every timed sleep.
void lower_timer_slack();

// Block the calling thread until now_ns() >= deadline_ns: a timed sleep until shortly before the
// deadline, then a spin. Returns at once when the deadline has passed. Never touches Python: callers
// release the GIL first.
void wait_until_ns(int64_t deadline_ns);

// The spin window wait_until_ns(deadline_ns) uses: how long before the deadline it stops sleeping.
int64_t default_spin_window_ns();

// wait_until_ns with an explicit spin window (0: sleep only; >= the wait: spin only). For
// measurements that choose the window; callers on the hot path use the one-argument form.
void wait_until_ns(int64_t deadline_ns, int64_t spin_window_ns);

// Whether this process owns its cores (no other process of the job runs on them): its threads then
// wait for a peer actively instead of sleeping (the backend's polling of real parts, await_until_ns).
// Off by default; the backend's activation sets it (prism_megatron.backend.activate).
void set_active_waits(bool active);
bool active_waits();

// The calling thread waits for a peer until deadline_ns (a virtual member's completion, an agreed
// start): with active waits it keeps its core, yielding to the process's other threads (gloo's)
// until the spin window and spinning the rest; otherwise wait_until_ns. A thread that sleeps gives
// its core up, and on a virtual machine the computation after the wake-up runs slower (one real
// rank of the demo's job computed a median 1.41x its capture's when its waits slept, 1.09x when they
// kept the core: benchmarks/fidelity/emulated_compute.py), so a process that owns its core does not
// sleep while its program waits.
void await_until_ns(int64_t deadline_ns);

// Perform num_waits waits of duration_ns each (deadline = now_ns() + duration_ns) back to back and
// return each wait's completion error (return time - deadline, ns), with no Python in the loop.
std::vector<int64_t> measure_wait_errors_ns(int64_t duration_ns, int num_waits, int64_t spin_window_ns);

}  // namespace prism::clock

#ifdef PRISM_WITH_CUDA
namespace prism::cuda_clock {

// Enqueue on `stream` a one-thread kernel that writes the GPU global timer (ns) to *dst.
// Used to stamp the start of an iteration on the device.
void enqueue_stamp(cudaStream_t stream, int64_t* dst);

// Enqueue on `stream` a one-thread kernel that, when it starts at GPU time t0, spins until the GPU
// global timer reaches max(t0, *iteration_start + arrival_offset_ns) + cost_ns. This is a
// collective's completion as the replay engine defines it, decided on the device, so the host never
// waits where the collective library would not. When given, it writes max(t0, *iteration_start +
// arrival_offset_ns) (every member's arrival) to *arrived, and it ends early once *abort is
// non-zero (the host watchdog gave up on the run). The pointers may be mapped host memory.
void enqueue_wait_until(cudaStream_t stream, const int64_t* iteration_start, int64_t arrival_offset_ns,
                        int64_t cost_ns, int64_t* arrived = nullptr, const int64_t* abort = nullptr);

// Enqueue on `stream` a one-thread kernel that spins until *flag (mapped host memory a host thread
// sets) or *abort is non-zero: the stream waits for work done on the host (a real part over gloo).
void enqueue_wait_flag(cudaStream_t stream, const int64_t* flag, const int64_t* abort);

// Enqueue on `stream` a one-thread kernel that spins for duration_ns from when it starts: compute
// of a known length (the sleep-compute workload on a GPU).
void enqueue_spin(cudaStream_t stream, int64_t duration_ns);

// On `stream`, after holding it 20 ms so the samples run back to back, num_waits times: stamp a
// start, wait until start + duration_ns (half of it as the peers' arrival offset, half as cost),
// stamp the end. Blocks until done and returns each wait's
// error, end stamp - (start + duration_ns) in GPU-timer ns: what the next op on the stream sees.
std::vector<int64_t> measure_wait_errors_ns(cudaStream_t stream, int64_t duration_ns, int num_waits);

// On `stream`, read the GPU global timer until it has changed num_steps times; blocks and returns the
// size of each change (ns): the timer's resolution, which bounds every device wait's precision.
std::vector<int64_t> sample_timer_steps_ns(cudaStream_t stream, int num_steps);

}  // namespace prism::cuda_clock
#endif
