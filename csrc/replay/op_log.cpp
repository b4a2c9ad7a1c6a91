// The op log: flight recorder and capture-pass recording (contract in op_log.h).
#include "replay/op_log.h"

#include <cstdio>
#include <sstream>

#include "replay/clock.h"
#include "replay/timeline.h"

namespace prism::replay {

namespace {

const char* state_name(OpState state) {
  switch (state) {
    case OpState::kPending:
      return "PENDING";
    case OpState::kCompleted:
      return "completed";
    case OpState::kFailed:
      return "FAILED";
  }
  return "?";
}

// "12.345 ms ago" (or "in 1.000 ms" for a time still ahead, such as a planned start).
std::string relative_ms(int64_t t_ns, int64_t now_ns) {
  char buf[48];
  const double delta_ms = static_cast<double>(now_ns - t_ns) / 1e6;
  if (delta_ms >= 0) {
    std::snprintf(buf, sizeof(buf), "%.3f ms ago", delta_ms);
  } else {
    std::snprintf(buf, sizeof(buf), "in %.3f ms", -delta_ms);
  }
  return buf;
}

// "1.250 ms": the span from one device time to another.
std::string span_ms(int64_t from_ns, int64_t to_ns) {
  char buf[32];
  std::snprintf(buf, sizeof(buf), "%.3f ms", static_cast<double>(to_ns - from_ns) / 1e6);
  return buf;
}

}  // namespace

int64_t OpLog::begin(OpRecord record) {
  std::lock_guard<std::mutex> lock(mu_);
  const int64_t id = next_id_++;
  last_activity_ns_ = clock::now_ns();
  if (recording_) {
    recorded_.push_back(record);
  }
  ring_.push_back(std::move(record));
  while (ring_.size() > capacity_) {
    ring_.pop_front();
  }
  return id;
}

std::pair<int64_t, int64_t> OpLog::activity() const {
  std::lock_guard<std::mutex> lock(mu_);
  return {next_id_ + num_settled_, last_activity_ns_};
}

OpRecord* OpLog::find_locked(int64_t id) {
  const int64_t first = next_id_ - static_cast<int64_t>(ring_.size());
  if (id < first || id >= next_id_) {
    return nullptr;
  }
  return &ring_[static_cast<size_t>(id - first)];
}

void OpLog::complete(int64_t id, int64_t t_ns, bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  settle_locked(id, t_ns, -1, ok);
}

void OpLog::complete_marked(int64_t id, int64_t mark, bool ok) {
  std::lock_guard<std::mutex> lock(mu_);
  settle_locked(id, -1, mark, ok);
}

void OpLog::real_part_done(int64_t id, int64_t t_ns) { note_first(id, &OpRecord::real_done_ns, t_ns); }

void OpLog::waited(int64_t id, int64_t t_ns) { note_first(id, &OpRecord::wait_ns, t_ns); }

void OpLog::waited_marked(int64_t id, int64_t mark) { note_first(id, &OpRecord::wait_mark, mark); }

void OpLog::note_first(int64_t id, int64_t OpRecord::*field, int64_t t_ns) {
  std::lock_guard<std::mutex> lock(mu_);
  auto note = [&](OpRecord& record) {
    if (record.*field < 0) {
      record.*field = t_ns;
    }
  };
  if (OpRecord* record = find_locked(id)) {
    note(*record);
  }
  if (recording_ && id >= recording_first_id_) {
    const auto index = static_cast<size_t>(id - recording_first_id_);
    if (index < recorded_.size()) {
      note(recorded_[index]);
    }
  }
}

void OpLog::settle_locked(int64_t id, int64_t t_ns, int64_t mark, bool ok) {
  ++num_settled_;
  last_activity_ns_ = clock::now_ns();
  const OpState state = ok ? OpState::kCompleted : OpState::kFailed;
  auto settle = [&](OpRecord& record) {
    if (mark >= 0 && (record.complete_mark >= 0 || record.state != OpState::kPending)) {
      return;  // a device op completes where it was first waited on
    }
    record.complete_ns = t_ns;
    record.complete_mark = mark;
    record.state = state;
  };
  if (OpRecord* record = find_locked(id)) {
    settle(*record);
  }
  if (recording_ && id >= recording_first_id_) {
    const auto index = static_cast<size_t>(id - recording_first_id_);
    if (index < recorded_.size()) {
      settle(recorded_[index]);
    }
  }
}

std::string OpLog::dump(int64_t now_ns) const {
  std::lock_guard<std::mutex> lock(mu_);
  std::ostringstream out;
  const int64_t first = next_id_ - static_cast<int64_t>(ring_.size());
  out << "prism flight recorder of " << process_label_ << ": last " << ring_.size() << " of " << next_id_
      << " ops, oldest first\n";
  for (size_t i = 0; i < ring_.size(); ++i) {
    const OpRecord& r = ring_[i];
    out << "  #" << (first + static_cast<int64_t>(i)) << " " << op_kind_name(r.kind);
    if (r.peer >= 0) {
      out << " peer=" << r.peer;
    }
    out << " on " << (r.group ? r.group->label : std::string("?")) << " seq=" << r.seq
        << " bytes=" << r.size_bytes << " dtype=" << r.dtype << (r.async_op ? " async" : " sync")
        << (r.has_virtual ? " virtual-members" : " all-real");
    if (r.issue_mark >= 0) {
      // Device times are the device's clock: shown relative to the op's issue on the device.
      const int64_t issue = timeline::value(r.issue_mark);
      const int64_t start = r.start_mark >= 0 ? timeline::value(r.start_mark) : 0;
      const int64_t done = r.complete_mark >= 0 ? timeline::value(r.complete_mark) : 0;
      out << " on the device: ";
      if (issue <= 0) {
        out << "not yet reached by its stream, " << state_name(r.state) << "\n";
        continue;
      }
      out << "reached, " << (start > 0 ? "all arrived +" + span_ms(issue, start) : std::string("peers pending"))
          << ", " << (done > 0 ? std::string(state_name(r.state)) + " +" + span_ms(issue, done)
                               : std::string(r.state == OpState::kFailed ? "FAILED" : "not completed"))
          << "\n";
      continue;
    }
    out << " issued " << relative_ms(r.issue_ns, now_ns) << ", started " << relative_ms(r.start_ns, now_ns) << ", ";
    if (r.complete_ns >= 0) {
      out << state_name(r.state) << " " << relative_ms(r.complete_ns, now_ns);
    } else {
      out << state_name(r.state);
    }
    out << "\n";
  }
  return out.str();
}

void OpLog::set_capacity(size_t capacity) {
  std::lock_guard<std::mutex> lock(mu_);
  capacity_ = capacity;
  while (ring_.size() > capacity_) {
    ring_.pop_front();
  }
}

size_t OpLog::capacity() const {
  std::lock_guard<std::mutex> lock(mu_);
  return capacity_;
}

void OpLog::set_process_label(std::string label) {
  std::lock_guard<std::mutex> lock(mu_);
  process_label_ = std::move(label);
}

void OpLog::start_recording() {
  std::lock_guard<std::mutex> lock(mu_);
  recording_ = true;
  recording_first_id_ = next_id_;
  recorded_.clear();
}

std::vector<OpRecord> OpLog::stop_recording(int64_t timeout_ns) {
  std::vector<OpRecord> out;
  {
    std::lock_guard<std::mutex> lock(mu_);
    recording_ = false;
    out.swap(recorded_);
  }
  for (auto& r : out) {  // outside the lock: reading a mark may wait for the device
    if (r.issue_mark >= 0) {
      r.issue_ns = timeline::resolve(r.issue_mark, timeout_ns);
    }
    if (r.start_mark >= 0) {
      r.start_ns = timeline::resolve(r.start_mark, timeout_ns);
    }
    if (r.complete_mark >= 0) {
      r.complete_ns = timeline::resolve(r.complete_mark, timeout_ns);
    }
    if (r.wait_mark >= 0) {
      r.wait_ns = timeline::resolve(r.wait_mark, timeout_ns);
    }
  }
  return out;
}

bool OpLog::recording() const {
  std::lock_guard<std::mutex> lock(mu_);
  return recording_;
}

int64_t OpLog::next_p2p_seq(int64_t peer_virtual_rank, bool is_send) {
  std::lock_guard<std::mutex> lock(mu_);
  return p2p_seq_[{peer_virtual_rank, is_send}]++;
}

std::shared_ptr<const GroupInfo> OpLog::p2p_group(int64_t self_virtual_rank, int64_t peer_virtual_rank) {
  std::lock_guard<std::mutex> lock(mu_);
  auto& group = p2p_groups_[{self_virtual_rank, peer_virtual_rank}];
  if (!group) {
    auto info = std::make_shared<GroupInfo>();
    info->members = {self_virtual_rank, peer_virtual_rank};
    info->label = "p2p (" + std::to_string(self_virtual_rank) + ", " + std::to_string(peer_virtual_rank) + ")";
    group = std::move(info);
  }
  return group;
}

void OpLog::clear() {
  std::lock_guard<std::mutex> lock(mu_);
  ring_.clear();
  recording_ = false;
  recorded_.clear();
  p2p_seq_.clear();
  p2p_groups_.clear();
}

// Never destroyed: the backend's detached threads (the device path's watchdog, the completion
// thread) may still append to it or dump it while the process exits and statics are torn down.
OpLog& op_log() {
  static auto* instance = new OpLog();
  return *instance;
}

}  // namespace prism::replay
