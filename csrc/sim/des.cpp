// The simulator's event loop (semantics in des.h). Run state lives here; the Problem is never written.
#include "sim/des.h"

#include <algorithm>
#include <cmath>
#include <queue>
#include <unordered_map>

namespace prism::sim {
namespace {

// 16 bytes: the time, then (push order, node, stream) packed so that comparing the pair orders
// events by time and, at equal times, by push order (first pushed, first processed).
struct Event {
  int64_t time_ns;
  uint64_t order_node_stream;  // push order << 28 | node << 8 | stream
  bool operator>(const Event& other) const {
    return time_ns != other.time_ns ? time_ns > other.time_ns : order_node_stream > other.order_node_stream;
  }
  int32_t node() const { return static_cast<int32_t>((order_node_stream >> 8) & kNodeMask); }
  int32_t stream() const { return static_cast<int32_t>(order_node_stream & 0xff); }
  static constexpr uint64_t kNodeMask = (1u << 20) - 1;
};

// One posted batch per (node, stream) at a time.
struct StreamState {
  int32_t done = 0;         // ops completed, in stream order (the first op of the current batch)
  int32_t batch_end = 0;    // one past the last op of the posted batch (== done when idle)
  int32_t outstanding = 0;  // communication ops of the batch not yet complete
  int64_t batch_done_ns = 0;
  bool blocked = false;     // waiting for a cross-stream dependency
};

struct Waiter {
  int32_t node, stream, op;  // op: role-local index
  int32_t next;              // next waiter of the same pending collective, -1 at the end
};

struct PendingCollective {
  int32_t seq = -1;  // -1: the slot is free
  int64_t last_arrival_ns = 0;
  int64_t cost_ns = 0;
  double nic_factor = 1.0;
  int32_t arrived = 0;
  int32_t first_waiter = -1;
};

class Simulator {
 public:
  explicit Simulator(const Problem& p) : p_(p), S_(p.num_streams) {}

  Result run() {
    layout_timeline();
    index_p2p();
    open_.assign(p_.instance_size.size, PendingCollective{});
    streams_.assign(static_cast<size_t>(p_.num_nodes) * S_, StreamState{});
    for (int32_t node = 0; node < p_.num_nodes; ++node)
      for (int32_t s = 0; s < S_; ++s) try_post(node, s, 0);
    while (!heap_.empty() && result_.fault.kind.empty()) {
      const Event e = heap_.top();
      heap_.pop();
      ++result_.num_events;
      finish_batch(e.node(), e.stream(), e.time_ns);
    }
    if (result_.fault.kind.empty()) collect_stuck();
    for (const OpTimes& t : result_.timeline) result_.makespan_ns = std::max(result_.makespan_ns, t.end_ns);
    return std::move(result_);
  }

 private:
  const Problem& p_;
  const int32_t S_;
  Result result_;
  std::vector<StreamState> streams_;
  std::priority_queue<Event, std::vector<Event>, std::greater<Event>> heap_;
  uint64_t pushes_ = 0;
  // Open collectives: one slot per group instance (an instance rarely has two sequence numbers
  // open at once), and a map for the rare second one.
  std::vector<PendingCollective> open_;
  std::unordered_map<uint64_t, PendingCollective> overflow_;
  // Per role: (type, spec, seq) of each p2p op -> its role-local index, to find a partner op.
  std::vector<std::unordered_map<uint64_t, int32_t>> p2p_index_;
  // Timeline slot of a p2p op not yet posted -> first of the ops waiting to observe it.
  std::unordered_map<int64_t, int32_t> p2p_waiting_;
  std::vector<Waiter> waiters_;
  int32_t free_waiter_ = -1;

  int32_t role(int32_t node) const { return p_.node_role[node]; }
  int64_t first_op(int32_t node, int32_t s) const { return p_.stream_begin[role(node) * S_ + s]; }
  int32_t stream_length(int32_t node, int32_t s) const {
    return static_cast<int32_t>(p_.stream_begin[role(node) * S_ + s + 1] - first_op(node, s));
  }
  int64_t role_base(int32_t node) const { return p_.stream_begin[role(node) * S_]; }
  // Timeline slot of role-local op `op` of `node`.
  int64_t slot(int32_t node, int64_t op) const { return result_.node_op_base[node] + op; }
  StreamState& state(int32_t node, int32_t s) { return streams_[static_cast<size_t>(node) * S_ + s]; }

