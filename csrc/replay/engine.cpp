// The replay engine (contract in engine.h).
#include "replay/engine.h"

#include <algorithm>
#include <cmath>
#include <limits>
#include <sstream>

namespace prism::replay {

namespace {

constexpr const char* kOpKindNames[kNumOpKinds] = {
    "ALL_REDUCE", "BROADCAST", "ALL_GATHER", "REDUCE_SCATTER", "ALL_TO_ALL", "BARRIER",
    "SEND",       "RECV",      "GATHER",     "SCATTER",        "REDUCE",
};

}  // namespace

const char* op_kind_name(OpKind kind) {
  const auto index = static_cast<int32_t>(kind);
  return is_valid_op_kind(index) ? kOpKindNames[index] : "UNKNOWN";
}

bool is_valid_op_kind(int32_t value) { return value >= 0 && value < kNumOpKinds; }

int64_t evaluate_cost_ns(const std::vector<CostLine>& lines, int64_t size_bytes) {
  if (lines.empty()) {
    return 0;
  }
  double best = std::numeric_limits<double>::infinity();
  for (const auto& line : lines) {
    best = std::min(best, line.latency_ns + line.ns_per_byte * static_cast<double>(size_bytes));
  }
  return static_cast<int64_t>(std::llround(best));
}

int64_t Timing::completion_ns(int64_t own_arrival_ns) const {
  return std::max(own_arrival_ns, arrival_ns) + cost_ns;
}

std::shared_ptr<OpSlot> Engine::group_slot(const std::vector<int64_t>& members) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = groups_[members];
  if (!slot) {
    slot = std::make_shared<OpSlot>();
  }
  return slot;
}

std::shared_ptr<OpSlot> Engine::p2p_slot(int64_t peer_virtual_rank, bool is_send) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = p2p_[{peer_virtual_rank, is_send}];
  if (!slot) {
    slot = std::make_shared<OpSlot>();
  }
  return slot;
}

const std::vector<CostLine>& Engine::lines_locked(const OpSlot* slot, OpKind kind) const {
  if (slot != nullptr && !slot->lines[static_cast<int>(kind)].empty()) {
    return slot->lines[static_cast<int>(kind)];
  }
  return default_lines_;
}

Timing Engine::next_locked(OpSlot& slot, const std::vector<CostLine>* fallback_lines, OpKind kind,
                           int64_t size_bytes, int64_t issue_ns, const std::string& what) {
  if (slot.epoch != epoch_) {
    slot.epoch = epoch_;
    slot.next_index = 0;
  }
  Timing timing;
  timing.op_index = slot.next_index++;
  timing.arrival_ns = issue_ns;
  timing.start_mark = iteration_start_mark_;
  int64_t cost_ns = -1;
  const bool scheduled = mode_ == Mode::kReplay && iteration_start_ns_ >= 0 &&
                         timing.op_index < static_cast<int64_t>(slot.ops.size());
  if (scheduled) {
    const ScheduledOp& op = slot.ops[timing.op_index];
    // The collectives that move routed tokens may change size (MoE token dispatch; the graph holds
    // their median, see SIZE_FOLLOWS_DATA in graph/capture.py); other ops, p2p included, may not.
    const bool size_follows_data =
        kind == OpKind::kAllToAll || kind == OpKind::kAllGather || kind == OpKind::kReduceScatter;
    if (op.kind != kind || (op.size_bytes != size_bytes && !size_follows_data)) {
      std::ostringstream msg;
      msg << "prism replay: the program diverged from the replay schedule at op " << timing.op_index
          << " of iteration " << epoch_ << " on " << what << ": the schedule has "
          << op_kind_name(op.kind) << " of " << op.size_bytes << " bytes, the program issued "
          << op_kind_name(kind) << " of " << size_bytes
          << " bytes (re-capture the graph for this configuration)";
      timing.error = msg.str();
    }
    timing.arrival_ns = iteration_start_ns_ + op.arrival_offset_ns;
    timing.arrival_offset_ns = op.arrival_offset_ns;
    cost_ns = op.cost_ns;
  }
  if (cost_ns < 0) {
    const auto& own = slot.lines[static_cast<int>(kind)];
    const auto& lines = !own.empty() ? own : (fallback_lines != nullptr ? *fallback_lines : default_lines_);
    cost_ns = evaluate_cost_ns(lines, size_bytes);
  }
  timing.cost_ns = cost_ns;
  return timing;
}

Timing Engine::next_collective(OpSlot& slot, OpKind kind, int64_t size_bytes, int64_t issue_ns,
                               const std::string& group_label) {
  std::lock_guard<std::mutex> lock(mu_);
  return next_locked(slot, nullptr, kind, size_bytes, issue_ns, group_label);
}

