// The op log of this process: a flight recorder (the last N ops, always on, dumped on request, on
// timeout and at exit on failure) and the recording of the capture pass (every op between start and
// stop, exported as OpEvents for the execution graph).
//
// Both see the same records: the backend logs each op when it is issued and updates it when it
// completes, through the id begin() returns. Light headers only.
#pragma once

#include <cstdint>
#include <deque>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

#include "replay/engine.h"

namespace prism::replay {

// A group as logs name it: its members (global virtual ranks, group order) and a short label.
struct GroupInfo {
  std::vector<int64_t> members;
  std::string label;  // e.g. "group 3 [0, 8, ..., 8184] (1024 ranks)"
};

enum class OpState : int32_t { kPending = 0, kCompleted = 1, kFailed = 2 };

struct OpRecord {
  OpKind kind = OpKind::kAllReduce;
  std::shared_ptr<const GroupInfo> group;  // for p2p: (self, peer)
  int64_t peer = -1;                       // p2p peer's virtual rank; -1 for collectives
  int64_t seq = 0;                         // per-group sequence number (p2p: per peer and direction)
  int64_t size_bytes = 0;
  std::string dtype;
  int64_t issue_ns = 0;     // the program issued the op
  int64_t start_ns = 0;     // every member had arrived (the op could start moving data)
  int64_t complete_ns = -1; // the op completed (-1: not yet)
  // Its real part (the work on the real sub-communicator) was seen complete by the thread that
  // drove the op, on the host path (-1: none, or not yet): how long the real members took,
  // apart from the replay engine's deadline.
  int64_t real_done_ns = -1;
  // When the replay engine completes it (its virtual members' arrival in the replay schedule plus
  // its cost), on the host path (-1: no virtual member, an op no schedule holds, or on a device).
  // The program sees the op complete later where it asks later: that host work belongs to the
  // compute after the op (graph/capture.py).
  int64_t engine_done_ns = -1;
  // When the program first waited on the op (Work::wait), on the host path (-1: it never did, or
  // on a device). An async op's wait can end long after the program reached it; the compute before
  // it ends here, not at the completion (graph/capture.py).
  int64_t wait_ns = -1;
  // On a device (device_queue.h) the three times are marks on the device timeline (timeline.h),
  // read when the recording is exported; -1: the time above is a host time.
  int64_t issue_mark = -1;
  int64_t start_mark = -1;
  int64_t complete_mark = -1;
  // Where the program first waited on the op, as a mark (the pipeline interceptor's transfers, whose
  // wait the program makes outside the backend; on a device, on the waiting stream): -1, none.
  // Read into wait_ns when the recording is exported.
  int64_t wait_mark = -1;
  bool async_op = false;
  bool has_virtual = false;
  OpState state = OpState::kPending;
};

class OpLog {
 public:
  // Log an issued op; returns its id for complete().
  int64_t begin(OpRecord record);
  // The op `id` completed (ok) or failed at t_ns. Ids that left both the ring and the recording are
  // ignored.
  void complete(int64_t id, int64_t t_ns, bool ok);
  // The same, at a mark on the device timeline (the first completion of an op counts).
  void complete_marked(int64_t id, int64_t mark, bool ok);
  // The op `id`'s real part completed at t_ns (host time; the first report counts).
  void real_part_done(int64_t id, int64_t t_ns);
  // The program began to wait on the op `id` at t_ns (host time; the first wait counts).
  void waited(int64_t id, int64_t t_ns);
  // The same, at a mark on the device timeline (the first wait counts).
  void waited_marked(int64_t id, int64_t mark);

  // Human-readable: the last ops (oldest first) with their state and times relative to now.
  std::string dump(int64_t now_ns) const;
  void set_capacity(size_t capacity);
  size_t capacity() const;
  // Ops issued plus ops settled since the process started (a number that grows while the process
  // makes progress through its ops), and when the last of them happened (CLOCK_MONOTONIC ns, 0
  // before the first). The rank watchdog reads both; clear() resets neither.
  std::pair<int64_t, int64_t> activity() const;
  // Who this process is, for dump headers ("virtual rank 5 (physical rank 0)").
  void set_process_label(std::string label);

  void start_recording();
  // Every op since start_recording(), in issue order; recording stops. Device marks are read
  // (blocking until the device has passed them, at most timeout_ns each) and become the times.
  std::vector<OpRecord> stop_recording(int64_t timeout_ns);
  bool recording() const;

  // The next sequence number of the p2p ops to (is_send) or from a peer, shared by the backend's
  // send/recv and the pipeline interceptor's record_p2p.
  int64_t next_p2p_seq(int64_t peer_virtual_rank, bool is_send);
  // The (self, peer) pair as a group, made once per pair.
  std::shared_ptr<const GroupInfo> p2p_group(int64_t self_virtual_rank, int64_t peer_virtual_rank);

  // Forget the ring, any recording and the p2p counters (ids keep counting).
  void clear();

 private:
  OpRecord* find_locked(int64_t id);
  void settle_locked(int64_t id, int64_t t_ns, int64_t mark, bool ok);
  // Sets the record's `field` to t_ns unless an earlier call did.
  void note_first(int64_t id, int64_t OpRecord::*field, int64_t t_ns);

  mutable std::mutex mu_;
  size_t capacity_ = 512;
  int64_t next_id_ = 0;
  int64_t num_settled_ = 0;
  int64_t last_activity_ns_ = 0;
  std::deque<OpRecord> ring_;  // ids [next_id_ - ring_.size(), next_id_)
  bool recording_ = false;
  int64_t recording_first_id_ = 0;
  std::vector<OpRecord> recorded_;
  std::string process_label_ = "this process";
  std::map<std::pair<int64_t, bool>, int64_t> p2p_seq_;
  std::map<std::pair<int64_t, int64_t>, std::shared_ptr<const GroupInfo>> p2p_groups_;
};

OpLog& op_log();

}  // namespace prism::replay
