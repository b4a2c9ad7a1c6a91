// The device timeline's rings of marks (contract in timeline.h).
#include "replay/timeline.h"

#include <algorithm>
#include <atomic>
#include <chrono>
#include <cstdlib>
#include <mutex>
#include <stdexcept>
#include <string>
#include <thread>

#include "replay/clock.h"

#ifdef PRISM_WITH_CUDA
#include <cuda_runtime_api.h>
#endif

namespace prism::timeline {

namespace {

// Cells after the ring's slots: the abort cell and a cell that stays 0.
constexpr int64_t kAbortIndex = kSlots;
constexpr int64_t kZeroIndex = kSlots + 1;
constexpr int64_t kNumCells = kSlots + 2;
// Mark ids of the device-memory ring carry this bit; host-memory ids do not.
constexpr int64_t kDeviceRingBit = int64_t{1} << 62;

int64_t load(const int64_t* cell) { return __atomic_load_n(cell, __ATOMIC_ACQUIRE); }
void store(int64_t* cell, int64_t value) { __atomic_store_n(cell, value, __ATOMIC_RELEASE); }

struct Ring {
  int64_t* cells = nullptr;
  std::atomic<int64_t> next{0};
  std::once_flag made;
};

Ring host_ring;
std::atomic<bool> cuda_on{false};
std::atomic<bool> host_clock_forced{false};

Ring& host_memory() {
  std::call_once(host_ring.made, [] {
    // Never freed: helper threads and stamps may write until the process ends.
    host_ring.cells = static_cast<int64_t*>(std::calloc(kNumCells, sizeof(int64_t)));
    if (host_ring.cells == nullptr) {
      throw std::runtime_error("prism timeline: out of host memory for the mark ring");
    }
  });
  return host_ring;
}

#ifdef PRISM_WITH_CUDA
Ring device_ring;

Ring& device_memory() {
  std::call_once(device_ring.made, [] {
    void* memory = nullptr;
    const cudaError_t status =
        cudaHostAlloc(&memory, kNumCells * sizeof(int64_t), cudaHostAllocMapped | cudaHostAllocPortable);
    if (status != cudaSuccess) {
      throw std::runtime_error(std::string("prism timeline: cudaHostAlloc of the mark ring failed: ") +
                               cudaGetErrorString(status));
    }
    device_ring.cells = static_cast<int64_t*>(memory);
    for (int64_t i = 0; i < kNumCells; ++i) {
      device_ring.cells[i] = 0;
    }
  });
  return device_ring;
}
#endif

bool in_device_memory(const device::Queue* queue) { return queue != nullptr && !queue->data_on_host(); }

Ring& ring_of_queue(const device::Queue* queue) {
#ifdef PRISM_WITH_CUDA
  if (in_device_memory(queue)) {
    return device_memory();
  }
#else
  (void)queue;
#endif
  return host_memory();
}

Ring& ring_of_id(int64_t mark_id) {
#ifdef PRISM_WITH_CUDA
  if (mark_id & kDeviceRingBit) {
    return device_memory();
  }
#endif
  return host_memory();
}

int64_t sequence(int64_t mark_id) { return mark_id & ~kDeviceRingBit; }

// A fresh zeroed slot of the queue's ring; returns its id.
int64_t take(const device::Queue* queue) {
  Ring& ring = ring_of_queue(queue);
  const int64_t seq = ring.next.fetch_add(1);
  store(&ring.cells[seq & (kSlots - 1)], 0);
  return seq | (in_device_memory(queue) ? kDeviceRingBit : 0);
}

}  // namespace

void use_cuda(bool on) { cuda_on.store(on); }
bool cuda_in_use() { return cuda_on.load(); }

device::Queue* active_queue() {
  if (device::Queue* test = device::test_queue()) {
    return test;
  }
#ifdef PRISM_WITH_CUDA
  if (cuda_on.load()) {
    return device::current_cuda_queue();
  }
#endif
  return nullptr;
}

const char* active_name() {
  const device::Queue* queue = active_queue();
  return queue == nullptr ? "host" : queue->name();
}

int64_t mark() {
  device::Queue* queue = active_queue();
  return mark_on(queue, queue == nullptr ? 0 : queue->current_stream());
}

void force_host_clock(bool on) { host_clock_forced.store(on); }

int64_t mark_on(device::Queue* queue, device::StreamId stream) {
  if (queue == nullptr || host_clock_forced.load()) {
    return mark_at(clock::now_ns());
  }
  const int64_t id = take(queue);
  queue->stamp(stream, cell(id));
  return id;
}

int64_t mark_at(int64_t t_ns) {
  const int64_t id = take(nullptr);
  store(cell(id), t_ns);
  return id;
}

int64_t reserve(device::Queue* queue) { return take(queue); }

int64_t* cell(int64_t mark_id) { return &ring_of_id(mark_id).cells[sequence(mark_id) & (kSlots - 1)]; }

int64_t value(int64_t mark_id) {
  if (mark_id < 0) {
    return kExpired;
  }
  Ring& ring = ring_of_id(mark_id);
  const int64_t seq = sequence(mark_id);
  if (seq >= ring.next.load() || seq + kSlots <= ring.next.load()) {
    return kExpired;
  }
  return load(&ring.cells[seq & (kSlots - 1)]);
}

int64_t resolve(int64_t mark_id, int64_t timeout_ns) {
  const int64_t deadline_ns = clock::now_ns() + timeout_ns;
  int64_t pause_ns = 1'000;
  for (;;) {
    const int64_t t = value(mark_id);
    if (t == kExpired) {
      throw std::runtime_error("prism timeline: mark " + std::to_string(sequence(mark_id)) +
                               " has expired (more than " + std::to_string(kSlots) +
                               " marks were recorded before it was read)");
    }
    if (t != 0) {
      return t;
    }
    if (clock::now_ns() > deadline_ns) {
      throw std::runtime_error("prism timeline: the device did not reach mark " + std::to_string(sequence(mark_id)) +
                               " within " + std::to_string(timeout_ns / 1'000'000'000) +
                               " s (--prism-timeout): a stream is stuck; see the flight recorder");
    }
    std::this_thread::sleep_for(std::chrono::nanoseconds(pause_ns));
    pause_ns = std::min<int64_t>(pause_ns * 2, 200'000);
  }
}

void set_flag(int64_t mark_id, int64_t flag) { store(cell(mark_id), flag); }

const int64_t* abort_cell(device::Queue* queue) { return &ring_of_queue(queue).cells[kAbortIndex]; }
const int64_t* zero_cell(device::Queue* queue) { return &ring_of_queue(queue).cells[kZeroIndex]; }

void abort_device_waits() {
  store(&host_memory().cells[kAbortIndex], device::kAbort);
#ifdef PRISM_WITH_CUDA
  if (device_ring.cells != nullptr) {
    store(&device_ring.cells[kAbortIndex], device::kAbort);
  }
#endif
}

void clear_abort() {
  store(&host_memory().cells[kAbortIndex], 0);
#ifdef PRISM_WITH_CUDA
  if (device_ring.cells != nullptr) {
    store(&device_ring.cells[kAbortIndex], 0);
  }
#endif
}

bool aborted() { return load(&host_memory().cells[kAbortIndex]) != 0; }

}  // namespace prism::timeline