  void layout_timeline() {
    result_.node_op_base.resize(p_.num_nodes + 1);
    int64_t total = 0;
    for (int32_t node = 0; node < p_.num_nodes; ++node) {
      result_.node_op_base[node] = total;
      int32_t r = role(node);
      total += p_.stream_begin[(r + 1) * S_] - p_.stream_begin[r * S_];
    }
    result_.node_op_base[p_.num_nodes] = total;
    result_.timeline.assign(total, OpTimes{});
  }

  void push(int32_t node, int32_t s, int64_t time_ns) {
    const uint64_t packed = (pushes_++ << 28) | (static_cast<uint64_t>(node) << 8) | static_cast<uint64_t>(s);
    heap_.push(Event{time_ns, packed});
  }

  bool deps_met(int32_t node, int64_t op) const {
    for (int32_t d = p_.op_dep_begin[op]; d < p_.op_dep_begin[op + 1]; ++d) {
      const StreamState& other = streams_[static_cast<size_t>(node) * S_ + p_.dep_stream[d]];
      if (other.done <= p_.dep_index[d]) return false;
    }
    return true;
  }

  // Post the stream's next batch at `now` if it has one and its dependencies are met.
  void try_post(int32_t node, int32_t s, int64_t now) {
    StreamState& st = state(node, s);
    const int32_t length = stream_length(node, s);
    if (st.done >= length || st.batch_end > st.done) return;  // finished, or a batch is in flight
    const int64_t base = first_op(node, s);
    int32_t end = st.done;
    while (end < length && p_.op_coalesced[base + end]) ++end;
    end = std::min(end + 1, length);
    for (int32_t i = st.done; i < end; ++i) {
      if (!deps_met(node, base + i)) {
        st.blocked = true;
        // A wait's span starts where the stream reached it: that is the time the stream lost.
        const int64_t at = slot(node, base + st.done - role_base(node));
        if (p_.op_type[base + st.done] == kWait && result_.timeline[at].start_ns < 0) {
          result_.timeline[at].start_ns = now;
        }
        return;
      }
    }
    st.blocked = false;
    st.batch_end = end;
    st.batch_done_ns = now;
    st.outstanding = 1;  // guard: the batch cannot finish while it is still being posted
    for (int32_t i = st.done; i < end && result_.fault.kind.empty(); ++i) post(node, s, base + i, now);
    complete_one(node, s, now);
  }

  void post(int32_t node, int32_t s, int64_t op, int64_t now) {
    const int64_t local = op - role_base(node);
    const int64_t at = slot(node, local);
    if (p_.op_type[op] != kWait || result_.timeline[at].start_ns < 0) result_.timeline[at].start_ns = now;
    StreamState& st = state(node, s);
    switch (p_.op_type[op]) {
      case kCompute: {
        // A slow device stretches its work, not the host's overhead around it.
        const int64_t overhead = std::min(p_.op_overhead_ns[op], p_.op_duration_ns[op]);
        double scaled = static_cast<double>(p_.op_duration_ns[op] - overhead) * p_.compute_factor[node];
        if (p_.op_expert[op]) scaled *= p_.expert_factor[node];
        const int64_t end = now + overhead + std::llround(scaled);
        result_.timeline[at].ready_ns = now;
        result_.timeline[at].end_ns = end;
        st.batch_done_ns = std::max(st.batch_done_ns, end);
        break;
      }
      case kWait:
        result_.timeline[at].ready_ns = result_.timeline[at].end_ns = now;
        break;
      case kCollective:
        ++st.outstanding;
        arrive_collective(node, s, op, static_cast<int32_t>(local), now);
        break;
      default:
        ++st.outstanding;
        arrive_p2p(node, s, op, static_cast<int32_t>(local), now);
        break;
    }
  }

