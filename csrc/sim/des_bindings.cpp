// prism_megatron._C.sim: the simulator core for Python (prism_megatron/sim/engine.py is its typed
// face). Inputs are numpy arrays checked here for dtype and length; outputs are numpy arrays that
// take over the result's buffers without copying. The run releases the GIL.
#include "registry.h"
#include "sim/des.h"

#include <pybind11/numpy.h>

#include <memory>
#include <string>
#include <utility>

namespace py = pybind11;

namespace {

using prism::sim::View;

// Holds the input arrays alive (and contiguous) for the run.
class Inputs {
 public:
  explicit Inputs(py::dict arrays) : arrays_(std::move(arrays)) {}

  template <typename T>
  View<T> get(const char* name, int64_t expected_size) {
    if (!arrays_.contains(name)) throw py::value_error(std::string("sim.run: missing array '") + name + "'");
    py::object obj = arrays_[name];
    if (!py::isinstance<py::array_t<T>>(obj)) {
      throw py::value_error(std::string("sim.run: array '") + name + "' has the wrong dtype");
    }
    auto array = py::array_t<T, py::array::c_style>::ensure(obj);
    if (!array) throw py::value_error(std::string("sim.run: array '") + name + "' is not contiguous");
    if (expected_size >= 0 && array.size() != expected_size) {
      throw py::value_error(std::string("sim.run: array '") + name + "' has " + std::to_string(array.size()) +
                            " entries, expected " + std::to_string(expected_size));
    }
    held_.push_back(array);
    return View<T>{array.data(), static_cast<int64_t>(array.size())};
  }

