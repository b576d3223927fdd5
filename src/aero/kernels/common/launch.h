// Host-side helpers shared by the kernel files (CUDA runtime only).
#pragma once

#include <cuda_runtime.h>

#include <stdexcept>
#include <string>

namespace slipstream::aero::kernels {

// Throws naming the kernel family and the launch when the last launch failed.
inline void check_launch(const char* family, const char* what) {
  const cudaError_t e = cudaGetLastError();
  if (e != cudaSuccess) {
    throw std::runtime_error(std::string(family) + ": " + what +
                             " failed to launch: " + cudaGetErrorString(e));
  }
}

// Throws naming the CUDA runtime call and its error when it failed.
inline void check_cuda(cudaError_t result, const char* call) {
  if (result != cudaSuccess) {
    throw std::runtime_error(std::string(call) + " failed: " + cudaGetErrorString(result));
  }
}

// Multiprocessors on the current device (at least 1).
inline int sm_count() {
  int device = 0, sms = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&sms, cudaDevAttrMultiProcessorCount, device),
             "cudaDeviceGetAttribute(cudaDevAttrMultiProcessorCount)");
  return sms > 0 ? sms : 1;
}

// True on a Hopper GPU (compute capability 9.0), whose sm_90a code has the
// warpgroup matrix products (wgmma).
inline bool hopper() {
  int device = 0, major = 0, minor = 0;
  check_cuda(cudaGetDevice(&device), "cudaGetDevice");
  check_cuda(cudaDeviceGetAttribute(&major, cudaDevAttrComputeCapabilityMajor, device),
             "cudaDeviceGetAttribute(cudaDevAttrComputeCapabilityMajor)");
  check_cuda(cudaDeviceGetAttribute(&minor, cudaDevAttrComputeCapabilityMinor, device),
             "cudaDeviceGetAttribute(cudaDevAttrComputeCapabilityMinor)");
  return major == 9 && minor == 0;
}

}  // namespace slipstream::aero::kernels
