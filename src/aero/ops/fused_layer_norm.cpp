#include "aero/ops/fused_layer_norm.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <cstdint>

#include "aero/ops/linear.h"
#include "aero/ops/numerics.h"
#include "aero/ops/parameter_casts.h"
#include "aero/ops/zero_parts.h"

#ifdef SLIPSTREAM_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "aero/kernels/layer_norm_kernels.h"
#endif

namespace slipstream::aero {
namespace {

#ifdef SLIPSTREAM_WITH_CUDA
using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// Contiguous bf16, 16-byte aligned (the kernels move rows in 16-byte pieces).
at::Tensor rows_of(const at::Tensor& t) {
  if (const auto* cast = ParameterCasts::find(t)) return *cast;  // a parameter, cast this step
  auto c = t.to(at::kBFloat16).contiguous();
  if (reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 != 0) c = c.clone();
  return c;
}

void* stream_of(const at::Tensor& t) {
  return at::cuda::getCurrentCUDAStream(t.get_device()).stream();
}

// The LayerNorm's forward; its mean and 1/std per row go to `mean`, `rstd`.
at::Tensor layer_norm_forward(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                              double eps, at::Tensor& mean, at::Tensor& rstd) {
  const int64_t width = x.size(-1), rows = x.numel() / width;
  auto y = at::empty_like(x);
  const auto stats = x.options().dtype(at::kFloat);
  mean = at::empty({rows}, stats);
  rstd = at::empty({rows}, stats);
  layer_norm_kernels::forward(x.data_ptr(), w.data_ptr<float>(), b.data_ptr<float>(), rows, width,
                              static_cast<float>(eps), y.data_ptr(), mean.data_ptr<float>(),
                              rstd.data_ptr<float>(), stream_of(x));
  return y;
}

// {gx, gweight, gbias, none} from saved {x, w, mean, rstd} (eps's gradient none).
variable_list layer_norm_backward(const variable_list& saved, const at::Tensor& gy,
                                  const at::Tensor& gres) {
  auto g = layer_norm_kernels_backward(saved[0], saved[1], saved[2], saved[3], gy, gres);
  return {g.x, g.weight, g.bias, at::Tensor()};
}

class LayerNormFunction : public torch::autograd::Function<LayerNormFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& weight,
                            const at::Tensor& bias, double eps) {
    const c10::cuda::CUDAGuard guard(x_in.device());
    const auto x = rows_of(x_in);
    const auto w = weight.detach().contiguous(), b = bias.detach().contiguous();
    at::Tensor mean, rstd;
    auto y = layer_norm_forward(x, w, b, eps, mean, rstd);
    ctx->save_for_backward({x, w, mean, rstd});
    return y;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return layer_norm_backward(ctx->get_saved_variables(), grads[0], at::Tensor());
  }
};

// {LayerNorm(x), x}: the second output is x itself (autograd makes it a view
// of x that leads back here), so the residual path's gradient and the
// LayerNorm's meet in this backward, in one kernel.
class LayerNormResidualFunction : public torch::autograd::Function<LayerNormResidualFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x_in,
                               const at::Tensor& weight, const at::Tensor& bias, double eps) {
    const c10::cuda::CUDAGuard guard(x_in.device());
    ctx->set_materialize_grads(false);
    const auto x = rows_of(x_in);
    const auto w = weight.detach().contiguous(), b = bias.detach().contiguous();
    at::Tensor mean, rstd;
    auto y = layer_norm_forward(x, w, b, eps, mean, rstd);
    ctx->save_for_backward({x, w, mean, rstd});
    return {y, x_in};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    return layer_norm_backward(ctx->get_saved_variables(), grads[0], grads[1]);
  }
};
#endif

}  // namespace

#ifdef SLIPSTREAM_WITH_CUDA
at::Tensor layer_norm_kernels_input(const at::Tensor& x) { return rows_of(x); }

LayerNormGradients layer_norm_kernels_backward(const at::Tensor& x, const at::Tensor& w,
                                               const at::Tensor& mean, const at::Tensor& rstd,
                                               const at::Tensor& gy_in, const at::Tensor& gres_in) {
  const c10::cuda::CUDAGuard guard(x.device());
  const int64_t width = x.size(-1), rows = x.numel() / width;
  // The kernel adds into gw, gb and the column sums of gx: one fill for the three.
  auto acc = zero_parts(w, {{width}, {width}, {width}});
  auto &gw = acc[0], &gb = acc[1], &sums = acc[2];
  if (!gy_in.defined()) return {gres_in, gw, gb};
  const auto gy = rows_of(gy_in);
  const auto gres = gres_in.defined() ? rows_of(gres_in) : at::Tensor();
  auto gx = at::empty_like(x);
  layer_norm_kernels::backward(
      gy.data_ptr(), x.data_ptr(), mean.data_ptr<float>(), rstd.data_ptr<float>(),
      w.data_ptr<float>(), gres.defined() ? gres.data_ptr() : nullptr, rows, width, gx.data_ptr(),
      gw.data_ptr<float>(), gb.data_ptr<float>(), sums.data_ptr<float>(), stream_of(x));
  offer_column_sums(gx, sums);
  return {gx, gw, gb};
}
#else
at::Tensor layer_norm_kernels_input(const at::Tensor&) {
  TORCH_CHECK(false, "layer_norm_kernels_input: a build without CUDA has no LayerNorm kernels");
  return {};
}

LayerNormGradients layer_norm_kernels_backward(const at::Tensor&, const at::Tensor&,
                                               const at::Tensor&, const at::Tensor&,
                                               const at::Tensor&, const at::Tensor&) {
  TORCH_CHECK(false, "layer_norm_kernels_backward: a build without CUDA has no LayerNorm kernels");
  return {};
}
#endif

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

std::pair<at::Tensor, at::Tensor> fused_layer_norm_residual(const at::Tensor& x,
                                                            at::IntArrayRef shape,
                                                            const at::Tensor& weight,
                                                            const at::Tensor& bias, double eps) {
#ifdef SLIPSTREAM_WITH_CUDA
  if (shape.size() == 1 && shape[0] == x.size(-1) && layer_norm_kernels_apply(x, weight, bias)) {
    auto out = LayerNormResidualFunction::apply(x, weight, bias, eps);
    return {out[0], out[1]};
  }
#endif
  return {layer_norm_in_autocast_dtype(x, shape, weight, bias, eps), x};
}

}  // namespace slipstream::aero
