#include "aero/ops/parameter_casts.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/util/Exception.h>

#include <algorithm>
#include <atomic>
#include <cstdlib>
#include <cstring>
#include <set>

#ifdef SLIPSTREAM_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "aero/kernels/cast_kernels.h"
#endif

namespace slipstream::aero {

namespace {
thread_local const ParameterCasts* current = nullptr;
std::atomic<bool> casts_once{true};
}  // namespace

bool ParameterCasts::enabled() { return casts_once.load(std::memory_order_relaxed); }

void ParameterCasts::set_enabled(bool once) { casts_once.store(once, std::memory_order_relaxed); }

ParameterCasts::ParameterCasts(const std::vector<at::Tensor>& params) {
#ifdef SLIPSTREAM_WITH_CUDA
  namespace ck = cast_kernels;
  std::vector<const at::Tensor*> kept;
  std::set<const void*> seen;
  int64_t total = 0;
  std::vector<int64_t> offsets;
  for (const auto& p : params) {
    if (!p.defined() || !p.is_cuda() || p.scalar_type() != at::kFloat || !p.is_contiguous() ||
        p.numel() == 0 || !seen.insert(p.unsafeGetTensorImpl()).second) {
      continue;
    }
    kept.push_back(&p);
    offsets.push_back(total);
    // Each cast 256-byte aligned, as a fresh allocation is: cuBLASLt's
    // choice of kernel depends on the operands' alignment (lt_matmul), and
    // less aligned weights get slower kernels.
    total += (p.numel() + 127) / 128 * 128;
  }
  if (kept.empty()) return;
  const c10::cuda::CUDAGuard guard(kept.front()->device());
  buffer_ = at::empty({total}, kept.front()->options().dtype(at::kBFloat16));
  std::vector<ck::Chunk> chunks;
  for (size_t i = 0; i < kept.size(); ++i) {
    const auto& p = *kept[i];
    auto cast = buffer_.narrow(0, offsets[i], p.numel()).view(p.sizes());
    const auto* src = p.data_ptr<float>();
    auto* dst = static_cast<char*>(cast.data_ptr());
    for (int64_t s = 0; s < p.numel(); s += ck::kChunkElements) {
      chunks.push_back({src + s, dst + 2 * s, std::min(ck::kChunkElements, p.numel() - s)});
    }
    const auto it = casts_.emplace(p.unsafeGetTensorImpl(), Entry{p, cast, p.data_ptr()}).first;
    by_data_.emplace(p.data_ptr(), &it->second);
  }
  chunk_count_ = static_cast<int64_t>(chunks.size());
  const auto bytes = static_cast<int64_t>(chunks.size() * sizeof(ck::Chunk));
  auto host = at::empty({bytes}, at::TensorOptions().dtype(at::kByte));
  std::memcpy(host.data_ptr(), chunks.data(), static_cast<size_t>(bytes));
  chunks_ = host.to(kept.front()->device());
#else
  (void)params;
#endif
}

void ParameterCasts::refresh() {
#ifdef SLIPSTREAM_WITH_CUDA
  if (chunk_count_ == 0) return;
  for (const auto& entry : casts_) {
    const Entry& e = entry.second;
    TORCH_CHECK(e.param.data_ptr() == e.data, "parameter casts: a parameter of shape ",
                e.param.sizes(),
                " was given new storage after the casts were set up (cast the model's "
                "parameters again)");
  }
  const c10::cuda::CUDAGuard guard(buffer_.device());
  cast_kernels::cast_chunks(static_cast<const cast_kernels::Chunk*>(chunks_.data_ptr()),
                            chunk_count_, at::cuda::getCurrentCUDAStream().stream());
#endif
}

ParameterCasts::Scope::Scope(const ParameterCasts* casts) : previous_(current) { current = casts; }

ParameterCasts::Scope::~Scope() { current = previous_; }

const at::Tensor* ParameterCasts::find(const at::Tensor& t) {
  if (current == nullptr || c10::GradMode::is_enabled() || !t.defined()) return nullptr;
  if (const auto it = current->casts_.find(t.unsafeGetTensorImpl()); it != current->casts_.end()) {
    ++current->hits_;
    return &it->second.cast;
  }
  // An alias: the parameter's memory, read as the parameter is.
  if (t.scalar_type() != at::kFloat || !t.is_contiguous()) return nullptr;
  const auto it = current->by_data_.find(t.data_ptr());
  if (it == current->by_data_.end() || t.sizes() != it->second->param.sizes()) return nullptr;
  ++current->hits_;
  return &it->second->cast;
}

}  // namespace slipstream::aero
