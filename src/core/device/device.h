// Device runtime helpers: which device to run on, memory figures, bf16
// autocast, and the CUDA sync-debug switch. Everything compiles on a
// CPU-only LibTorch; the CUDA parts are built when Torch has CUDA
// (SLIPSTREAM_WITH_CUDA). Nothing here knows of a model or of CFD.
#pragma once

#include <c10/core/Device.h>

#include <string>

namespace slipstream {

bool cuda_available();
// "auto" (CUDA if present, else CPU), "cpu", "cuda"; CUDA uses `local_rank`.
c10::Device resolve_device(const std::string& name, int local_rank);

// Memory held now, in GiB (2^30 bytes): on CUDA the caching allocator's
// reserved bytes (what torch.cuda.memory_reserved() reports), on CPU the
// process's resident set. Never syncs.
double memory_reserved_gib(c10::Device device);
// Bytes in live tensors now (CUDA: the caching allocator's allocated bytes,
// torch.cuda.memory_allocated(); CPU: 0, not tracked), in GiB.
double memory_allocated_gib(c10::Device device);
// Peak since the last reset (CUDA: allocated; CPU: the process's max RSS),
// in GiB.
double peak_memory_gib(c10::Device device);
void reset_peak_memory(c10::Device device);
// What the device can hold, in bytes: a GPU's total memory; on the CPU
// the memory the host still has available (/proc/meminfo's MemAvailable).
// 0 where it cannot be read.
double memory_capacity_bytes(c10::Device device);
// Returns the caching allocator's unused blocks to the driver (CUDA), e.g.
// after an out-of-memory error before retrying smaller.
void empty_device_cache(c10::Device device);
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
  // Used only where CUDA is built in.
  [[maybe_unused]] bool active_ = false;
  [[maybe_unused]] bool previous_enabled_ = false;
};

// CUDA sync debugging: 0 off, 1 warn, 2 error. Returns false where CUDA is
// not built in.
bool set_sync_debug_mode(int mode);
int get_sync_debug_mode();

}  // namespace slipstream
