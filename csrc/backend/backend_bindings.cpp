// prism_megatron._C.backend: activation state and the creator of prism backends, for the Python face
// (prism_megatron/backend/). The creator returns a c10d::Backend that torch registers in a
// ProcessGroup like any other backend.
#include "registry.h"

#include <torch/csrc/utils/pybind.h>

#include <cmath>
#include <limits>
#include <memory>
#include <string>
#include <vector>

#include "backend/backend.h"
#include "backend/exit_guard.h"
#include "replay/engine.h"
#include "replay/op_log.h"

namespace py = pybind11;

namespace prism::backend {
namespace {

// Argument errors are the caller's: ValueError naming the argument, the value and what is valid.
void require(bool ok, const std::string& message) {
  if (!ok) {
    throw py::value_error("prism: " + message);
  }
}

// c10d ranks are ints; a world larger than that cannot be a process group.
constexpr int64_t kMaxWorldSize = std::numeric_limits<int>::max();
// timeout_s * 1e9 must fit in int64 ns (about 292 years): 1e9 s (31 years) leaves room and is no limit.
constexpr double kMaxTimeoutS = 1e9;

void configure_process(int64_t world_size, int64_t virtual_rank, int64_t physical_rank,
                       const std::vector<int64_t>& real_ranks, const std::vector<int64_t>& roles, double timeout_s,
                       bool check_consistency) {
  require(world_size >= 1 && world_size <= kMaxWorldSize, "world_size " + std::to_string(world_size) +
                                                              " must lie in [1, " + std::to_string(kMaxWorldSize) + "]");
  require(virtual_rank >= 0 && virtual_rank < world_size, "virtual_rank " + std::to_string(virtual_rank) +
                                                              " must lie in [0, world_size " +
                                                              std::to_string(world_size) + ")");
  require(roles.empty() || static_cast<int64_t>(roles.size()) == world_size,
          "roles must give one role per virtual rank (" + std::to_string(world_size) + ") or none, got " +
              std::to_string(roles.size()));
  require(std::isfinite(timeout_s) && timeout_s > 0 && timeout_s <= kMaxTimeoutS,
          "timeout_s " + std::to_string(timeout_s) + " must be a number of seconds in (0, 1e9]");
  auto ctx = std::make_shared<BackendContext>();
  ctx->world_size = world_size;
  ctx->virtual_rank = virtual_rank;
  ctx->physical_rank = physical_rank;
  ctx->is_real.assign(world_size, 0);
  for (size_t i = 0; i < real_ranks.size(); ++i) {
    const int64_t r = real_ranks[i];
    require(r >= 0 && r < world_size, "real_ranks[" + std::to_string(i) + "] = " + std::to_string(r) +
                                          " is not a virtual rank: real ranks must lie in [0, world_size " +
                                          std::to_string(world_size) + ")");
    require(ctx->is_real[r] == 0,
            "virtual rank " + std::to_string(r) + " appears more than once in real_ranks; they must be distinct");
    ctx->is_real[r] = 1;
  }
  require(ctx->is_real[virtual_rank] != 0,
          "virtual_rank " + std::to_string(virtual_rank) + " must be one of real_ranks (this process is real)");
  const auto num_real = static_cast<int64_t>(real_ranks.size());
  require(physical_rank >= 0 && physical_rank < num_real, "physical_rank " + std::to_string(physical_rank) +
                                                              " must lie in [0, " + std::to_string(num_real) +
                                                              ") (one per real rank)");
  ctx->roles = roles;
  ctx->timeout_ns = static_cast<int64_t>(timeout_s * 1e9);
  ctx->check_consistency = check_consistency;
  configure(std::move(ctx));
  replay::engine().set_virtual_rank(virtual_rank);
  replay::op_log().set_process_label("virtual rank " + std::to_string(virtual_rank) + " (physical rank " +
                                     std::to_string(physical_rank) + ")");
}

std::shared_ptr<const BackendContext> active_context() {
  auto ctx = context();
  if (!ctx) {
    throw std::runtime_error("prism: the backend is not active; call prism_megatron.backend.activate() first");
  }
  return ctx;
}

// Every argument is checked (PrismBackend::create) before anything of the backend is built.
c10::intrusive_ptr<c10d::Backend> create_backend(int64_t group_rank, int64_t group_size, std::vector<int64_t> members,
                                                 const std::string& group_name, const py::object& real) {
  auto ctx = active_context();
  c10::intrusive_ptr<c10d::Backend> real_backend;
  if (!real.is_none()) {
    try {
      real_backend = real.cast<c10::intrusive_ptr<c10d::Backend>>();
    } catch (const py::cast_error&) {
      throw py::type_error("prism: group " + group_name +
                           ": real must be a torch.distributed Backend (the real sub-communicator) or None, got " +
                           std::string(py::str(py::type::of(real).attr("__name__"))));
    }
  }
  return PrismBackend::create(group_rank, group_size, std::move(members), group_name, std::move(real_backend),
                              std::move(ctx));
}

// Who is real in a group, as the backend sees it (for tests and diagnostics); the same checks as
// create_backend's on members and self_index.
py::dict describe_group(const std::vector<int64_t>& members, int64_t self_index) {
  auto ctx = active_context();
  const GroupLayout layout = GroupLayout::checked(members, self_index, *ctx, "describe_group");
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
  m.def("close_release_gate", &close_release_gate, py::call_guard<py::gil_scoped_release>(),
        "At exit: the backend's threads stop releasing tensors (csrc/backend/exit_guard.h).");
  m.def("clear", &clear_context, "Forget the activation facts (backends already created keep theirs).");
  m.def("is_configured", [] { return static_cast<bool>(context()); });
  m.def("create_backend", &create_backend, py::arg("group_rank"), py::arg("group_size"), py::arg("members"),
        py::arg("group_name"), py::arg("real"),
        "A prism c10d Backend for one group; real is the sub-communicator among its real members or None.");
  m.def("describe_group", &describe_group, py::arg("members"), py::arg("self_index"));
  m.def("set_consistency_deferred", &set_consistency_deferred, py::arg("deferred"),
        "Defer the consistency check among real members (issued after the real op, checked later).");
  m.def("consistency_deferred", &consistency_deferred);
  m.def("set_poll_real_waits", &set_poll_real_waits, py::arg("poll"),
        "Wait for real parts polling with sched_yield instead of blocking (a process with its own core).");
  m.def("poll_real_waits", &poll_real_waits);
  m.def("settle_consistency_checks", [](double timeout_s) {
    py::gil_scoped_release no_gil;
    settle_consistency_checks(static_cast<int64_t>(timeout_s * 1e9));
  }, py::arg("timeout_s"), "Wait for every deferred consistency check and run it; raises the first mismatch.");
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
