// The discrete-event simulator core: one iteration of an execution graph over a network model.
//
// The graph arrives as flat arrays built by prism_megatron/sim/problem.py (the array names and
// meanings are documented there); this core never allocates per op beyond its outputs and never
// calls Python. Semantics (the Python reference prism_megatron/sim/reference.py implements the same):
//
// * A node (a virtual rank, or a role's representative in symmetric mode) runs its role's streams
//   concurrently. A stream posts its next batch (an op plus the ops coalesced after it) once the
//   previous batch completed and every cross-stream dependency of the batch has completed.
// * COMPUTE completes after its host overhead plus the rest of its duration (the device work) *
//   the node's compute factor (* its expert factor for expert compute); WAIT once its
//   dependencies have
//   (its span starts where the stream reached it, so the time the stream lost shows).
// * COLLECTIVE: matched across the nodes of its group instance by the op's sequence number; completes
//   for every member at (last arrival) + cost * (largest NIC factor among the members).
// * SEND / RECV: an op's partner is its peer node's opposite op with the partner spec (the same
//   group kind, the opposite offset) and the same sequence number. Each completes at
//   max(own post, partner post) + cost * (larger NIC factor of the two). A posted op may be the
//   partner of several nodes' ops: in symmetric mode a role's receive stands for its members', and
//   they may receive from ranks of different roles.
// * Events are processed from a heap keyed by (time_ns, push order), so runs are deterministic.
// * When the heap empties with ops left, the run reports every stuck stream instead of hanging.
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace prism::sim {

enum NodeType : int8_t { kCompute = 0, kCollective = 1, kSend = 2, kRecv = 3, kWait = 4 };

template <typename T>
struct View {
  const T* data = nullptr;
  int64_t size = 0;
  const T& operator[](int64_t i) const { return data[i]; }
};

// The immutable input. Ops of role r, stream s are op indices [stream_begin[r*S+s], stream_begin[r*S+s+1]).
struct Problem {
  int32_t num_nodes = 0;
  int32_t num_roles = 0;
  int32_t num_streams = 0;  // S: streams per role (roles with fewer streams leave some empty)
  View<int32_t> node_role;
  View<double> compute_factor;
  View<double> nic_factor;
  View<double> expert_factor;  // on top of compute_factor, for ops flagged in op_expert
  View<int64_t> stream_begin;
  View<int8_t> op_type;
  View<int8_t> op_comm;
  View<uint8_t> op_coalesced;
  View<uint8_t> op_expert;
  View<int64_t> op_duration_ns;
  View<int64_t> op_overhead_ns;  // host part of a compute op's duration: not stretched by a straggler
  View<int64_t> op_cost_ns;
  View<int64_t> op_size_bytes;
  View<int32_t> op_spec;  // collective: index into coll_instance rows; p2p: into p2p_peer rows
  View<int32_t> op_seq;
  View<int32_t> op_dep_begin;  // deps of op i: [op_dep_begin[i], op_dep_begin[i+1])
  View<int32_t> dep_stream;
  View<int32_t> dep_index;  // index within dep_stream's ops
  View<int32_t> coll_instance;  // [spec * num_nodes + node] -> group instance id, -1 if none
  View<int32_t> instance_size;  // nodes taking part in each instance
  View<int32_t> p2p_peer;  // [spec * num_nodes + node] -> peer node, -1 if none
  View<int32_t> p2p_partner;  // spec -> the spec the peer names us by (same kind, opposite offset)
};

// Why a run stopped early. Ops are identified by node and the op's index within its role.
struct Fault {
  // "mismatch" (matched ops disagree), "no_group" / "no_peer" (the node has no such group or peer),
  // or "" when none.
  std::string kind;
  int32_t node_a = -1, op_a = -1, node_b = -1, op_b = -1;
};

// A stream that could not finish: node, stream, the role-local op it is stuck at, and its state.
struct Stuck {
  int32_t node, stream, op;
  std::string waiting_for;  // "deps", "collective" or "p2p"
};

// When one op of one node was posted, had every participant, and completed; -1 where never
// reached. One struct per op: the loop touches all three at once, scattered over the timeline.
struct OpTimes {
  int64_t start_ns = -1;
  int64_t ready_ns = -1;
  int64_t end_ns = -1;
};

struct Result {
  std::vector<int64_t> node_op_base;  // timeline of node n: [node_op_base[n], node_op_base[n+1])
  std::vector<OpTimes> timeline;
  int64_t makespan_ns = 0;
  int64_t num_events = 0;
  Fault fault;
  std::vector<Stuck> stuck;
};

Result run(const Problem& problem);

}  // namespace prism::sim