  // One communication op of (node, s)'s batch finished at `end_ns` (or the posting guard dropped).
  void complete_one(int32_t node, int32_t s, int64_t end_ns) {
    StreamState& st = state(node, s);
    st.batch_done_ns = std::max(st.batch_done_ns, end_ns);
    if (--st.outstanding == 0) push(node, s, st.batch_done_ns);
  }

  void finish_batch(int32_t node, int32_t s, int64_t now) {
    state(node, s).done = state(node, s).batch_end;
    try_post(node, s, now);
    for (int32_t other = 0; other < S_; ++other)
      if (other != s && state(node, other).blocked) try_post(node, other, now);
  }

  void finish_op(const Waiter& w, int64_t ready_ns, int64_t end_ns) {
    const int64_t at = slot(w.node, w.op);
    result_.timeline[at].ready_ns = ready_ns;
    result_.timeline[at].end_ns = end_ns;
    complete_one(w.node, w.stream, end_ns);
  }

  bool same_message(int32_t node_a, int64_t op_a, int32_t node_b, int64_t op_b) {
    const int64_t a = role_base(node_a) + op_a, b = role_base(node_b) + op_b;
    if (p_.op_comm[a] == p_.op_comm[b] && p_.op_size_bytes[a] == p_.op_size_bytes[b]) return true;
    result_.fault = Fault{"mismatch", node_a, static_cast<int32_t>(op_a), node_b, static_cast<int32_t>(op_b)};
    return false;
  }

  int32_t new_waiter(const Waiter& w) {
    if (free_waiter_ < 0) {
      waiters_.push_back(w);
      return static_cast<int32_t>(waiters_.size() - 1);
    }
    int32_t id = free_waiter_;
    free_waiter_ = waiters_[id].next;
    waiters_[id] = w;
    return id;
  }

  void arrive_collective(int32_t node, int32_t s, int64_t op, int32_t local, int64_t now) {
    const int32_t instance = p_.coll_instance[static_cast<int64_t>(p_.op_spec[op]) * p_.num_nodes + node];
    if (instance < 0 || instance >= p_.instance_size.size) {
      result_.fault = Fault{"no_group", node, local, -1, -1};
      return;
    }
    const int32_t seq = p_.op_seq[op];
    const uint64_t key = (static_cast<uint64_t>(instance) << 32) | static_cast<uint32_t>(seq);
    PendingCollective* slot = &open_[instance];
    bool inline_slot = true;  // a key lives in the inline slot or in the overflow map, never both
    if (slot->seq != seq) {
      auto found = overflow_.find(key);
      if (found != overflow_.end() || slot->seq >= 0) {
        slot = found != overflow_.end() ? &found->second : &overflow_[key];
        inline_slot = false;
      }
    }
    slot->seq = seq;
    PendingCollective& pending = *slot;
    if (pending.first_waiter >= 0) {
      const Waiter& first = waiters_[pending.first_waiter];
      if (!same_message(first.node, first.op, node, local)) return;
    }
    pending.arrived += 1;
    pending.last_arrival_ns = std::max(pending.last_arrival_ns, now);
    pending.cost_ns = std::max(pending.cost_ns, p_.op_cost_ns[op]);
    pending.nic_factor = std::max(pending.nic_factor, p_.nic_factor[node]);
    pending.first_waiter = new_waiter(Waiter{node, s, local, pending.first_waiter});
    if (pending.arrived < p_.instance_size[instance]) return;
    const PendingCollective done = pending;
    if (inline_slot) {
      open_[instance] = PendingCollective{};
    } else {
      overflow_.erase(key);
    }
    const int64_t end = done.last_arrival_ns + std::llround(done.cost_ns * done.nic_factor);
    for (int32_t id = done.first_waiter; id >= 0;) {
      const Waiter w = waiters_[id];
      waiters_[id].next = free_waiter_;
      free_waiter_ = id;
      finish_op(w, done.last_arrival_ns, end);
      id = w.next;
    }
  }

  static uint64_t p2p_key(int8_t type, int32_t spec, int32_t seq) {
    const uint64_t high = (static_cast<uint64_t>(type) << 60) | (static_cast<uint64_t>(spec) << 32);
    return high | static_cast<uint32_t>(seq);
  }

