// The iteration start on each GPU's global timer, for the device wait-until kernels (CUDA builds).
//
// mark_iteration_start stamps it on the current stream, so it marks when the *device* reaches the
// start of the iteration; the backend's wait kernels read it there, and the host never needs to
// know when the GPU got anywhere. Before the first stamp it reads 0.
#pragma once

#ifdef PRISM_WITH_CUDA
#include <cuda_runtime_api.h>

#include <cstdint>

namespace prism::replay {

// Device pointer to the iteration start of `device` (allocated and zeroed on first use).
const int64_t* device_iteration_start(int device);

// Enqueue on `stream` of `device` a kernel that writes the GPU timer to that device's iteration start.
void stamp_device_iteration_start(int device, cudaStream_t stream);

}  // namespace prism::replay
#endif
