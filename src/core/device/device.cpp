#include "core/device/device.h"

#include <ATen/ATen.h>
#include <c10/util/Exception.h>
#include <sys/resource.h>
#include <torch/cuda.h>

#include <unistd.h>
#include <cstdlib>
#include <cstring>
#include <fstream>
#include <string>

#include "core/process/host_memory.h"

#ifdef SLIPSTREAM_WITH_CUDA
#include <ATen/autocast_mode.h>
#include <ATen/cuda/CUDAContext.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#include <c10/cuda/CUDACachingAllocator.h>
#include <c10/cuda/CUDAFunctions.h>
#endif

namespace slipstream {

bool cuda_available() { return torch::cuda::is_available(); }

c10::Device resolve_device(const std::string& name, int local_rank) {
  if (name == "cpu") return c10::Device(c10::kCPU);
  if (name == "cuda" || name == "auto") {
    if (cuda_available()) {
      const int count = static_cast<int>(torch::cuda::device_count());
      // A scheduler that binds one GPU to each task (SLURM's --gpus-per-task=1)
      // shows every local rank its GPU as device 0.
      const char* visible = std::getenv("CUDA_VISIBLE_DEVICES");
      const bool bound = count == 1 && visible != nullptr && std::strchr(visible, ',') == nullptr;
      if (bound) return c10::Device(c10::kCUDA, 0);
      TORCH_CHECK(local_rank < count, "device: local rank ", local_rank, " but only ", count,
                  " CUDA devices are visible (CUDA_VISIBLE_DEVICES=",
                  visible == nullptr ? "unset" : visible,
                  "); start at most one rank per GPU on each node");
      return c10::Device(c10::kCUDA, static_cast<c10::DeviceIndex>(local_rank));
    }
    TORCH_CHECK(name == "auto", "device: 'cuda' was asked for, but no CUDA device is available");
    return c10::Device(c10::kCPU);
  }
  TORCH_CHECK(false, "device: '", name, "' is not one of auto, cpu, cuda");
}

namespace {
// StatType::AGGREGATE is index 0 in every LibTorch version; the enum's
// namespace moved between versions, so it is not named here.
[[maybe_unused]] constexpr size_t kAggregate = 0;

double rss_bytes() {
  std::ifstream statm("/proc/self/statm");
  long pages = 0, resident = 0;
  statm >> pages >> resident;
  return static_cast<double>(resident) * static_cast<double>(sysconf(_SC_PAGESIZE));
}
}  // namespace

constexpr double kGiB = 1024.0 * 1024.0 * 1024.0;

double memory_reserved_gib(c10::Device device) {
#ifdef SLIPSTREAM_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return static_cast<double>(stats.reserved_bytes[kAggregate].current) / kGiB;
  }
#endif
  return rss_bytes() / kGiB;
}

double memory_capacity_bytes(c10::Device device) {
#ifdef SLIPSTREAM_WITH_CUDA
  if (device.is_cuda()) {
    const int index = device.has_index() ? device.index() : c10::cuda::current_device();
    return static_cast<double>(at::cuda::getDeviceProperties(index)->totalGlobalMem);
  }
#endif
  return static_cast<double>(available_host_memory());
}

double memory_allocated_gib(c10::Device device) {
#ifdef SLIPSTREAM_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return static_cast<double>(stats.allocated_bytes[kAggregate].current) / kGiB;
  }
#endif
  (void)device;
  return 0.0;
}

double peak_memory_gib(c10::Device device) {
#ifdef SLIPSTREAM_WITH_CUDA
  if (device.is_cuda()) {
    const auto stats = c10::cuda::CUDACachingAllocator::getDeviceStats(device.index());
    return static_cast<double>(stats.allocated_bytes[kAggregate].peak) / kGiB;
  }
#endif
  rusage usage{};
  getrusage(RUSAGE_SELF, &usage);
  return static_cast<double>(usage.ru_maxrss) * 1024.0 / kGiB;
}

void reset_peak_memory(c10::Device device) {
#ifdef SLIPSTREAM_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::resetPeakStats(device.index());
#endif
}

void empty_device_cache(c10::Device device) {
#ifdef SLIPSTREAM_WITH_CUDA
  if (device.is_cuda()) c10::cuda::CUDACachingAllocator::emptyCache();
#endif
}

void synchronize_device(c10::Device device) {
#ifdef SLIPSTREAM_WITH_CUDA
  if (device.is_cuda()) c10::cuda::device_synchronize();
#endif
}

AutocastGuard::AutocastGuard(c10::Device device, bool enabled) {
#ifdef SLIPSTREAM_WITH_CUDA
  if (enabled && device.is_cuda()) {
    previous_enabled_ = at::autocast::is_autocast_enabled(at::kCUDA);
    at::autocast::set_autocast_enabled(at::kCUDA, true);
    at::autocast::set_autocast_dtype(at::kCUDA, at::kBFloat16);
    at::autocast::increment_nesting();
    active_ = true;
  }
#endif
}

AutocastGuard::~AutocastGuard() {
#ifdef SLIPSTREAM_WITH_CUDA
  if (active_) {
    if (at::autocast::decrement_nesting() == 0) at::autocast::clear_cache();
    at::autocast::set_autocast_enabled(at::kCUDA, previous_enabled_);
  }
#endif
}

bool set_sync_debug_mode(int mode) {
#ifdef SLIPSTREAM_WITH_CUDA
  c10::cuda::warning_state().set_sync_debug_mode(static_cast<c10::cuda::SyncDebugMode>(mode));
  return true;
#else
  return mode == 0;
#endif
}

int get_sync_debug_mode() {
#ifdef SLIPSTREAM_WITH_CUDA
  return static_cast<int>(c10::cuda::warning_state().get_sync_debug_mode());
#else
  return 0;
#endif
}

}  // namespace slipstream