  void index_p2p() {
    p2p_index_.resize(p_.num_roles);
    for (int32_t r = 0; r < p_.num_roles; ++r) {
      const int64_t base = p_.stream_begin[r * S_], end = p_.stream_begin[(r + 1) * S_];
      for (int64_t op = base; op < end; ++op) {
        if (p_.op_type[op] == kSend || p_.op_type[op] == kRecv) {
          const uint64_t key = p2p_key(p_.op_type[op], p_.op_spec[op], p_.op_seq[op]);
          p2p_index_[r][key] = static_cast<int32_t>(op - base);
        }
      }
    }
  }

  // A p2p op completes once its partner (the peer's opposite op with the partner spec and the same
  // seq) has been posted: both are then "there". Each side observes the other and completes itself,
  // so one posted receive can serve every node that stands for a sender of it (symmetric mode).
  void arrive_p2p(int32_t node, int32_t s, int64_t op, int32_t local, int64_t now) {
    (void)now;
    const int32_t spec = p_.op_spec[op];
    const int32_t peer = p_.p2p_peer[static_cast<int64_t>(spec) * p_.num_nodes + node];
    if (peer < 0 || peer >= p_.num_nodes) {
      result_.fault = Fault{"no_peer", node, local, -1, -1};
      return;
    }
    const Waiter self{node, s, local, -1};
    auto waiting = p2p_waiting_.find(slot(node, local));
    if (waiting != p2p_waiting_.end()) {
      for (int32_t id = waiting->second; id >= 0 && result_.fault.kind.empty();) {
        const Waiter w = waiters_[id];
        waiters_[id].next = free_waiter_;
        free_waiter_ = id;
        meet(w, self);
        id = w.next;
      }
      p2p_waiting_.erase(waiting);
    }
    const int8_t partner_type = p_.op_type[op] == kSend ? kRecv : kSend;
    const auto& index = p2p_index_[role(peer)];
    auto partner = index.find(p2p_key(partner_type, p_.p2p_partner[spec], p_.op_seq[op]));
    if (partner == index.end()) return;  // never completes: reported as stuck
    const Waiter other{peer, -1, partner->second, -1};
    if (result_.timeline[slot(peer, other.op)].start_ns >= 0) {
      meet(self, other);
    } else {
      auto& head = p2p_waiting_.emplace(slot(peer, other.op), -1).first->second;
      head = new_waiter(Waiter{node, s, local, head});
    }
  }

  // `w` observes its posted partner `other`: both there at the later post, done after the transfer.
  void meet(const Waiter& w, const Waiter& other) {
    if (!same_message(other.node, other.op, w.node, w.op)) return;
    const int64_t ready = std::max(result_.timeline[slot(w.node, w.op)].start_ns,
                                   result_.timeline[slot(other.node, other.op)].start_ns);
    const int64_t cost =
        std::max(p_.op_cost_ns[role_base(w.node) + w.op], p_.op_cost_ns[role_base(other.node) + other.op]);
    const double nic = std::max(p_.nic_factor[w.node], p_.nic_factor[other.node]);
    finish_op(w, ready, ready + std::llround(cost * nic));
  }

  void collect_stuck() {
    for (int32_t node = 0; node < p_.num_nodes; ++node) {
      for (int32_t s = 0; s < S_; ++s) {
        const StreamState& st = streams_[static_cast<size_t>(node) * S_ + s];
        if (st.done >= stream_length(node, s)) continue;
        const int64_t first_local = first_op(node, s) - role_base(node);
        int32_t waiting = st.done;
        std::string why = "deps";
        if (!st.blocked) {
          // In flight: report the first op of the batch that never completed.
          while (waiting + 1 < st.batch_end &&
                 result_.timeline[slot(node, first_local + waiting)].end_ns >= 0) {
            ++waiting;
          }
          why = p_.op_type[first_op(node, s) + waiting] == kCollective ? "collective" : "p2p";
        }
        result_.stuck.push_back(Stuck{node, s, static_cast<int32_t>(first_local + waiting), why});
      }
    }
  }
};

}  // namespace

Result run(const Problem& problem) { return Simulator(problem).run(); }

}  // namespace prism::sim
