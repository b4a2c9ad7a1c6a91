// Device-side waits of the replay engine (contract in clock.h), compiled only in CUDA builds.
//
// A collective with virtual members must complete on the stream when the replay schedule says, and
// work on other streams must keep running meanwhile, exactly as under NCCL. So the wait is a kernel
// of one thread on the communication stream that spins on the GPU global timer (%globaltimer, ns)
// until the completion time; the host enqueues it and moves on, never learning when the stream got
// there. A tiny stamp kernel writes the iteration's start to device memory, and the wait kernel reads
// it when it starts, so the whole rule max(own arrival, start + offset) + cost is decided on the device.
//
// Plain CUDA runtime only (no torch headers): nvcc compiles this file in a few seconds. The tensor and
// stream plumbing for Python is in clock_bindings.cpp.
#include "replay/clock.h"

#include <cuda_runtime.h>

#include <algorithm>
#include <stdexcept>
#include <string>
#include <vector>

namespace prism::cuda_clock {

namespace {

// Spinning threads sleep in steps of this much while the deadline is far, so the waiting warp takes
// fewer issue slots from compute warps sharing its SM; the last stretch is a plain spin.
constexpr unsigned kNapNs = 1000;
constexpr int64_t kNapWhileRemainingAboveNs = 4 * kNapNs;

// How long measure_wait_errors_ns holds the stream before its samples: time for the host to enqueue
// a few thousand launches.
constexpr int64_t kMeasurementGateNs = 20'000'000;

// Bound on timer reads while sampling its steps, so a timer that never ticks cannot hang the kernel.
constexpr int64_t kMaxTimerReads = int64_t{1} << 26;

__device__ __forceinline__ int64_t globaltimer_ns() {
  uint64_t t_ns;
  asm volatile("mov.u64 %0, %%globaltimer;" : "=l"(t_ns));
  return static_cast<int64_t>(t_ns);
}

__device__ int64_t read_volatile(const int64_t* cell) { return *static_cast<const volatile int64_t*>(cell); }

// The abort cell is read only while the deadline is far (a read of mapped host memory crosses the
// bus, ~1 us): the last stretch spins on the timer alone, so precision does not suffer.
__device__ void spin_until_ns(int64_t deadline_ns, const int64_t* abort) {
  for (int64_t remaining_ns = deadline_ns - globaltimer_ns(); remaining_ns > 0;
       remaining_ns = deadline_ns - globaltimer_ns()) {
    if (remaining_ns > kNapWhileRemainingAboveNs) {
      if (abort != nullptr && read_volatile(abort) != 0) {
        return;
      }
#if __CUDA_ARCH__ >= 700
      __nanosleep(kNapNs);
#endif
    }
  }
}

__global__ void stamp_kernel(int64_t* dst) { *static_cast<volatile int64_t*>(dst) = globaltimer_ns(); }

__global__ void wait_until_kernel(const int64_t* iteration_start, int64_t arrival_offset_ns, int64_t cost_ns,
                                  int64_t* arrived, const int64_t* abort) {
  const int64_t own_arrival_ns = globaltimer_ns();
  const int64_t all_arrived_ns = max(own_arrival_ns, read_volatile(iteration_start) + arrival_offset_ns);
  if (arrived != nullptr) {
    *static_cast<volatile int64_t*>(arrived) = all_arrived_ns;
  }
  spin_until_ns(all_arrived_ns + cost_ns, abort);
}

__global__ void wait_flag_kernel(const int64_t* flag, const int64_t* abort) {
  while (read_volatile(flag) == 0 && read_volatile(abort) == 0) {
#if __CUDA_ARCH__ >= 700
    __nanosleep(kNapNs);
#endif
  }
}

__global__ void spin_kernel(int64_t duration_ns) { spin_until_ns(globaltimer_ns() + duration_ns, nullptr); }

// Records in steps_ns the differences between consecutive distinct timer readings.
__global__ void timer_steps_kernel(int64_t* steps_ns, int num_steps) {
  int64_t previous_ns = globaltimer_ns();
  int recorded = 0;
  for (int64_t reads = 0; recorded < num_steps && reads < kMaxTimerReads; ++reads) {
    const int64_t t_ns = globaltimer_ns();
    if (t_ns != previous_ns) {
      steps_ns[recorded++] = t_ns - previous_ns;
      previous_ns = t_ns;
    }
  }
  for (; recorded < num_steps; ++recorded) {
    steps_ns[recorded] = 0;  // the timer stopped ticking: report it as a zero step
  }
}

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("prism cuda_clock: ") + what + " failed: " + cudaGetErrorString(status));
  }
}