 private:
  py::dict arrays_;
  std::vector<py::object> held_;
};

// An int64 numpy array of the given shape over `values`' buffer, moved (not copied) into it.
template <typename T>
py::array_t<int64_t> adopt(std::vector<T>&& values, std::vector<py::ssize_t> shape) {
  static_assert(sizeof(T) % sizeof(int64_t) == 0, "rows of packed int64");
  auto owner = std::make_unique<std::vector<T>>(std::move(values));
  auto* data = reinterpret_cast<int64_t*>(owner->data());
  py::capsule free_when_done(owner.get(), [](void* p) { delete static_cast<std::vector<T>*>(p); });
  owner.release();  // the capsule owns it now
  return py::array_t<int64_t>(std::move(shape), data, free_when_done);
}

// Index ranges the core relies on; per-node group and peer lookups are checked as they happen.
void check(const prism::sim::Problem& p) {
  auto fail = [](const std::string& what, int64_t i) {
    throw py::value_error("sim.run: " + what + " out of range at index " + std::to_string(i));
  };
  for (int32_t node = 0; node < p.num_nodes; ++node) {
    if (p.node_role[node] < 0 || p.node_role[node] >= p.num_roles) fail("node_role", node);
  }
  for (int64_t i = 1; i < p.stream_begin.size; ++i) {
    if (p.stream_begin[i] < p.stream_begin[i - 1]) fail("stream_begin", i);
  }
  for (int64_t op = 0; op < p.op_type.size; ++op) {
    const int8_t type = p.op_type[op];
    if (type < prism::sim::kCompute || type > prism::sim::kWait) fail("op_type", op);
    if (p.op_dep_begin[op + 1] < p.op_dep_begin[op]) fail("op_dep_begin", op);
    const bool collective = type == prism::sim::kCollective;
    const bool p2p = type == prism::sim::kSend || type == prism::sim::kRecv;
    const int64_t rows = collective ? p.coll_instance.size : p.p2p_peer.size;
    if ((collective || p2p) && (p.op_spec[op] < 0 || (p.op_spec[op] + 1) * int64_t{p.num_nodes} > rows)) {
      fail("op_spec", op);
    }
    if ((collective || p2p) && p.op_seq[op] < 0) fail("op_seq", op);
  }
  const int64_t num_p2p_specs = p.p2p_partner.size;
  for (int64_t spec = 0; spec < num_p2p_specs; ++spec) {
    if (p.p2p_partner[spec] < 0 || p.p2p_partner[spec] >= num_p2p_specs) fail("p2p_partner", spec);
  }
  for (int64_t d = 0; d < p.dep_stream.size; ++d) {
    if (p.dep_stream[d] < 0 || p.dep_stream[d] >= p.num_streams || p.dep_index[d] < 0) fail("dep", d);
  }
}

py::dict run(py::dict arrays, int32_t num_nodes, int32_t num_roles, int32_t num_streams) {
  // Events pack the node in 20 bits and the stream in 8 (see des.cpp).
  if (num_nodes < 0 || num_nodes >= (1 << 20) || num_roles < 0 || num_streams < 1 || num_streams > 255) {
    throw py::value_error("sim.run: sizes out of range (at most 2^20 - 1 nodes and 255 streams)");
  }
  Inputs in(std::move(arrays));
  prism::sim::Problem p;
  p.num_nodes = num_nodes;
  p.num_roles = num_roles;
  p.num_streams = num_streams;
  p.node_role = in.get<int32_t>("node_role", num_nodes);
  p.compute_factor = in.get<double>("compute_factor", num_nodes);
  p.nic_factor = in.get<double>("nic_factor", num_nodes);
  p.expert_factor = in.get<double>("expert_factor", num_nodes);
  p.stream_begin = in.get<int64_t>("stream_begin", static_cast<int64_t>(num_roles) * num_streams + 1);
  const int64_t num_ops = p.stream_begin[p.stream_begin.size - 1];
  p.op_type = in.get<int8_t>("op_type", num_ops);
  p.op_comm = in.get<int8_t>("op_comm", num_ops);
  p.op_coalesced = in.get<uint8_t>("op_coalesced", num_ops);
  p.op_expert = in.get<uint8_t>("op_expert", num_ops);
  p.op_duration_ns = in.get<int64_t>("op_duration_ns", num_ops);
  p.op_overhead_ns = in.get<int64_t>("op_overhead_ns", num_ops);
  p.op_cost_ns = in.get<int64_t>("op_cost_ns", num_ops);
  p.op_size_bytes = in.get<int64_t>("op_size_bytes", num_ops);
  p.op_spec = in.get<int32_t>("op_spec", num_ops);
  p.op_seq = in.get<int32_t>("op_seq", num_ops);
  p.op_dep_begin = in.get<int32_t>("op_dep_begin", num_ops + 1);
  const int64_t num_deps = p.op_dep_begin[num_ops];
  p.dep_stream = in.get<int32_t>("dep_stream", num_deps);
  p.dep_index = in.get<int32_t>("dep_index", num_deps);
  p.coll_instance = in.get<int32_t>("coll_instance", -1);
  p.instance_size = in.get<int32_t>("instance_size", -1);
  p.p2p_peer = in.get<int32_t>("p2p_peer", -1);
  p.p2p_partner = in.get<int32_t>("p2p_partner", num_nodes > 0 ? p.p2p_peer.size / num_nodes : 0);
  check(p);

  prism::sim::Result r;
  {
    py::gil_scoped_release release;
    r = prism::sim::run(p);
  }
  py::dict out;
  out["makespan_ns"] = r.makespan_ns;
  out["num_events"] = r.num_events;
  const auto num_nodes_plus_one = static_cast<py::ssize_t>(r.node_op_base.size());
  const auto num_slots = static_cast<py::ssize_t>(r.timeline.size());
  out["node_op_base"] = adopt(std::move(r.node_op_base), {num_nodes_plus_one});
  out["timeline"] = adopt(std::move(r.timeline), {num_slots, 3});  // (start, ready, end) per op
  out["fault"] = py::make_tuple(r.fault.kind, r.fault.node_a, r.fault.op_a, r.fault.node_b, r.fault.op_b);
  py::list stuck;
  for (const auto& s : r.stuck) stuck.append(py::make_tuple(s.node, s.stream, s.op, s.waiting_for));
  out["stuck"] = stuck;
  return out;
}

void bind(py::module_& m) {
  m.doc() = "Discrete-event simulator core (see csrc/sim/des.h and prism_megatron/sim/engine.py).";
  m.def("run", &run, py::arg("arrays"), py::arg("num_nodes"), py::arg("num_roles"), py::arg("num_streams"),
        "Simulate one iteration of the problem in `arrays`; returns timelines and faults as a dict.");
}

}  // namespace

PRISM_SUBMODULE(sim, bind);
