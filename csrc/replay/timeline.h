// The device timeline: every time the passes use (an op's issue, arrival and completion, an
// iteration's start and end, a pipeline call's span) is a mark recorded on the stream where the
// program issues the work, and read after the iteration.
//
// A mark is the id of a slot in a ring of int64 cells. Recording it enqueues a stamp that writes the
// device clock into the slot when the stream gets there (device_queue.h); on the host (no queue)
// the slot is written at once with the host clock. Reading it (resolve) waits until the slot has
// been written, so the host only ever blocks where the caller asked for a time. Slots of CUDA marks
// are pinned host memory mapped into the device's address space: the stamp kernel writes there and
// the host reads them without a copy.
//
// A slot is 0 until written (no clock reads 0). The ring holds kSlots marks per memory kind; a mark
// older than that is expired (resolve raises), so read each iteration's marks before recording
// kSlots more. The same rings hold the host flags of ops whose real part completes on a helper
// thread, and the abort cell every device wait watches.
#pragma once

#include <cstdint>

#include "replay/device_queue.h"

namespace prism::timeline {

constexpr int64_t kSlots = int64_t{1} << 18;

// Marks without an explicit queue go to the test device's current stream when it is active, else
// (CUDA builds, after use_cuda(true)) to the current CUDA stream, else they read the host clock.
void use_cuda(bool on);
bool cuda_in_use();
device::Queue* active_queue();
// "host", "test" or "cuda": where mark() records.
const char* active_name();
// Diagnostics: every mark reads the host clock when it is recorded, device or not (what a capture
// that took the host's clock for the device's would see).
void force_host_clock(bool on);

// A mark on the active queue's current stream (or the host clock now).
int64_t mark();
// A mark on `stream` of `queue`; queue null: the host clock now.
int64_t mark_on(device::Queue* queue, device::StreamId stream);
// A host time as a mark (already resolved): for ops timed on the host.
int64_t mark_at(int64_t t_ns);
// A zeroed slot of `queue`'s memory kind for a kernel or helper thread to write (a wait's arrival, a
// host flag); queue null: host memory.
int64_t reserve(device::Queue* queue);

// The slot's cell (device-readable for CUDA marks).
int64_t* cell(int64_t mark_id);
// The slot's value: 0 not yet written, kExpired when the ring has moved past it.
constexpr int64_t kExpired = -1;
int64_t value(int64_t mark_id);
// Blocks until the mark has been written; raises std::runtime_error after timeout_ns or when expired.
int64_t resolve(int64_t mark_id, int64_t timeout_ns);
// Sets a host flag (a slot from reserve) to kFlagDone or kFlagFailed.
void set_flag(int64_t mark_id, int64_t value);

// The cell every device wait watches (of `queue`'s memory kind), and a cell that stays 0 (the start
// of waits issued before any iteration start).
const int64_t* abort_cell(device::Queue* queue);
const int64_t* zero_cell(device::Queue* queue);
// End every device wait now and from now on (the watchdog, when it gives up on the run); clear it
// for a new run (tests).
void abort_device_waits();
void clear_abort();
bool aborted();

}  // namespace prism::timeline
