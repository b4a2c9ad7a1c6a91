// prism_megatron._C.clock: the clock primitives of clock.h for Python (tests, benchmarks, and the
// Python face in prism_megatron/replay/clock.py). Every call that waits releases the GIL, so other
// Python threads run while a wait spins.
//
// CPU builds include pybind11 alone (about 11 s to compile); the CUDA bindings, which need ATen for
// tensors and the current stream, are compiled only in CUDA builds.
#include "registry.h"
#include "replay/clock.h"

#include <pybind11/stl.h>

#ifdef PRISM_WITH_CUDA
#include <ATen/ATen.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
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

}  // namespace

PRISM_SUBMODULE(clock, [](py::module_& m) { bind_cpu(m); });
