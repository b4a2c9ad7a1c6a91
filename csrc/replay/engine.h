// The replay engine: when do the virtual members of an op arrive, and what does the op cost.
//
// It speaks for every virtual rank. For each group this process belongs to (keyed by its member
// list) and for each p2p direction to each peer, it holds the ops of one iteration as the replay
// schedule gives them (prism_megatron/replay/schedule.py) and counts the ops the program issues in
// the current iteration. The backend asks it, per op, for the virtual members' latest arrival and
// the op's communication cost; it completes the op at max(own arrival, that arrival) + cost.
//
// Modes: instant (virtual peers arrive at once: the capture pass and pure functional runs) and
// replay (arrivals from the loaded schedule, as offsets from the start of the current iteration).
// Where no schedule entry exists (instant mode, an op the schedule does not know, or before the
// first iteration start) the arrival is the issue time. Cost: the schedule's cost_ns where it is
// >= 0, otherwise min over the group's cost lines for the op kind (default lines for groups
// without their own; zero without any lines).
//
// Light headers only: this file and engine.cpp compile in seconds.
#pragma once

#include <array>
#include <cstdint>
#include <map>
#include <memory>
#include <mutex>
#include <string>
#include <utility>
#include <vector>

namespace prism::replay {

// Communication op kinds. The numbers are shared with OpKind in prism_megatron/replay/schedule.py.
enum class OpKind : int32_t {
  kAllReduce = 0,
  kBroadcast = 1,
  kAllGather = 2,
  kReduceScatter = 3,
  kAllToAll = 4,
  kBarrier = 5,
  kSend = 6,
  kRecv = 7,
  kGather = 8,
  kScatter = 9,
  kReduce = 10,
};
constexpr int kNumOpKinds = 11;

// "ALL_REDUCE", ... (the Python enum's member names).
const char* op_kind_name(OpKind kind);
bool is_valid_op_kind(int32_t value);

// latency_ns + ns_per_byte * bytes: one algorithm/protocol choice of a collective library.
struct CostLine {
  double latency_ns = 0;
  double ns_per_byte = 0;
};

// The cheapest line at this size, rounded to ns; 0 when there are no lines.
int64_t evaluate_cost_ns(const std::vector<CostLine>& lines, int64_t size_bytes);

// One op of one iteration as the schedule gives it (see ScheduledOp in schedule.py).
struct ScheduledOp {
  OpKind kind = OpKind::kAllReduce;
  int64_t size_bytes = 0;
  int64_t arrival_offset_ns = 0;
  int64_t cost_ns = -1;  // < 0: ask the cost lines
};

// The engine's state for one group (or one p2p direction to one peer). Shared with the backends
// that use it, so a backend holds its slot and never looks its member list up again.
struct OpSlot {
  std::vector<ScheduledOp> ops;                        // one iteration, in issue order
  std::array<std::vector<CostLine>, kNumOpKinds> lines;  // per op kind; empty: the default lines
  int64_t epoch = -1;                                  // iteration the counter below belongs to
  int64_t next_index = 0;                              // ops issued so far in that iteration
};

// Timing::arrival_offset_ns of an op the schedule does not know: the peers arrive with this rank.
constexpr int64_t kUnscheduled = INT64_MIN / 4;

// What the engine says about one issued op.
struct Timing {
  int64_t op_index = 0;    // the op's index among its slot's ops in the current iteration
  int64_t arrival_ns = 0;  // the virtual members' latest arrival (absolute CLOCK_MONOTONIC ns)
  // The same as an offset from the iteration start, for device waits (which read the start from
  // the GPU timer); kUnscheduled when the peers arrive with this rank.
  int64_t arrival_offset_ns = kUnscheduled;
  int64_t cost_ns = 0;     // communication cost once everyone has arrived
  // The iteration start's mark on the device timeline (timeline.h), whose slot device waits read
  // the start from; -1 before the first start.
  int64_t start_mark = -1;
  std::string error;       // non-empty: the issued op differs from the scheduled one
  int64_t completion_ns(int64_t own_arrival_ns) const;
};

enum class Mode { kInstant, kReplay };

class Engine {
 public:
  // The slot of a group, created on first use; members are global virtual ranks in group order.
  std::shared_ptr<OpSlot> group_slot(const std::vector<int64_t>& members);
  // The slot of the p2p ops to (is_send) or from (!is_send) a peer.
  std::shared_ptr<OpSlot> p2p_slot(int64_t peer_virtual_rank, bool is_send);

  // Count one issued op on a group slot and say when it completes. issue_ns is the op's own arrival;
  // group_label names the group in a divergence error.
  Timing next_collective(OpSlot& slot, OpKind kind, int64_t size_bytes, int64_t issue_ns,
                         const std::string& group_label);
  // The same for a p2p op with a virtual peer; the cost lines are the p2p slot's own, else the
  // two-member group's (self, peer), else the default lines.
  Timing next_p2p(int64_t peer_virtual_rank, bool is_send, int64_t size_bytes, int64_t issue_ns);

  void set_mode(Mode mode);
  Mode mode() const;
  void set_virtual_rank(int64_t virtual_rank);
  int64_t virtual_rank() const;

  // Replace the whole schedule (every slot's ops); slots not named lose their ops.
  void load_schedule(int64_t virtual_rank,
                     const std::vector<std::pair<std::vector<int64_t>, std::vector<ScheduledOp>>>& collectives,
                     const std::vector<std::pair<std::pair<int64_t, bool>, std::vector<ScheduledOp>>>& p2p,
                     int64_t iteration_time_ns);
  bool has_schedule() const;

  // A new iteration starts now: arrival offsets count from t_ns (host waits) and from the time in
  // start_mark's slot (device waits), and every slot's op index restarts.
  void mark_iteration_start(int64_t t_ns, int64_t start_mark = -1);
  int64_t iteration_start_mark() const;
  int64_t iteration_start_ns() const;
  int64_t iteration_count() const;

  void set_group_cost(const std::vector<int64_t>& members, OpKind kind, std::vector<CostLine> lines);
  void set_default_cost(std::vector<CostLine> lines);
  // The cost of an op of `kind` on the group `members` (its lines, else the default ones).
  int64_t cost_ns(const std::vector<int64_t>& members, OpKind kind, int64_t size_bytes);

  // Forget everything: schedule, costs, counters, mode (back to instant). Slots held by live
  // backends stay valid but are no longer the engine's.
  void reset();

 private:
  Timing next_locked(OpSlot& slot, const std::vector<CostLine>* fallback_lines, OpKind kind,
                     int64_t size_bytes, int64_t issue_ns, const std::string& what);
  const std::vector<CostLine>& lines_locked(const OpSlot* slot, OpKind kind) const;

  mutable std::mutex mu_;
  Mode mode_ = Mode::kInstant;
  int64_t virtual_rank_ = -1;
  bool has_schedule_ = false;
  int64_t epoch_ = 0;
  int64_t iteration_start_ns_ = -1;  // < 0: no iteration started yet
  int64_t iteration_start_mark_ = -1;
  std::map<std::vector<int64_t>, std::shared_ptr<OpSlot>> groups_;
  std::map<std::pair<int64_t, bool>, std::shared_ptr<OpSlot>> p2p_;
  std::vector<CostLine> default_lines_;
};

// The process's engine.
Engine& engine();

}  // namespace prism::replay
