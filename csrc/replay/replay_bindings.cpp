// prism_megatron._C.replay: the replay engine and the op log for Python (the typed face is
// prism_megatron/replay/__init__.py). pybind11 alone, so this file compiles in about 11 s.
#include "registry.h"
#include "replay/clock.h"
#include "replay/engine.h"
#include "replay/op_log.h"
#include "replay/timeline.h"

#include <pybind11/stl.h>

#include <map>
#include <memory>
#include <mutex>

#include <algorithm>
#include <cmath>
#include <string>
#include <tuple>
#include <unordered_map>
#include <utility>
#include <vector>

namespace py = pybind11;

namespace prism::replay {
namespace {

using Release = py::call_guard<py::gil_scoped_release>;
// (kind, size_bytes, arrival_offset_ns, cost_ns), as ReplaySchedule.to_json writes an op.
using RawOp = std::tuple<int32_t, int64_t, int64_t, int64_t>;
using RawLine = std::pair<double, double>;

OpKind to_kind(int32_t value) {
  if (!is_valid_op_kind(value)) {
    throw py::value_error("op kind must be an OpKind value 0.." + std::to_string(kNumOpKinds - 1) + ", got " +
                          std::to_string(value));
  }
  return static_cast<OpKind>(value);
}

// Argument checks: ValueError naming the argument, the value and what is valid. The engine keys its
// slots by rank and member list, so a bad rank cannot corrupt memory here; it would only make a
// slot that no op ever finds, which is a silent mistake worth an error.
void require(bool ok, const std::string& message) {
  if (!ok) {
    throw py::value_error(message);
  }
}

int64_t checked_rank(int64_t rank, const char* name) {
  require(rank >= 0, std::string(name) + " " + std::to_string(rank) + " is not a virtual rank (>= 0)");
  return rank;
}

int64_t checked_size(int64_t size_bytes) {
  require(size_bytes >= 0, "size_bytes must be >= 0, got " + std::to_string(size_bytes));
  return size_bytes;
}

const std::vector<int64_t>& checked_members(const std::vector<int64_t>& members) {
  require(!members.empty(), "members is empty; a group has at least one virtual rank");
  std::vector<int64_t> sorted = members;
  std::sort(sorted.begin(), sorted.end());
  require(sorted.front() >= 0, "members holds " + std::to_string(sorted.front()) + ", not a virtual rank (>= 0)");
  const auto repeated = std::adjacent_find(sorted.begin(), sorted.end());
  require(repeated == sorted.end(), "virtual rank " + (repeated == sorted.end() ? std::string() : std::to_string(*repeated)) +
                                        " appears more than once in members; members must be distinct");
  return members;
}

std::vector<ScheduledOp> to_ops(const std::vector<RawOp>& raw) {
  std::vector<ScheduledOp> ops;
  ops.reserve(raw.size());
  for (const auto& [kind, size_bytes, arrival_offset_ns, cost_ns] : raw) {
    ops.push_back({to_kind(kind), checked_size(size_bytes), arrival_offset_ns, cost_ns});
  }
  return ops;
}

std::vector<CostLine> to_lines(const std::vector<RawLine>& raw) {
  std::vector<CostLine> lines;
  lines.reserve(raw.size());
  for (const auto& [latency_ns, ns_per_byte] : raw) {
    require(std::isfinite(latency_ns) && std::isfinite(ns_per_byte),
            "a cost line must be finite, got latency_ns " + std::to_string(latency_ns) + ", ns_per_byte " +
                std::to_string(ns_per_byte));
    lines.push_back({latency_ns, ns_per_byte});
  }
  return lines;
}

void load_schedule(int64_t virtual_rank, const std::vector<std::pair<std::vector<int64_t>, std::vector<RawOp>>>& collectives,
                   const std::vector<std::tuple<int64_t, bool, std::vector<RawOp>>>& p2p, int64_t iteration_time_ns) {
  checked_rank(virtual_rank, "virtual_rank");
  require(iteration_time_ns >= 0, "iteration_time_ns must be >= 0, got " + std::to_string(iteration_time_ns));
  std::vector<std::pair<std::vector<int64_t>, std::vector<ScheduledOp>>> groups;
  groups.reserve(collectives.size());
  for (const auto& [members, ops] : collectives) {
    groups.emplace_back(checked_members(members), to_ops(ops));
  }
  std::vector<std::pair<std::pair<int64_t, bool>, std::vector<ScheduledOp>>> pairs;
  pairs.reserve(p2p.size());
  for (const auto& [peer, is_send, ops] : p2p) {
    pairs.push_back({{checked_rank(peer, "p2p peer"), is_send}, to_ops(ops)});
  }
  engine().load_schedule(virtual_rank, groups, pairs, iteration_time_ns);
}

int64_t p2p_completion_ns(int64_t peer, bool is_send, int64_t size_bytes) {
  checked_rank(peer, "peer");
  checked_size(size_bytes);
  const int64_t now = clock::now_ns();
  const Timing timing = engine().next_p2p(peer, is_send, size_bytes, now);
  if (!timing.error.empty()) {
    throw std::runtime_error(timing.error);
  }
  return timing.completion_ns(now);
}

// Records as tuples; a group's member tuple is built once and shared by its events.
py::list export_records(const std::vector<OpRecord>& records) {
  std::unordered_map<const GroupInfo*, py::tuple> members_of;
  py::list out;
  for (const auto& r : records) {
    py::tuple members;
    auto found = members_of.find(r.group.get());
    if (found != members_of.end()) {
      members = found->second;
    } else {
      members = r.group ? py::tuple(py::cast(r.group->members)) : py::tuple();
      members_of.emplace(r.group.get(), members);
    }
    out.append(py::make_tuple(static_cast<int32_t>(r.kind), members, r.peer, r.seq, r.size_bytes, r.dtype, r.issue_ns,
                              r.start_ns, r.complete_ns, r.async_op, r.has_virtual, r.real_done_ns,
                              r.engine_done_ns, r.wait_ns));
  }
  return out;
}

void record_p2p(int32_t kind, int64_t self_rank, int64_t peer, int64_t seq, int64_t size_bytes, const std::string& dtype,
                int64_t issue_ns, int64_t start_ns, int64_t complete_ns, bool async_op, bool has_virtual,
                int64_t issue_mark, int64_t complete_mark, int64_t wait_mark) {
  const OpKind op_kind = to_kind(kind);
  checked_rank(self_rank, "self_rank");
  checked_rank(peer, "peer");
  checked_size(size_bytes);
  if (op_kind != OpKind::kSend && op_kind != OpKind::kRecv) {
    throw py::value_error(std::string("record_p2p kind must be SEND or RECV, got ") + op_kind_name(op_kind));
  }
  OpRecord record;
  record.kind = op_kind;
  record.group = op_log().p2p_group(self_rank, peer);
  record.peer = peer;
  record.seq = seq >= 0 ? seq : op_log().next_p2p_seq(peer, op_kind == OpKind::kSend);
  record.size_bytes = size_bytes;
  record.dtype = dtype;
  record.issue_ns = issue_ns;
  record.start_ns = start_ns;
  record.async_op = async_op;
  record.has_virtual = has_virtual;
  record.issue_mark = issue_mark;
  record.start_mark = issue_mark;
  record.wait_mark = wait_mark;
  const int64_t id = op_log().begin(std::move(record));
  if (complete_mark >= 0) {
    op_log().complete_marked(id, complete_mark, true);
  } else if (complete_ns >= 0) {
    op_log().complete(id, complete_ns, true);
  }
}

// A p2p op with a virtual peer on the device (the pipeline interceptor's): timed on a stream of its
// own, the way NCCL runs p2p on its own stream; wait() makes the caller's stream wait for it.
class DeviceP2P {
 public:
  DeviceP2P(device::Queue* queue, std::shared_ptr<device::Event> done, int64_t log_id)
      : queue_(queue), done_(std::move(done)), log_id_(log_id) {}

