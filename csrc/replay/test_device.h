// The asynchronous test device: CUDA's semantics that the device timeline and the backend's device
// path depend on, without a GPU, so that logic is proven on every CPU machine.
//
// What it keeps of CUDA: work enqueued on a stream runs later, in order, on that stream's worker
// thread, while the host runs ahead; streams run concurrently; an event marks a stream's progress,
// another stream can wait for it on the device (wait) and the host can block on it (synchronize);
// the device has its own clock, read when a stream gets somewhere (CLOCK_MONOTONIC, read by the
// workers). What it leaves out: memory. Tensors stay host tensors, and the program's own ops on them
// run on the host in program order, so only time runs on the streams: compute (sleeps of a given
// length, the sleep-compute workload's kernels), stamps, waits and the real parts of collectives.
//
// Stream 0 is the default stream. Each host thread has a current stream (0 until set). Streams
// live until the process ends (deactivate only synchronises and stops routing work here), so ids a
// backend holds stay valid across activations.
#pragma once

#include <cstdint>
#include <memory>
#include <string>

#include "replay/device_queue.h"

namespace prism::test_device {

void activate();
// Synchronises every stream, then ops and marks go back to the host.
void deactivate();
bool active();

device::Queue& queue();
device::StreamId new_stream();
device::StreamId current_stream();
void set_current_stream(device::StreamId stream);
// Host blocks until every stream has run what was enqueued so far.
void synchronize();
void synchronize_stream(device::StreamId stream);
// Items enqueued and not yet run, over all streams (a test sees the host run ahead).
int64_t num_pending();
// Streams made so far, the default stream included (a test sees who asks for streams, and how often).
int64_t num_streams();
// CUDA's states a backend must handle, staged for tests: a stream being captured into a graph
// (Queue::capturing answers true for it), and a sticky device error (every Queue::query throws
// `message` until it is set to "").
void set_capturing(device::StreamId stream, bool on);
void set_device_error(const std::string& message);

}  // namespace prism::test_device
