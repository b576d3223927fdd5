// ParameterCasts: a model's fp32 CUDA parameters cast to bf16 once a step,
// all in one kernel launch, for the fused paths that read them in bf16 and
// would otherwise cast each one at each use (in the GeoTransolver volume
// config the profile counted 464 small cast kernels a step, 266 with this,
// each a launch and a gap in the graph). refresh() recasts them into one
// buffer; while a Scope is alive on this thread, find(t) gives the cast of
// a registered parameter, only with grad mode off (inside a custom
// autograd function's forward, or no-grad code), where the cast is not
// part of an autograd graph: a differentiable use must still go through
// t.to(), or the parameter would get no gradient. The casts are the ones
// t.to(at::kBFloat16) makes, bit for bit.
//
// The trainer refreshes at the start of each training forward (inside the
// CUDA graph when the step is graphed) and keeps the Scope over the
// forward only, so nothing reads a cast after the optimizer has moved the
// parameters. Where CUDA is not built in, nothing is cached.
#pragma once

#include <ATen/core/Tensor.h>

#include <unordered_map>
#include <vector>

namespace slipstream::aero {

class ParameterCasts {
 public:
  // Whether the trainer casts once a step (numerics.parameter_casts: once,
  // the default); false (per_use) casts each parameter at each use (for A/B
  // runs).
  static bool enabled();
  static void set_enabled(bool once);

  // The fp32 contiguous CUDA tensors of `params` (others are left alone).
  explicit ParameterCasts(const std::vector<at::Tensor>& params);
  ParameterCasts(const ParameterCasts&) = delete;
  ParameterCasts& operator=(const ParameterCasts&) = delete;

  // Recasts every registered parameter, one launch on the current stream.
  // Throws, giving its shape, when a parameter's storage was replaced since.
  void refresh();
  size_t size() const { return casts_.size(); }
  // How many times find() has given one of these casts (for tests).
  int64_t hits() const { return hits_; }

  // Makes `casts` (may be null) what find() looks in on this thread.
  class Scope {
   public:
    explicit Scope(const ParameterCasts* casts);
    ~Scope();
    Scope(const Scope&) = delete;
    Scope& operator=(const Scope&) = delete;

   private:
    const ParameterCasts* previous_;
  };

  // The bf16 cast of `t` (contiguous, 256-byte aligned) if t is a parameter
  // of the Scope's casts, or an alias of one (same data, sizes and dtype:
  // a detach(), as the fused slice mix takes of its leaves), and grad mode
  // is off; else null.
  static const at::Tensor* find(const at::Tensor& t);

 private:
  struct Entry {
    at::Tensor param, cast;
    const void* data;
  };
  std::unordered_map<const void*, Entry> casts_;           // by TensorImpl
  std::unordered_map<const void*, const Entry*> by_data_;  // by data pointer
  at::Tensor buffer_, chunks_;
  [[maybe_unused]] int64_t chunk_count_ = 0;  // read on CUDA builds only
  mutable int64_t hits_ = 0;
};

}  // namespace slipstream::aero
