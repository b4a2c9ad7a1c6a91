// Per-device iteration start on the GPU timer (contract in device_start.h). CUDA builds only; the
// CPU build compiles this file to nothing.
#include "replay/device_start.h"

#ifdef PRISM_WITH_CUDA
#include <map>
#include <mutex>
#include <stdexcept>
#include <string>

#include "replay/clock.h"

namespace prism::replay {

namespace {

std::mutex mu;
std::map<int, int64_t*> starts;  // never freed: kernels may read them until the process ends

void check(cudaError_t status, const char* what) {
  if (status != cudaSuccess) {
    throw std::runtime_error(std::string("prism replay: ") + what + " failed: " + cudaGetErrorString(status));
  }
}

}  // namespace

const int64_t* device_iteration_start(int device) {
  std::lock_guard<std::mutex> lock(mu);
  auto& start = starts[device];
  if (start == nullptr) {
    int previous = 0;
    check(cudaGetDevice(&previous), "cudaGetDevice");
    check(cudaSetDevice(device), "cudaSetDevice");
    check(cudaMalloc(reinterpret_cast<void**>(&start), sizeof(int64_t)), "cudaMalloc");
    check(cudaMemset(start, 0, sizeof(int64_t)), "cudaMemset");
    check(cudaSetDevice(previous), "cudaSetDevice");
  }
  return start;
}

void stamp_device_iteration_start(int device, cudaStream_t stream) {
  auto* start = const_cast<int64_t*>(device_iteration_start(device));
  cuda_clock::enqueue_stamp(stream, start);
}

}  // namespace prism::replay
#endif
