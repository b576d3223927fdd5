#include "aero/ops/numerics.h"

#include "aero/ops/parameter_casts.h"

#include <ATen/ATen.h>
#include <torch/version.h>

#include <cmath>

#ifdef SLIPSTREAM_WITH_CUDA
#include <ATen/autocast_mode.h>
#include <c10/core/impl/LocalDispatchKeySet.h>
#endif

namespace slipstream::aero {

at::Tensor autocast_input(const at::Tensor& x) {
#ifdef SLIPSTREAM_WITH_CUDA
  if (x.is_cuda() && at::autocast::is_autocast_enabled(at::kCUDA) && x.is_floating_point()) {
    const auto dtype = at::autocast::get_autocast_dtype(at::kCUDA);
    if (x.scalar_type() != dtype) {
      if (dtype == at::kBFloat16) {
        if (const auto* cast = ParameterCasts::find(x)) return *cast;
      }
      return x.to(dtype);
    }
  }
#endif
  return x;
}

at::Tensor layer_norm_in_autocast_dtype(const at::Tensor& x, at::IntArrayRef shape,
                                        const at::Tensor& weight, const at::Tensor& bias,
                                        double eps) {
#ifdef SLIPSTREAM_WITH_CUDA
  if (x.is_cuda() && at::autocast::is_autocast_enabled(at::kCUDA)) {
    const auto dtype = at::autocast::get_autocast_dtype(at::kCUDA);
    if (x.scalar_type() == dtype) {
      // Autocast would run this op in fp32; step past its dispatch key.
      const c10::impl::ExcludeDispatchKeyGuard no_autocast(c10::DispatchKey::AutocastCUDA);
      return at::layer_norm(x, shape, weight.defined() ? weight.to(dtype) : weight,
                            bias.defined() ? bias.to(dtype) : bias, eps);
    }
  }
#endif
  return at::layer_norm(x, shape, weight, bias, eps);
}

at::Tensor dot_product_attention(const at::Tensor& q, const at::Tensor& k, const at::Tensor& v) {
#if TORCH_VERSION_MAJOR >= 2
  return at::scaled_dot_product_attention(q, k, v);
#else
  const double scale = 1.0 / std::sqrt(static_cast<double>(q.size(-1)));
  auto attn = at::softmax(at::matmul(q, k.transpose(-2, -1)) * scale, -1);
  return at::matmul(attn, v);
#endif
}

}  // namespace slipstream::aero
