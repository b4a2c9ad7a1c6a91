// prism_megatron._C.clock: the clock primitives of clock.h for Python (tests, benchmarks, and the
// Python face in prism_megatron/replay/clock.py). Every call that waits releases the GIL, so other
// Python threads run while a wait spins.
//
// CPU builds include pybind11 alone (about 11 s to compile); the CUDA bindings, which need ATen for
// tensors and c10 for the current stream, are compiled only in CUDA builds. They use c10/cuda headers,
// not ATen/cuda/CUDAContext.h, which pulls in cuSPARSE and cuBLAS headers a minimal toolkit lacks.
#include "registry.h"
#include "replay/clock.h"

#include <pybind11/stl.h>

#ifdef PRISM_WITH_CUDA
#include <ATen/core/Tensor.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <torch/csrc/utils/pybind.h>
#endif

#include <stdexcept>
#include <string>

namespace py = pybind11;

namespace {

using Release = py::call_guard<py::gil_scoped_release>;

std::vector<int64_t> measure_wait_errors_ns(int64_t duration_ns, int num_waits, int64_t spin_window_ns) {
  if (duration_ns < 0) {
    throw py::value_error("duration_ns must be >= 0, got " + std::to_string(duration_ns));
  }
  if (num_waits < 1) {
    throw py::value_error("num_waits must be >= 1, got " + std::to_string(num_waits));
  }
  if (spin_window_ns < 0) {
    spin_window_ns = prism::clock::default_spin_window_ns();
  }
  py::gil_scoped_release release;
  return prism::clock::measure_wait_errors_ns(duration_ns, num_waits, spin_window_ns);
}

void bind_cpu(py::module_& m) {
  m.def("now_ns", &prism::clock::now_ns, "CLOCK_MONOTONIC in ns (the clock of time.monotonic_ns()).");
  m.def("lower_timer_slack", &prism::clock::lower_timer_slack,
        "Set the calling thread's timer slack to 1 ns (Linux); threads it creates later inherit it.");
  m.def("default_spin_window_ns", &prism::clock::default_spin_window_ns,
        "How long before a deadline wait_until_ns stops sleeping and spins.");
  m.def(
      "wait_until_ns", [](int64_t deadline_ns) { prism::clock::wait_until_ns(deadline_ns); }, Release(),
      py::arg("deadline_ns"), "Block (GIL released) until now_ns() >= deadline_ns.");
  m.def(
      "wait_until_ns_with_window",
      [](int64_t deadline_ns, int64_t spin_window_ns) {
        prism::clock::wait_until_ns(deadline_ns, spin_window_ns);
      },
      Release(), py::arg("deadline_ns"), py::arg("spin_window_ns"),
      "wait_until_ns with an explicit spin window, for measurements.");
  m.def("measure_wait_errors_ns", &measure_wait_errors_ns, py::arg("duration_ns"), py::arg("num_waits"),
        py::arg("spin_window_ns") = -1,
        "num_waits back-to-back waits of duration_ns in C++; returns each wait's error (ns). "
        "spin_window_ns < 0 uses the default window.");
}

#ifdef PRISM_WITH_CUDA

// Argument errors are the caller's: ValueError naming the argument and what is valid.
void require(bool ok, const std::string& message) {
  if (!ok) {
    throw py::value_error(message);
  }
}

void check_int64_cuda(const at::Tensor& t, const char* name) {
  require(t.is_cuda(), std::string(name) + " must be a CUDA tensor, got device " + t.device().str());
  require(t.scalar_type() == at::kLong,
          std::string(name) + " must be int64 (torch.long), got " + c10::toString(t.scalar_type()));
  require(t.numel() >= 1, std::string(name) + " must have at least one element");
}

void cuda_stamp(const at::Tensor& dst) {
  check_int64_cuda(dst, "dst");
  const c10::cuda::CUDAGuard guard(dst.device());
  prism::cuda_clock::enqueue_stamp(c10::cuda::getCurrentCUDAStream().stream(), dst.data_ptr<int64_t>());
}

void cuda_wait_until(const at::Tensor& iteration_start, int64_t arrival_offset_ns, int64_t cost_ns) {
  check_int64_cuda(iteration_start, "iteration_start");
  require(cost_ns >= 0, "cost_ns must be >= 0, got " + std::to_string(cost_ns));
  const c10::cuda::CUDAGuard guard(iteration_start.device());
  prism::cuda_clock::enqueue_wait_until(c10::cuda::getCurrentCUDAStream().stream(),
                                        iteration_start.data_ptr<int64_t>(), arrival_offset_ns, cost_ns);
}

std::vector<int64_t> cuda_measure_wait_errors_ns(int64_t duration_ns, int num_waits) {
  require(duration_ns >= 0, "duration_ns must be >= 0, got " + std::to_string(duration_ns));
  require(num_waits >= 1, "num_waits must be >= 1, got " + std::to_string(num_waits));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  py::gil_scoped_release release;
  return prism::cuda_clock::measure_wait_errors_ns(stream, duration_ns, num_waits);
}

std::vector<int64_t> cuda_sample_timer_steps_ns(int num_steps) {
  require(num_steps >= 1, "num_steps must be >= 1, got " + std::to_string(num_steps));
  const cudaStream_t stream = c10::cuda::getCurrentCUDAStream().stream();
  py::gil_scoped_release release;
  return prism::cuda_clock::sample_timer_steps_ns(stream, num_steps);
}

void bind_cuda(py::module_& m) {
  m.def("cuda_stamp", &cuda_stamp, py::arg("dst"),
        "Enqueue on the current stream a kernel writing the GPU global timer (ns) to dst[0].");
  m.def("cuda_wait_until", &cuda_wait_until, py::arg("iteration_start"), py::arg("arrival_offset_ns"),
        py::arg("cost_ns"),
        "Enqueue on the current stream a kernel that spins until "
        "max(its start, iteration_start[0] + arrival_offset_ns) + cost_ns on the GPU global timer.");
  m.def("cuda_measure_wait_errors_ns", &cuda_measure_wait_errors_ns, py::arg("duration_ns"),
        py::arg("num_waits"),
        "num_waits stamped waits of duration_ns on the current stream; returns each wait's error (ns).");
  m.def("cuda_sample_timer_steps_ns", &cuda_sample_timer_steps_ns, py::arg("num_steps"),
        "Sizes (ns) of num_steps consecutive changes of the GPU global timer, on the current stream.");
}

#endif  // PRISM_WITH_CUDA

}  // namespace

PRISM_SUBMODULE(clock, [](py::module_& m) {
  bind_cpu(m);
#ifdef PRISM_WITH_CUDA
  bind_cuda(m);
#endif
});
