// Device time per kernel over a stretch of work, through LibTorch's Kineto
// profiler: where a training step's GPU time goes. Used by
// `slipstream bench --profile`.
#pragma once

#include <cstdint>
#include <functional>
#include <string>
#include <vector>

namespace slipstream {

struct KernelTime {
  std::string name;
  int64_t calls = 0;
  double total_us = 0.0;
};

// Runs `work` under the profiler (CPU and CUDA activity), writes its Chrome
// trace to `trace_path`, and returns the GPU kernels, memcpys and memsets in
// it summed by name, longest first.
std::vector<KernelTime> profile_kernels(const std::function<void()>& work,
                                        const std::string& trace_path);

// The same sums from a Chrome trace file ("traceEvents" with "cat" kernel,
// gpu_memcpy or gpu_memset and "dur" in microseconds).
std::vector<KernelTime> kernel_times_from_trace(const std::string& trace_path);

}  // namespace slipstream
