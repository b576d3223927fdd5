// Device helpers for the recipe: which device to run on, memory figures,
// bf16 autocast, and the CUDA sync-debug switch. Everything compiles on a
// CPU-only LibTorch; the CUDA parts are built when Torch has CUDA.
#pragma once

#include <ATen/core/Tensor.h>
#include <c10/core/Device.h>

#include <string>

namespace slipstream::aero {

bool cuda_available();
// "auto" (CUDA if present, else CPU), "cpu", "cuda"; CUDA uses `local_rank`.
c10::Device resolve_device(const std::string& name, int local_rank);

// Memory in use now (CUDA: allocated by the caching allocator; CPU: the
// process's resident set), in GB (1e9 bytes). Never syncs.
double memory_in_use_gb(c10::Device device);
// Peak since the last reset (CUDA: allocated; CPU: the process's max RSS),
// in GiB.
double peak_memory_gib(c10::Device device);
void reset_peak_memory(c10::Device device);
// Waits for all work on the device (CUDA) — only at the ends of epochs.
void synchronize_device(c10::Device device);

// bf16 autocast on CUDA while alive; a no-op elsewhere or when disabled.
class AutocastGuard {
 public:
  AutocastGuard(c10::Device device, bool enabled);
  ~AutocastGuard();
  AutocastGuard(const AutocastGuard&) = delete;
  AutocastGuard& operator=(const AutocastGuard&) = delete;

 private:
  bool active_ = false;
  bool previous_enabled_ = false;
};

// `x` cast to the autocast dtype when CUDA autocast is on and x is a
// floating CUDA tensor of another dtype; else x itself. For a tensor that
// several autocast layers read: one cast (and, backward, one cast of the
// summed gradient) instead of one per layer.
at::Tensor autocast_input(const at::Tensor& x);

// LayerNorm over the last dims (`shape`) that stays in the autocast dtype:
// under CUDA autocast, for an x already in that dtype (bf16), runs the
// layer norm on x as it is, with weight and bias rounded to that dtype (the
// kernel keeps its mean and variance in fp32), and returns bf16. Autocast's
// own policy would cast x to fp32, normalise in fp32, return fp32, and the
// next layer would cast back: three passes over the activations each way
// where this makes one. Elsewhere (CPU, no autocast, x of another dtype)
// it is at::layer_norm under the usual rules.
at::Tensor layer_norm_in_autocast_dtype(const at::Tensor& x, at::IntArrayRef shape,
                                        const at::Tensor& weight, const at::Tensor& bias,
                                        double eps);

// CUDA sync debugging: 0 off, 1 warn, 2 error. Returns false where CUDA is
// not built in.
bool set_sync_debug_mode(int mode);
int get_sync_debug_mode();

}  // namespace slipstream::aero
