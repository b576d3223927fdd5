// What the CUDA benches share: their start (no device: say so and exit 0)
// and their timer (wall time with the device synchronised around a run of
// reps, after warm-up runs).
#pragma once

#include "core/device/device.h"

#include <c10/core/Device.h>
#include <torch/cuda.h>

#include <chrono>
#include <cstdio>

namespace slipstream::bench {

// Whether there is a CUDA device; prints "<name>: no CUDA device" if not.
inline bool have_cuda(const char* name) {
  if (torch::cuda::is_available()) return true;
  std::printf("%s: no CUDA device\n", name);
  return false;
}

// The mean wall time of run() in ms over `reps` runs, after `warmup` runs.
template <typename Run>
double time_ms(const c10::Device& dev, int warmup, int reps, const Run& run) {
  for (int i = 0; i < warmup; ++i) run();
  synchronize_device(dev);
  const auto t0 = std::chrono::steady_clock::now();
  for (int r = 0; r < reps; ++r) run();
  synchronize_device(dev);
  return std::chrono::duration<double, std::milli>(std::chrono::steady_clock::now() - t0).count() /
         reps;
}

}  // namespace slipstream::bench