// Device buffer of int64 values, freed on scope exit (measurement helpers only, not the hot path).
class DeviceBuffer {
 public:
  explicit DeviceBuffer(size_t count) { check(cudaMalloc(&data_, count * sizeof(int64_t)), "cudaMalloc"); }
  ~DeviceBuffer() { cudaFree(data_); }
  DeviceBuffer(const DeviceBuffer&) = delete;
  DeviceBuffer& operator=(const DeviceBuffer&) = delete;
  int64_t* get() const { return data_; }

 private:
  int64_t* data_ = nullptr;
};

std::vector<int64_t> copy_to_host(cudaStream_t stream, const DeviceBuffer& buffer, size_t count) {
  std::vector<int64_t> host(count);
  check(cudaStreamSynchronize(stream), "cudaStreamSynchronize");
  check(cudaMemcpy(host.data(), buffer.get(), count * sizeof(int64_t), cudaMemcpyDeviceToHost), "cudaMemcpy");
  return host;
}

}  // namespace

void enqueue_stamp(cudaStream_t stream, int64_t* dst) {
  stamp_kernel<<<1, 1, 0, stream>>>(dst);
  check(cudaGetLastError(), "launching the stamp kernel");
}

void enqueue_wait_until(cudaStream_t stream, const int64_t* iteration_start, int64_t arrival_offset_ns,
                        int64_t cost_ns, int64_t* arrived, const int64_t* abort) {
  wait_until_kernel<<<1, 1, 0, stream>>>(iteration_start, arrival_offset_ns, cost_ns, arrived, abort);
  check(cudaGetLastError(), "launching the wait-until kernel");
}

void enqueue_wait_flag(cudaStream_t stream, const int64_t* flag, const int64_t* abort) {
  wait_flag_kernel<<<1, 1, 0, stream>>>(flag, abort);
  check(cudaGetLastError(), "launching the wait-flag kernel");
}

void enqueue_spin(cudaStream_t stream, int64_t duration_ns) {
  spin_kernel<<<1, 1, 0, stream>>>(duration_ns);
  check(cudaGetLastError(), "launching the spin kernel");
}

std::vector<int64_t> measure_wait_errors_ns(cudaStream_t stream, int64_t duration_ns, int num_waits) {
  // Per wait: stamp start, wait until start + duration (half as the peers' arrival offset, half as
  // cost, so both terms of the rule are exercised), stamp end. The error is what the next op on the
  // stream sees: end stamp - (start + duration), including the wait kernel's exit and the launch gap.
  const size_t count = 2 * static_cast<size_t>(std::max(num_waits, 0));
  if (count == 0) {
    return {};
  }
  const int64_t arrival_offset_ns = duration_ns / 2;
  const int64_t cost_ns = duration_ns - arrival_offset_ns;
  DeviceBuffer stamps(count + 1);
  // Hold the stream while the host enqueues the samples, so they run back to back as the engine's
  // kernels do when enqueued ahead of the device, not paced by the host's launch rate.
  int64_t* gate = stamps.get() + count;
  enqueue_stamp(stream, gate);
  enqueue_wait_until(stream, gate, kMeasurementGateNs, 0);
  for (int i = 0; i < num_waits; ++i) {
    int64_t* start = stamps.get() + 2 * i;
    enqueue_stamp(stream, start);
    enqueue_wait_until(stream, start, arrival_offset_ns, cost_ns);
    enqueue_stamp(stream, start + 1);
  }
  const std::vector<int64_t> host = copy_to_host(stream, stamps, count);
  std::vector<int64_t> errors_ns(static_cast<size_t>(num_waits));
  for (int i = 0; i < num_waits; ++i) {
    errors_ns[i] = host[2 * i + 1] - (host[2 * i] + duration_ns);
  }
  return errors_ns;
}

std::vector<int64_t> sample_timer_steps_ns(cudaStream_t stream, int num_steps) {
  if (num_steps <= 0) {
    return {};
  }
  DeviceBuffer steps(static_cast<size_t>(num_steps));
  timer_steps_kernel<<<1, 1, 0, stream>>>(steps.get(), num_steps);
  check(cudaGetLastError(), "launching the timer-steps kernel");
  return copy_to_host(stream, steps, static_cast<size_t>(num_steps));
}

}  // namespace prism::cuda_clock