Timing Engine::next_p2p(int64_t peer_virtual_rank, bool is_send, int64_t size_bytes, int64_t issue_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = p2p_[{peer_virtual_rank, is_send}];
  if (!slot) {
    slot = std::make_shared<OpSlot>();
  }
  const OpKind kind = is_send ? OpKind::kSend : OpKind::kRecv;
  const std::vector<CostLine>* pair_lines = nullptr;
  if (virtual_rank_ >= 0) {
    auto found = groups_.find({std::min(virtual_rank_, peer_virtual_rank), std::max(virtual_rank_, peer_virtual_rank)});
    if (found != groups_.end()) {
      pair_lines = &lines_locked(found->second.get(), kind);
    }
  }
  std::ostringstream what;
  what << (is_send ? "the sends to" : "the receives from") << " virtual rank " << peer_virtual_rank;
  return next_locked(*slot, pair_lines, kind, size_bytes, issue_ns, what.str());
}

void Engine::set_mode(Mode mode) {
  std::lock_guard<std::mutex> lock(mu_);
  mode_ = mode;
}

Mode Engine::mode() const {
  std::lock_guard<std::mutex> lock(mu_);
  return mode_;
}

void Engine::set_virtual_rank(int64_t virtual_rank) {
  std::lock_guard<std::mutex> lock(mu_);
  virtual_rank_ = virtual_rank;
}

int64_t Engine::virtual_rank() const {
  std::lock_guard<std::mutex> lock(mu_);
  return virtual_rank_;
}

void Engine::load_schedule(
    int64_t virtual_rank,
    const std::vector<std::pair<std::vector<int64_t>, std::vector<ScheduledOp>>>& collectives,
    const std::vector<std::pair<std::pair<int64_t, bool>, std::vector<ScheduledOp>>>& p2p,
    int64_t /*iteration_time_ns*/) {
  std::lock_guard<std::mutex> lock(mu_);
  virtual_rank_ = virtual_rank;
  for (auto& [members, slot] : groups_) {
    slot->ops.clear();
  }
  for (auto& [key, slot] : p2p_) {
    slot->ops.clear();
  }
  for (const auto& [members, ops] : collectives) {
    auto& slot = groups_[members];
    if (!slot) {
      slot = std::make_shared<OpSlot>();
    }
    slot->ops = ops;
  }
  for (const auto& [key, ops] : p2p) {
    auto& slot = p2p_[key];
    if (!slot) {
      slot = std::make_shared<OpSlot>();
    }
    slot->ops = ops;
  }
  has_schedule_ = true;
}

bool Engine::has_schedule() const {
  std::lock_guard<std::mutex> lock(mu_);
  return has_schedule_;
}

void Engine::mark_iteration_start(int64_t t_ns, int64_t start_mark) {
  std::lock_guard<std::mutex> lock(mu_);
  iteration_start_ns_ = t_ns;
  iteration_start_mark_ = start_mark;
  ++epoch_;  // every slot restarts its op index lazily, on its next op
}

int64_t Engine::iteration_start_ns() const {
  std::lock_guard<std::mutex> lock(mu_);
  return iteration_start_ns_;
}

int64_t Engine::iteration_start_mark() const {
  std::lock_guard<std::mutex> lock(mu_);
  return iteration_start_mark_;
}

int64_t Engine::iteration_count() const {
  std::lock_guard<std::mutex> lock(mu_);
  return iteration_start_ns_ < 0 ? 0 : epoch_;
}

void Engine::set_group_cost(const std::vector<int64_t>& members, OpKind kind, std::vector<CostLine> lines) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& slot = groups_[members];
  if (!slot) {
    slot = std::make_shared<OpSlot>();
  }
  slot->lines[static_cast<int>(kind)] = std::move(lines);
}

void Engine::set_default_cost(std::vector<CostLine> lines) {
  std::lock_guard<std::mutex> lock(mu_);
  default_lines_ = std::move(lines);
}

int64_t Engine::cost_ns(const std::vector<int64_t>& members, OpKind kind, int64_t size_bytes) {
  std::lock_guard<std::mutex> lock(mu_);
  auto found = groups_.find(members);
  return evaluate_cost_ns(lines_locked(found == groups_.end() ? nullptr : found->second.get(), kind), size_bytes);
}

void Engine::reset() {
  std::lock_guard<std::mutex> lock(mu_);
  mode_ = Mode::kInstant;
  virtual_rank_ = -1;
  has_schedule_ = false;
  ++epoch_;
  iteration_start_ns_ = -1;
  iteration_start_mark_ = -1;
  groups_.clear();
  p2p_.clear();
  default_lines_.clear();
}

Engine& engine() {
  static Engine instance;
  return instance;
}

}  // namespace prism::replay
