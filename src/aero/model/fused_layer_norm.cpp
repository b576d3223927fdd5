#include "aero/model/fused_layer_norm.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cstdint>

#include "aero/model/numerics.h"

#ifdef SLIPSTREAM_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "aero/model/kernels/layer_norm_kernels.h"
#endif

namespace slipstream::aero {
namespace {

#ifdef SLIPSTREAM_WITH_CUDA
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Contiguous bf16, 16-byte aligned (the kernels move rows in 16-byte pieces).
at::Tensor rows_of(const at::Tensor& t) {
  auto c = t.to(at::kBFloat16).contiguous();
  if (reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 != 0) c = c.clone();
  return c;
}

void* stream_of(const at::Tensor& t) {
  return at::cuda::getCurrentCUDAStream(t.get_device()).stream();
}

class LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& weight,
                            const at::Tensor& bias, double eps) {
    const c10::cuda::CUDAGuard guard(x_in.device());
    const auto x = rows_of(x_in);
    const int64_t width = x.size(-1), rows = x.numel() / width;
    const auto w = weight.detach().contiguous(), b = bias.detach().contiguous();
    auto y = at::empty_like(x);
    const auto stats = x.options().dtype(at::kFloat);
    auto mean = at::empty({rows}, stats), rstd = at::empty({rows}, stats);
    layer_norm_kernels::forward(x.data_ptr(), w.data_ptr<float>(), b.data_ptr<float>(), rows, width,
                                static_cast<float>(eps), y.data_ptr(), mean.data_ptr<float>(),
                                rstd.data_ptr<float>(), stream_of(x));
    ctx->save_for_backward({x, w, mean, rstd});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1], &mean = saved[2], &rstd = saved[3];
    const c10::cuda::CUDAGuard guard(x.device());
    const auto gy = rows_of(grads[0]);
    const int64_t width = x.size(-1), rows = x.numel() / width;
    auto gx = at::empty_like(x);
    auto gw = at::zeros_like(w), gb = at::zeros_like(w);
    layer_norm_kernels::backward(gy.data_ptr(), x.data_ptr(), mean.data_ptr<float>(),
                                 rstd.data_ptr<float>(), w.data_ptr<float>(), rows, width,
                                 gx.data_ptr(), gw.data_ptr<float>(), gb.data_ptr<float>(),
                                 stream_of(x));
    return {gx, gw, gb, at::Tensor()};
  }
};
#endif

}  // namespace

bool layer_norm_kernels_apply(const at::Tensor& x, const at::Tensor& weight,
                              const at::Tensor& bias) {
#ifdef SLIPSTREAM_WITH_CUDA
  return x.is_cuda() && x.scalar_type() == at::kBFloat16 && x.dim() >= 1 &&
         layer_norm_kernels::supported(x.size(-1)) && weight.defined() && bias.defined() &&
         weight.scalar_type() == at::kFloat && bias.scalar_type() == at::kFloat &&
         weight.numel() == x.size(-1) && bias.numel() == x.size(-1) && weight.is_cuda();
#else
  (void)x;
  (void)weight;
  (void)bias;
  return false;
#endif
}

at::Tensor fused_layer_norm(const at::Tensor& x, at::IntArrayRef shape, const at::Tensor& weight,
                            const at::Tensor& bias, double eps) {
#ifdef SLIPSTREAM_WITH_CUDA
  if (shape.size() == 1 && shape[0] == x.size(-1) && layer_norm_kernels_apply(x, weight, bias)) {
    return LayerNormFunction::apply(x, weight, bias, eps);
  }
#endif
  return layer_norm_in_autocast_dtype(x, shape, weight, bias, eps);
}

}  // namespace slipstream::aero
