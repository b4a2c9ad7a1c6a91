// The device the program's ops run on, as the backend and the timeline see it: streams that run
// work in order, events between streams, and the replay engine's three kernels (stamp the clock,
// wait until a completion time, wait for a host flag).
//
// Two implementations share one interface so that the logic above them is written once and proven
// without a GPU: CUDA (cuda_queue.cpp, CUDA builds) and the asynchronous test device
// (test_device.cpp, every build): streams run by worker threads, the host running ahead of them
// until it synchronises. Ops on the host itself (CPU tensors, no test device) have no queue: they
// complete on the host (backend/work.cpp) and marks read the host clock.
//
// Device time is each queue's own clock, in ns: the GPU global timer on CUDA, CLOCK_MONOTONIC on the
// test device (its workers read it when a stream gets somewhere). Marks of one queue are compared
// with each other, never with the host's.
#pragma once

#include <cstdint>
#include <functional>
#include <memory>

namespace prism::device {

// A stream of a queue (a cudaStream_t, or a test-device stream's index), opaque to callers.
using StreamId = intptr_t;

// A point in a stream: done once the stream has run everything enqueued before it.
class Event {
 public:
  virtual ~Event() = default;
};

// Written into a wait's abort cell: the watchdog gave up on the run; every device wait ends now.
constexpr int64_t kAbort = 1;
// Written into a host flag: the host part of an op is done (kFlagDone) or failed (kFlagFailed); the
// device moves on either way (a failure is raised on the host).
constexpr int64_t kFlagDone = 1;
constexpr int64_t kFlagFailed = 2;

class Queue {
 public:
  virtual ~Queue() = default;
  virtual const char* name() const = 0;

  // The stream the calling thread issues work on now (CUDA: the current stream of the device).
  virtual StreamId current_stream() = 0;
  // A stream of its own, for the backend (like NCCL's communication stream): created for the
  // caller and never handed out again, so two streams a caller asked for are never one. (CUDA: not
  // torch's pool of 32 streams per device, which hands the same stream out again every 32nd call:
  // a helper stream that was the communication stream would wait on itself.)
  virtual StreamId new_stream() = 0;
  // Whether the stream is being captured into a CUDA graph now. An op with waits on the device
  // clock or on host flags cannot be captured: a replay would replay old times and flags.
  virtual bool capturing(StreamId stream) = 0;

  // An event at the stream's current end; `wait` makes another stream wait for it on the device.
  virtual std::shared_ptr<Event> record(StreamId stream) = 0;
  virtual void wait(StreamId stream, const std::shared_ptr<Event>& event) = 0;
  // Whether the event is done; throws when the device reports an error (CUDA: a sticky error).
  virtual bool query(const Event& event) = 0;
  // Blocks the calling host thread until the event is done (helper threads only: the program's
  // thread never blocks where a collective library would not).
  virtual void synchronize(const Event& event) = 0;

  // Enqueue: write the device clock (ns) to *cell when the stream gets there.
  virtual void stamp(StreamId stream, int64_t* cell) = 0;
  // Enqueue: when the stream gets there at device time t0, write max(t0, *start_cell +
  // arrival_offset_ns) to *arrived_cell (when not null) and hold the stream until that + cost_ns,
  // or until *abort_cell is non-zero. The replay engine's completion rule, decided on the device.
  virtual void wait_until(StreamId stream, const int64_t* start_cell, int64_t arrival_offset_ns, int64_t cost_ns,
                          int64_t* arrived_cell, const int64_t* abort_cell) = 0;
  // Enqueue: hold the stream until *flag (host memory the device can read) or *abort_cell is non-zero.
  virtual void wait_flag(StreamId stream, const int64_t* flag, const int64_t* abort_cell) = 0;
  // Enqueue compute lasting duration_ns (the sleep-compute workload): a spin kernel on CUDA, a
  // sleep on the test device.
  virtual void compute(StreamId stream, int64_t duration_ns) = 0;

  // Whether data ops run on the host at issue (the test device: its tensors are host tensors, so
  // the program's own ops on them already ran in program order) rather than on the stream (CUDA).
  virtual bool data_on_host() const = 0;
};

// The test device's queue when it is active, else null (test_device.cpp).
Queue* test_queue();

#ifdef PRISM_WITH_CUDA
// The CUDA queue of a device (cuda_queue.cpp), made on first use.
Queue* cuda_queue(int device_index);
// The CUDA queue of the current device.
Queue* current_cuda_queue();
#endif

}  // namespace prism::device
