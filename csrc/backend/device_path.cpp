// The CUDA path of the prism backend (CUDA builds only; the CPU build compiles this file to nothing).
//
// An op on CUDA tensors runs on the backend's own stream, the way NCCL runs on its communication
// stream: the stream first waits for the issuing stream (the op's own arrival is when the device
// gets there), then for the real part on the NCCL sub-communicator (NCCL's Work::wait makes our
// stream wait, not the host), then runs the local part (mirror arithmetic), then a wait-until kernel
// that spins on the GPU timer until max(own arrival, iteration start + the virtual members' arrival
// offset) + cost. Work::wait() makes the caller's stream wait for the op's end event; the host never
// blocks. Compute queued on other streams overlaps the wait, as it would overlap NCCL.
//
// Not on this path (yet): the consistency check among real members and the host-side timeout (a
// device wait cannot be interrupted); the op log records issue and start, and the completion when
// the host first sees the op done (isCompleted).
#include "backend/backend.h"

#ifdef PRISM_WITH_CUDA
#include <ATen/core/LegacyTypeDispatch.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>

#include <deque>
#include <mutex>

#include "replay/clock.h"
#include "replay/device_start.h"

namespace prism::backend {

// A CUDA event without timing (c10 and the runtime only: ATen's CUDA headers need the whole toolkit).
class Event {
 public:
  Event() { check(cudaEventCreateWithFlags(&event_, cudaEventDisableTiming), "cudaEventCreate"); }
  ~Event() { cudaEventDestroy(event_); }
  Event(const Event&) = delete;
  Event& operator=(const Event&) = delete;

  void record(const c10::cuda::CUDAStream& stream) { check(cudaEventRecord(event_, stream.stream()), "cudaEventRecord"); }
  // `stream` waits (on the device) for the work recorded before this event.
  void block(const c10::cuda::CUDAStream& stream) const {
    check(cudaStreamWaitEvent(stream.stream(), event_, 0), "cudaStreamWaitEvent");
  }
  bool query() const {
    const cudaError_t status = cudaEventQuery(event_);
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error: clear it
      return false;
    }
    check(status, "cudaEventQuery");
    return true;
  }

 private:
  static void check(cudaError_t status, const char* what) {
    TORCH_CHECK(status == cudaSuccess, "prism backend: ", what, " failed: ", cudaGetErrorString(status));
  }
  cudaEvent_t event_ = nullptr;
};

struct DeviceState {
  explicit DeviceState(c10::DeviceIndex index) : stream(c10::cuda::getStreamFromPool(false, index)) {}
  c10::cuda::CUDAStream stream;
};

namespace {

// What an op's kernels still use (its plan's closures own temporaries such as packed all-to-all
// buffers), kept until its end event has passed, so the caching allocator never hands that memory
// out while our stream is still reading it.
struct InFlight {
  std::shared_ptr<Event> done;
  std::shared_ptr<OpPlan> plan;
};

std::mutex in_flight_mu;
std::deque<InFlight> in_flight;

void keep_until_done(InFlight entry) {
  std::lock_guard<std::mutex> lock(in_flight_mu);
  while (!in_flight.empty() && in_flight.front().done->query()) {
    in_flight.pop_front();
  }
  in_flight.push_back(std::move(entry));
}

class DeviceWork : public c10d::Work {
 public:
  DeviceWork(int group_rank, c10d::OpType op_type, std::vector<at::Tensor> outputs, c10::cuda::CUDAStream stream,
             std::shared_ptr<Event> done, int64_t log_id)
      : c10d::Work(group_rank, op_type),
        outputs_(std::move(outputs)),
        stream_(stream),
        done_(std::move(done)),
        log_id_(log_id) {}

  bool isCompleted() override {
    if (!done_->query()) {
      return false;
    }
    std::call_once(settled_, [this] {
      replay::op_log().complete(log_id_, clock::now_ns(), true);
      finish();
    });
    return true;
  }

  bool isSuccess() const override { return true; }

  // The caller's stream waits for the op; the host does not.
  bool wait(std::chrono::milliseconds /*timeout*/) override {
    done_->block(c10::cuda::getCurrentCUDAStream(stream_.device_index()));
    return true;
  }

  void synchronize() override { wait(kNoTimeout); }

  std::vector<at::Tensor> result() override { return outputs_; }

  // A CUDA-aware future: waiting on it makes the waiter's stream wait for the op's stream.
  c10::intrusive_ptr<c10::ivalue::Future> getFuture() override {
    auto future = c10::make_intrusive<c10::ivalue::Future>(c10::ListType::create(c10::TensorType::get()),
                                                           std::vector<c10::Device>{stream_.device()});
    const c10::cuda::CUDAStreamGuard guard(stream_);
    future->markCompleted(c10::IValue(outputs_));
    return future;
  }

 private:
  std::vector<at::Tensor> outputs_;
  c10::cuda::CUDAStream stream_;
  std::shared_ptr<Event> done_;
  int64_t log_id_;
  std::once_flag settled_;
};

}  // namespace

c10::intrusive_ptr<c10d::Work> PrismBackend::launch_on_device(OpPlan plan, WorkSpec spec,
                                                              const replay::Timing& timing, bool has_virtual,
                                                              bool real_part) {
  const c10::cuda::CUDAGuard device_guard(plan.device);
  const auto index = plan.device.index();
  if (!device_ || device_->stream.device_index() != index) {
    device_ = std::make_shared<DeviceState>(index);
  }
  const auto stream = device_->stream;
  const auto issuing = c10::cuda::getCurrentCUDAStream(index);
  auto owned = std::make_shared<OpPlan>(std::move(plan));
  try {
    at::AutoDispatchBelowAutograd below_autograd;  // like a real backend, write below autograd
    c10::intrusive_ptr<c10d::Work> real_work;
    if (real_part && owned->issue_real) {
      real_work = owned->issue_real();  // NCCL orders itself after the issuing stream
    }
    Event ready;
    ready.record(issuing);
    ready.block(stream);
    const c10::cuda::CUDAStreamGuard on_stream(stream);
    if (real_work) {
      real_work->wait();  // our stream waits for NCCL's; the host does not
    }
    if (owned->local) {
      owned->local();
    }
    if (has_virtual) {
      cuda_clock::enqueue_wait_until(stream.stream(), replay::device_iteration_start(index), timing.arrival_offset_ns,
                                     timing.cost_ns);
    }
    for (const auto& t : owned->outputs) {
      c10::cuda::CUDACachingAllocator::recordStream(t.storage().data_ptr(), stream);
    }
    auto done = std::make_shared<Event>();
    done->record(stream);
    keep_until_done({done, owned});
    return c10::make_intrusive<DeviceWork>(rank_, spec.op_type, owned->outputs, stream, std::move(done), spec.log_id);
  } catch (...) {
    replay::op_log().complete(spec.log_id, clock::now_ns(), false);
    throw;
  }
}

}  // namespace prism::backend
#endif  // PRISM_WITH_CUDA
