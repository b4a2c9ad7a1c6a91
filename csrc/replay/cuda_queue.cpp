// The CUDA queue (contract in device_queue.h): streams are CUDA streams of one device, events are
// CUDA events without timing (times come from the stamp kernel, on the same GPU timer as the wait
// kernels), the kernels are those of wait_kernel.cu. CUDA builds only; the CPU build compiles this
// file to nothing.
//
// c10/cuda headers only (not ATen/cuda), so a minimal toolkit builds it.
#include "replay/device_queue.h"

#ifdef PRISM_WITH_CUDA
#include <c10/cuda/CUDAFunctions.h>
#include <c10/cuda/CUDAGuard.h>
#include <c10/cuda/CUDAStream.h>
#include <cuda_runtime_api.h>

#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include "replay/clock.h"

namespace prism::device {

namespace {

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("prism cuda queue: ") + what + " failed: " + cudaGetErrorString(status));
  }
}

cudaStream_t as_cuda(StreamId stream) { return reinterpret_cast<cudaStream_t>(stream); }
StreamId as_id(cudaStream_t stream) { return reinterpret_cast<StreamId>(stream); }

class CudaEvent : public Event {
 public:
  CudaEvent() { check(cudaEventCreateWithFlags(&event, cudaEventDisableTiming), "cudaEventCreate"); }
  ~CudaEvent() override { cudaEventDestroy(event); }
  CudaEvent(const CudaEvent&) = delete;
  CudaEvent& operator=(const CudaEvent&) = delete;
  cudaEvent_t event = nullptr;
};

class CudaQueue : public Queue {
 public:
  explicit CudaQueue(c10::DeviceIndex index) : index_(index) {}

  const char* name() const override { return "cuda"; }

  StreamId current_stream() override { return as_id(c10::cuda::getCurrentCUDAStream(index_).stream()); }

  // A stream of the backend's own, never torch's pool: the pool hands each of its 32 streams out
  // again every 32nd request, so a helper stream could be the communication stream it must release.
  // Non-blocking (no implicit sync with the legacy default stream), like NCCL's and the pool's.
  // Never destroyed: works and futures refer to it until the process ends.
  StreamId new_stream() override {
    const c10::cuda::CUDAGuard guard(index_);
    cudaStream_t stream = nullptr;
    check(cudaStreamCreateWithFlags(&stream, cudaStreamNonBlocking), "cudaStreamCreateWithFlags");
    return as_id(stream);
  }

  bool capturing(StreamId stream) override {
    cudaStreamCaptureStatus status = cudaStreamCaptureStatusNone;
    const cudaError_t error = cudaStreamIsCapturing(as_cuda(stream), &status);
    if (error == cudaErrorStreamCaptureImplicit) {
      (void)cudaGetLastError();  // the legacy default stream while another stream captures: capturing too
      return true;
    }
    check(error, "cudaStreamIsCapturing");
    return status != cudaStreamCaptureStatusNone;
  }

  std::shared_ptr<Event> record(StreamId stream) override {
    const c10::cuda::CUDAGuard guard(index_);
    auto event = std::make_shared<CudaEvent>();
    check(cudaEventRecord(event->event, as_cuda(stream)), "cudaEventRecord");
    return event;
  }

  void wait(StreamId stream, const std::shared_ptr<Event>& event) override {
    const c10::cuda::CUDAGuard guard(index_);
    check(cudaStreamWaitEvent(as_cuda(stream), static_cast<const CudaEvent&>(*event).event, 0),
          "cudaStreamWaitEvent");
  }

  bool query(const Event& event) override {
    const cudaError_t status = cudaEventQuery(static_cast<const CudaEvent&>(event).event);
    if (status == cudaErrorNotReady) {
      (void)cudaGetLastError();  // not an error: clear it
      return false;
    }
    check(status, "cudaEventQuery");
    return true;
  }

  void synchronize(const Event& event) override {
    check(cudaEventSynchronize(static_cast<const CudaEvent&>(event).event), "cudaEventSynchronize");
  }

  void stamp(StreamId stream, int64_t* cell) override {
    const c10::cuda::CUDAGuard guard(index_);
    cuda_clock::enqueue_stamp(as_cuda(stream), cell);
  }

  void wait_until(StreamId stream, const int64_t* start_cell, int64_t arrival_offset_ns, int64_t cost_ns,
                  int64_t* arrived_cell, const int64_t* abort_cell) override {
    const c10::cuda::CUDAGuard guard(index_);
    cuda_clock::enqueue_wait_until(as_cuda(stream), start_cell, arrival_offset_ns, cost_ns, arrived_cell, abort_cell);
  }

  void wait_flag(StreamId stream, const int64_t* flag, const int64_t* abort_cell) override {
    const c10::cuda::CUDAGuard guard(index_);
    cuda_clock::enqueue_wait_flag(as_cuda(stream), flag, abort_cell);
  }

  void compute(StreamId stream, int64_t duration_ns) override {
    const c10::cuda::CUDAGuard guard(index_);
    cuda_clock::enqueue_spin(as_cuda(stream), duration_ns);
  }

  bool data_on_host() const override { return false; }

 private:
  c10::DeviceIndex index_;
};

std::mutex mu;
std::map<int, CudaQueue*> queues;  // never freed: streams and kernels may use them until the end

}  // namespace

Queue* cuda_queue(int device_index) {
  std::lock_guard<std::mutex> lock(mu);
  auto& queue = queues[device_index];
  if (queue == nullptr) {
    queue = new CudaQueue(static_cast<c10::DeviceIndex>(device_index));
  }
  return queue;
}

Queue* current_cuda_queue() { return cuda_queue(c10::cuda::current_device()); }

}  // namespace prism::device
#endif  // PRISM_WITH_CUDA
