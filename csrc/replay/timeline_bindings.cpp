// prism_megatron._C.timeline and ._C.test_device: the device timeline and the asynchronous test
// device for Python (typed faces: prism_megatron/replay/timeline.py and test_device.py). pybind11
// alone; every call that may wait releases the GIL.
#include "registry.h"
#include "replay/clock.h"
#include "replay/test_device.h"
#include "replay/timeline.h"

#include <pybind11/stl.h>

#include <memory>
#include <string>
#include <vector>

namespace py = pybind11;

namespace prism {
namespace {

using Release = py::call_guard<py::gil_scoped_release>;

std::vector<int64_t> resolve_all(const std::vector<int64_t>& marks, int64_t timeout_ns) {
  std::vector<int64_t> out;
  out.reserve(marks.size());
  for (const int64_t mark : marks) {
    out.push_back(timeline::resolve(mark, timeout_ns));
  }
  return out;
}

// Compute of a known length where the program issues work: the active device's current stream,
// else the host (a wait of that length).
void compute(int64_t duration_ns) {
  if (duration_ns < 0) {
    throw py::value_error("duration_ns must be >= 0, got " + std::to_string(duration_ns));
  }
  device::Queue* queue = timeline::active_queue();
  if (queue == nullptr) {
    py::gil_scoped_release release;
    clock::wait_until_ns(clock::now_ns() + duration_ns);
    return;
  }
  queue->compute(queue->current_stream(), duration_ns);
}

void bind_timeline(py::module_& m) {
  m.def("mark", &timeline::mark, "A mark on the active device's current stream (the host clock without one).");
  m.def("mark_at", &timeline::mark_at, py::arg("t_ns"), "A host time as an already resolved mark.");
  m.def("value", &timeline::value, py::arg("mark"), "The mark's time; 0 while the device has not got there.");
  m.def("resolve", &resolve_all, Release(), py::arg("marks"), py::arg("timeout_ns"),
        "The marks' times, waiting (GIL released) until the device has passed each.");
  m.def("active_name", &timeline::active_name);
  m.def("use_cuda", &timeline::use_cuda, py::arg("on"));
  m.def("force_host_clock", &timeline::force_host_clock, py::arg("on"));
  m.def("cuda_in_use", &timeline::cuda_in_use);
  m.def("compute", &compute, py::arg("duration_ns"));
  m.def("abort_device_waits", &timeline::abort_device_waits);
  m.def("clear_abort", &timeline::clear_abort);
  m.def("aborted", &timeline::aborted);
}

// An event of the test device: a point of one stream, and a mark that gives its time.
struct TestEvent {
  std::shared_ptr<device::Event> event;
  int64_t mark = -1;
};

void bind_test_device(py::module_& m) {
  m.def("activate", &test_device::activate);
  m.def("deactivate", &test_device::deactivate, Release());
  m.def("active", &test_device::active);
  m.def("new_stream", &test_device::new_stream);
  m.def("current_stream", &test_device::current_stream);
  m.def("set_current_stream", &test_device::set_current_stream, py::arg("stream"));
  m.def("synchronize", &test_device::synchronize, Release());
  m.def("synchronize_stream", &test_device::synchronize_stream, Release(), py::arg("stream"));
  m.def("num_pending", &test_device::num_pending);
  m.def("num_streams", &test_device::num_streams);
  m.def("set_capturing", &test_device::set_capturing, py::arg("stream"), py::arg("on"));
  m.def("set_device_error", &test_device::set_device_error, py::arg("message"));
  py::class_<TestEvent>(m, "Event")
      .def(py::init<>())
      .def(
          "record",
          [](TestEvent& e) {
            auto& queue = test_device::queue();
            const auto stream = queue.current_stream();
            e.mark = timeline::mark_on(&queue, stream);
            e.event = queue.record(stream);
          },
          "Record on the current stream.")
      .def("query", [](TestEvent& e) { return e.event == nullptr || test_device::queue().query(*e.event); })
      .def(
          "synchronize",
          [](TestEvent& e) {
            if (e.event != nullptr) {
              test_device::queue().synchronize(*e.event);
            }
          },
          Release())
      .def(
          "wait",
          [](TestEvent& e) {
            if (e.event != nullptr) {
              auto& queue = test_device::queue();
              queue.wait(queue.current_stream(), e.event);
            }
          },
          "The current stream waits (on the device) for the event.")
      .def_readonly("mark", &TestEvent::mark);
}

}  // namespace
}  // namespace prism

PRISM_SUBMODULE(timeline, prism::bind_timeline);
PRISM_SUBMODULE(test_device, prism::bind_test_device);
