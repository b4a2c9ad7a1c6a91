// prism_megatron._C.backend: activation state and the creator of prism backends, for the Python face
// (prism_megatron/backend/). The creator returns a c10d::Backend that torch registers in a
// ProcessGroup like any other backend.
#include "registry.h"

#include <torch/csrc/utils/pybind.h>

#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "replay/engine.h"
#include "replay/op_log.h"

namespace py = pybind11;

namespace prism::backend {
namespace {

void configure_process(int64_t world_size, int64_t virtual_rank, int64_t physical_rank,
                       const std::vector<int64_t>& real_ranks, const std::vector<int64_t>& roles, double timeout_s,
                       bool check_consistency) {
  if (world_size < 1 || virtual_rank < 0 || virtual_rank >= world_size) {
    throw py::value_error("virtual_rank " + std::to_string(virtual_rank) + " must lie in [0, world_size " +
                          std::to_string(world_size) + ")");
  }
  if (!roles.empty() && static_cast<int64_t>(roles.size()) != world_size) {
    throw py::value_error("roles must give one role per virtual rank (" + std::to_string(world_size) + "), got " +
                          std::to_string(roles.size()));
  }
  auto ctx = std::make_shared<BackendContext>();
  ctx->world_size = world_size;
  ctx->virtual_rank = virtual_rank;
  ctx->physical_rank = physical_rank;
  ctx->is_real.assign(world_size, 0);
  for (int64_t r : real_ranks) {
    if (r < 0 || r >= world_size) {
      throw py::value_error("real rank " + std::to_string(r) + " is not a virtual rank of a world of " +
                            std::to_string(world_size));
    }
    ctx->is_real[r] = 1;
  }
  if (ctx->is_real[virtual_rank] == 0) {
    throw py::value_error("virtual_rank " + std::to_string(virtual_rank) + " must be one of real_ranks");
  }
  ctx->roles = roles;
  ctx->timeout_ns = static_cast<int64_t>(timeout_s * 1e9);
  ctx->check_consistency = check_consistency;
  configure(std::move(ctx));
  replay::engine().set_virtual_rank(virtual_rank);
  replay::op_log().set_process_label("virtual rank " + std::to_string(virtual_rank) + " (physical rank " +
                                     std::to_string(physical_rank) + ")");
}

c10::intrusive_ptr<c10d::Backend> create_backend(int group_rank, int group_size, std::vector<int64_t> members,
                                                 const std::string& group_name, const py::object& real) {
  auto ctx = context();
  if (!ctx) {
    throw std::runtime_error("prism: the backend is not active; call prism_megatron.backend.activate() first");
  }
  if (static_cast<int64_t>(members.size()) != group_size || group_rank < 0 || group_rank >= group_size) {
    throw py::value_error("group " + group_name + ": rank " + std::to_string(group_rank) + " of " +
                          std::to_string(group_size) + " with " + std::to_string(members.size()) + " members");
  }
  c10::intrusive_ptr<c10d::Backend> real_backend;
  if (!real.is_none()) {
    real_backend = real.cast<c10::intrusive_ptr<c10d::Backend>>();
  }
  return c10::make_intrusive<PrismBackend>(group_rank, group_size, std::move(members), group_name,
                                           std::move(real_backend), ctx);
}

// Who is real in a group, as the backend sees it (for tests and diagnostics).
py::dict describe_group(const std::vector<int64_t>& members, int64_t self_index) {
  auto ctx = context();
  if (!ctx) {
    throw std::runtime_error("prism: the backend is not active");
  }
  GroupLayout layout(members, self_index, *ctx);
  std::vector<int64_t> stand_in(layout.size());
  std::vector<int64_t> source(layout.size());
  for (int64_t m = 0; m < layout.size(); ++m) {
    stand_in[m] = layout.stand_in(m);
    source[m] = layout.source_stand_in(m);
  }
  std::vector<int64_t> counts(layout.num_real());
  for (int64_t r = 0; r < layout.num_real(); ++r) {
    counts[r] = layout.stand_in_count(r);
  }
  py::dict out;
  out["real_positions"] = layout.real_positions();
  out["stand_in"] = stand_in;
  out["source_stand_in"] = source;
  out["counts"] = counts;
  return out;
}

void bind(py::module_& m) {
  m.def("configure", &configure_process, py::arg("world_size"), py::arg("virtual_rank"), py::arg("physical_rank"),
        py::arg("real_ranks"), py::arg("roles"), py::arg("timeout_s"), py::arg("check_consistency"),
        "Set this process's activation facts; every prism backend created afterwards uses them.");
  m.def("clear", &clear_context, "Forget the activation facts (backends already created keep theirs).");
  m.def("is_configured", [] { return static_cast<bool>(context()); });
  m.def("create_backend", &create_backend, py::arg("group_rank"), py::arg("group_size"), py::arg("members"),
        py::arg("group_name"), py::arg("real"),
        "A prism c10d Backend for one group; real is the sub-communicator among its real members or None.");
  m.def("describe_group", &describe_group, py::arg("members"), py::arg("self_index"));
  m.def("clear_device_failure", &clear_device_failure,
        "Forget a device run's failure and let device waits run again (a new activation).");
  m.def("device_failure", [] {
    auto failure = device_failure();
    if (!failure) {
      return std::string();
    }
    try {
      std::rethrow_exception(failure);
    } catch (const std::exception& e) {
      return std::string(e.what());
    }
  }, "The message of a device run's failure ('' when none).");
}

}  // namespace
}  // namespace prism::backend

PRISM_SUBMODULE(backend, prism::backend::bind);