  // record_wait: keep where the stream began to wait (false for the wait a pipeline call makes
  // before it returns, which the capture keeps in the call: graph/capture.py).
  void wait(bool record_wait) {
    const device::StreamId waiter = queue_->current_stream();
    if (!waited_ && record_wait) {
      op_log().waited_marked(log_id_, timeline::mark_on(queue_, waiter));
    }
    queue_->wait(waiter, done_);
    if (!waited_) {
      waited_ = true;
      op_log().complete_marked(log_id_, timeline::mark_on(queue_, waiter), true);
    }
  }
  bool is_completed() { return queue_->query(*done_); }

 private:
  device::Queue* queue_;
  std::shared_ptr<device::Event> done_;
  int64_t log_id_;
  bool waited_ = false;
};

device::StreamId p2p_stream(device::Queue* queue) {
  static std::mutex mu;
  static std::map<device::Queue*, device::StreamId> streams;
  std::lock_guard<std::mutex> lock(mu);
  auto found = streams.find(queue);
  if (found == streams.end()) {
    found = streams.emplace(queue, queue->new_stream()).first;
  }
  return found->second;
}

std::shared_ptr<DeviceP2P> device_p2p(int64_t self_rank, int64_t peer, bool is_send, int64_t size_bytes,
                                      const std::string& dtype, bool async_op) {
  checked_rank(self_rank, "self_rank");
  checked_rank(peer, "peer");
  checked_size(size_bytes);
  device::Queue* queue = timeline::active_queue();
  if (queue == nullptr) {
    throw py::value_error("device_p2p needs a device (CUDA in use, or the test device active); on the host use "
                          "p2p_completion_ns and wait_until_ns");
  }
  const int64_t now_ns = clock::now_ns();
  const Timing timing = engine().next_p2p(peer, is_send, size_bytes, now_ns);
  if (!timing.error.empty()) {
    throw std::runtime_error(timing.error);
  }
  OpRecord record;
  record.kind = is_send ? OpKind::kSend : OpKind::kRecv;
  record.group = op_log().p2p_group(self_rank, peer);
  record.peer = peer;
  record.seq = op_log().next_p2p_seq(peer, is_send);
  record.size_bytes = size_bytes;
  record.dtype = dtype;
  record.issue_ns = now_ns;
  record.start_ns = now_ns;
  record.async_op = async_op;
  record.has_virtual = true;
  const device::StreamId issuing = queue->current_stream();
  record.issue_mark = timeline::mark_on(queue, issuing);
  record.start_mark = timeline::reserve(queue);
  int64_t* arrived = timeline::cell(record.start_mark);
  const int64_t log_id = op_log().begin(std::move(record));
  const device::StreamId stream = p2p_stream(queue);
  queue->wait(stream, queue->record(issuing));
  const int64_t* start = timing.start_mark >= 0 ? timeline::cell(timing.start_mark) : timeline::zero_cell(queue);
  queue->wait_until(stream, start, timing.arrival_offset_ns, timing.cost_ns, arrived, timeline::abort_cell(queue));
  return std::make_shared<DeviceP2P>(queue, queue->record(stream), log_id);
}

void bind(py::module_& m) {
  m.def("set_mode", [](bool replay) { engine().set_mode(replay ? Mode::kReplay : Mode::kInstant); }, py::arg("replay"));
  m.def("is_replay_mode", [] { return engine().mode() == Mode::kReplay; });
  m.def(
      "set_virtual_rank", [](int64_t r) { engine().set_virtual_rank(checked_rank(r, "virtual_rank")); },
      py::arg("virtual_rank"));
  m.def("load_schedule", &load_schedule, py::arg("virtual_rank"), py::arg("collectives"), py::arg("p2p"),
        py::arg("iteration_time_ns"));
  m.def("has_schedule", [] { return engine().has_schedule(); });
  m.def(
      "mark_iteration_start",
      [] {
        const int64_t mark = timeline::mark();
        // On the host the mark holds its time already: host waits count from that very time.
        const int64_t host_start_ns = timeline::active_queue() == nullptr ? timeline::value(mark) : clock::now_ns();
        engine().mark_iteration_start(host_start_ns, mark);
        return mark;
      },
      "Start a new iteration now; returns its start's mark on the device timeline.");
  m.def("iteration_start_mark", [] { return engine().iteration_start_mark(); });
  m.def("iteration_start_ns", [] { return engine().iteration_start_ns(); });
  m.def("iteration_count", [] { return engine().iteration_count(); });
  m.def(
      "set_group_cost",
      [](const std::vector<int64_t>& members, int32_t kind, const std::vector<RawLine>& lines) {
        engine().set_group_cost(checked_members(members), to_kind(kind), to_lines(lines));
      },
      py::arg("members"), py::arg("kind"), py::arg("lines"));
  m.def("set_default_cost", [](const std::vector<RawLine>& lines) { engine().set_default_cost(to_lines(lines)); },
        py::arg("lines"));
  m.def(
      "cost_ns",
      [](const std::vector<int64_t>& members, int32_t kind, int64_t size_bytes) {
        return engine().cost_ns(checked_members(members), to_kind(kind), checked_size(size_bytes));
      },
      py::arg("members"), py::arg("kind"), py::arg("size_bytes"));
  m.def("p2p_completion_ns", &p2p_completion_ns, py::arg("peer"), py::arg("is_send"), py::arg("size_bytes"));
  m.def(
      "wait_until_ns", [](int64_t t) { clock::await_until_ns(t); }, Release(), py::arg("deadline_ns"));
  m.def("reset_engine", [] { engine().reset(); });

  m.def("flight_recorder_dump", [] { return op_log().dump(clock::now_ns()); });
  m.def("set_flight_recorder_capacity", [](size_t n) { op_log().set_capacity(n); }, py::arg("capacity"));
  m.def("flight_recorder_capacity", [] { return op_log().capacity(); });
  m.def("op_activity", [] { return op_log().activity(); },
        "(ops issued plus ops settled so far, CLOCK_MONOTONIC ns of the last of them).");
  m.def("set_process_label", [](std::string label) { op_log().set_process_label(std::move(label)); },
        py::arg("label"));
  m.def("start_recording", [] { op_log().start_recording(); });
  m.def(
      "stop_recording",
      [](int64_t timeout_ns) {
        std::vector<OpRecord> records;
        {
          py::gil_scoped_release release;  // reading device marks may wait for the device
          records = op_log().stop_recording(timeout_ns);
        }
        return export_records(records);
      },
      py::arg("timeout_ns"));
  m.def("is_recording", [] { return op_log().recording(); });
  m.def("record_p2p", &record_p2p, py::arg("kind"), py::arg("self_rank"), py::arg("peer"), py::arg("seq"),
        py::arg("size_bytes"), py::arg("dtype"), py::arg("issue_ns"), py::arg("start_ns"), py::arg("complete_ns"),
        py::arg("async_op"), py::arg("has_virtual"), py::arg("issue_mark") = -1, py::arg("complete_mark") = -1,
        py::arg("wait_mark") = -1);
  m.def("clear_log", [] { op_log().clear(); });

  py::class_<DeviceP2P, std::shared_ptr<DeviceP2P>>(m, "DeviceP2P")
      .def("wait", &DeviceP2P::wait, "The caller's stream waits for the op (the host does not).",
           py::arg("record_wait") = true)
      .def("is_completed", &DeviceP2P::is_completed);
  m.def("device_p2p", &device_p2p, py::arg("self_rank"), py::arg("peer"), py::arg("is_send"), py::arg("size_bytes"),
        py::arg("dtype"), py::arg("async_op"));
}

}  // namespace
}  // namespace prism::replay

PRISM_SUBMODULE(replay, prism::replay::bind);
