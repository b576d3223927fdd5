#include "aero/ops/slice_ops.h"

#include <ATen/ATen.h>

#include <cstdint>
#include <utility>

#include "aero/kernels/slice/slice_kernels.h"
#include "aero/ops/lt_matmul.h"
#include "aero/ops/parameter_casts.h"
#include "aero/ops/zero_parts.h"

#ifdef SLIPSTREAM_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>
#endif

namespace slipstream::aero::slice_ops {
namespace {

// ---- the ATen decomposition (CPU, and CUDA outside the kernels' reach) ----

at::ScalarType math_type(const at::Tensor& x) {
  return at::promote_types(x.scalar_type(), at::kFloat);
}

// z = (x ws^T + bias) / tau: (B, N, H, G).
at::Tensor slice_logits(const Weights& in) {
  const auto t = math_type(in.x);
  auto logits = at::matmul(in.x.to(t), in.ws.to(t).t()) + in.bias.to(t);
  return logits / in.tau.to(t).view({1, 1, -1, 1});
}

// w from z and lse (B, H, N).
at::Tensor weights_from(const at::Tensor& z, const at::Tensor& lse) {
  return at::exp(z - lse.to(z.scalar_type()).permute({0, 2, 1}).unsqueeze(-1));
}

at::Tensor sums_over_points(const at::Tensor& w, const at::Tensor& y) {
  return at::einsum("bnhg,bnhd->bhgd", {w, y.to(w.scalar_type())});
}

// ---- the CUDA kernels ----

#ifdef SLIPSTREAM_WITH_CUDA
at::Tensor bf16(const at::Tensor& t) {
  if (const auto* cast = ParameterCasts::find(t)) return *cast;  // a parameter, cast this step
  auto c = t.to(at::kBFloat16).contiguous();
  // The kernels read rows in 16-byte pieces.
  if (reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 != 0) c = c.clone();
  return c;
}

at::Tensor f32(const at::Tensor& t) { return t.to(at::kFloat).contiguous(); }

struct KernelInputs {
  at::Tensor x, ws, bias, tau;
  slice_kernels::Problem problem;
};

KernelInputs kernel_inputs(const Weights& in, const at::Tensor& lse) {
  KernelInputs k{bf16(in.x), bf16(in.ws), f32(in.bias), f32(in.tau), {}};
  auto& p = k.problem;
  p.batch = in.x.size(0);
  p.points = in.x.size(1);
  p.heads = in.x.size(2);
  p.dim = in.x.size(3);
  p.slices = in.ws.size(0);
  p.x = k.x.data_ptr();
  p.ws = k.ws.data_ptr();
  p.bias = k.bias.data_ptr<float>();
  p.tau = k.tau.data_ptr<float>();
  p.lse = lse.data_ptr<float>();
  p.stream = at::cuda::getCurrentCUDAStream(in.x.get_device()).stream();
  return k;
}

at::Tensor zeros_f32(const at::Tensor& like, at::IntArrayRef sizes) {
  return at::zeros(sizes, like.options().dtype(at::kFloat));
}
#endif

void check_shapes(const Weights& in) {
  TORCH_CHECK(in.x.dim() == 4, "slice ops: x_mid must be (B, N, H, D), got ", in.x.sizes());
  TORCH_CHECK(in.ws.dim() == 2 && in.ws.size(1) == in.x.size(3), "slice ops: slice weight ",
              in.ws.sizes(), " does not match head size ", in.x.size(3));
  TORCH_CHECK(in.tau.numel() == in.x.size(2), "slice ops: ", in.tau.numel(), " temperatures for ",
              in.x.size(2), " heads");
}

}  // namespace

bool kernels_apply(const at::Tensor& x, int64_t slices) {
#ifdef SLIPSTREAM_WITH_CUDA
  return x.is_cuda() && x.scalar_type() == at::kBFloat16 && x.dim() == 4 &&
         slice_kernels::supported(x.size(3), slices);
#else
  (void)x;
  (void)slices;
  return false;
#endif
}

bool kernels_apply(c10::Device device, c10::ScalarType dtype, int64_t dim, int64_t slices) {
#ifdef SLIPSTREAM_WITH_CUDA
  return device.is_cuda() && dtype == at::kBFloat16 && slice_kernels::supported(dim, slices);
#else
  (void)device, (void)dtype, (void)dim, (void)slices;
  return false;
#endif
}

int64_t kernel_dim(int64_t dim) {
  for (int64_t d : {16, 32, 56, 64}) {
    if (dim <= d) return d;
  }
  return dim;
}

FirstReduce reduce_first(const Weights& in, const at::Tensor& y) {
  check_shapes(in);
#ifdef SLIPSTREAM_WITH_CUDA
  if (kernels_apply(in.x, in.ws.size(0))) {
    const c10::cuda::CUDAGuard guard(in.x.device());
    const int64_t b = in.x.size(0), n = in.x.size(1), h = in.x.size(2), d = in.x.size(3),
                  g = in.ws.size(0);
    auto acc = zero_parts(in.x, {{b, h, g, d}, {b, h, g}});
    FirstReduce r{acc[0], acc[1], at::empty({b, h, n}, in.x.options().dtype(at::kFloat))};
    auto k = kernel_inputs(in, r.lse);
    const auto yb = bf16(y);
    slice_kernels::reduce(k.problem, yb.data_ptr(), r.sums.data_ptr<float>(),
                          r.colsum.data_ptr<float>(), /*compute_lse=*/true);
    return r;
  }
#endif
  const auto z = slice_logits(in);
  const auto lse = at::logsumexp(z, -1).permute({0, 2, 1}).contiguous();
  const auto w = weights_from(z, lse);
  return {sums_over_points(w, y), w.sum(1), lse};
}

at::Tensor reduce(const Weights& in, const at::Tensor& lse, const at::Tensor& y) {
  check_shapes(in);
#ifdef SLIPSTREAM_WITH_CUDA
  if (kernels_apply(in.x, in.ws.size(0))) {
    const c10::cuda::CUDAGuard guard(in.x.device());
    auto sums = zeros_f32(in.x, {in.x.size(0), in.x.size(2), in.ws.size(0), in.x.size(3)});
    auto k = kernel_inputs(in, lse);
    const auto yb = bf16(y);
    slice_kernels::reduce(k.problem, yb.data_ptr(), sums.data_ptr<float>(), nullptr, false);
    return sums;
  }
#endif
  return sums_over_points(weights_from(slice_logits(in), lse), y);
}

at::Tensor expand(const Weights& in, const at::Tensor& lse, const at::Tensor& z) {
  check_shapes(in);
#ifdef SLIPSTREAM_WITH_CUDA
  if (kernels_apply(in.x, in.ws.size(0))) {
    const c10::cuda::CUDAGuard guard(in.x.device());
    auto out = at::empty(in.x.sizes(), in.x.options().dtype(at::kBFloat16));
    auto k = kernel_inputs(in, lse);
    const auto zb = bf16(z);
    slice_kernels::expand(k.problem, zb.data_ptr(), out.data_ptr());
    return out;
  }
#endif
  const auto w = weights_from(slice_logits(in), lse);
  return at::einsum("bnhg,bhgd->bnhd", {w, z.to(w.scalar_type())}).to(in.x.scalar_type());
}

BackwardResult backward(const Weights& in, const at::Tensor& lse, const at::Tensor& fx,
                        const at::Tensor& gout, const at::Tensor& os, const at::Tensor& gs,
                        const at::Tensor& gnorm) {
  check_shapes(in);
  TORCH_CHECK(gout.defined() == os.defined(),
              "slice ops: backward takes gout and os both or neither");
#ifdef SLIPSTREAM_WITH_CUDA
  if (kernels_apply(in.x, in.ws.size(0))) {
    const c10::cuda::CUDAGuard guard(in.x.device());
    const int64_t g = in.ws.size(0), d = in.x.size(3), h = in.x.size(2);
    auto k = kernel_inputs(in, lse);
    // Where the row kernel writes dL/dlogits (slice_kernels.h), grad_ws
    // and grad_bias are made from them below, not by a kernel of their own.
    const bool from_dlogits = slice_kernels::writes_dlogits(k.problem);
    // The kernels add into grad_ws, grad_bias and tau_acc: one fill for them.
    auto acc = from_dlogits ? zero_parts(in.x, {{h}}) : zero_parts(in.x, {{h}, {g, d}, {g}});
    BackwardResult r{at::empty(in.x.sizes(), in.x.options()),
                     at::empty(in.x.sizes(), in.x.options()), from_dlogits ? at::Tensor() : acc[1],
                     from_dlogits ? at::Tensor() : acc[2], acc[0]};
    const auto bf16_opts = in.x.options().dtype(at::kBFloat16);
    const auto dlogits =
        from_dlogits ? at::empty({in.x.size(0), in.x.size(1), h, g}, bf16_opts) : at::Tensor();
    const auto x_ext =
        from_dlogits ? at::empty({in.x.size(0), in.x.size(1), h, d + 8}, bf16_opts) : at::Tensor();
    const bool deslice = gout.defined();
    const auto fxb = bf16(fx), gsb = bf16(gs);
    const auto gob = deslice ? bf16(gout) : at::Tensor(), osb = deslice ? bf16(os) : at::Tensor();
    const auto gn = f32(gnorm);
    auto dot = at::empty({in.x.size(0), h, in.x.size(1)}, in.x.options().dtype(at::kFloat));
    slice_kernels::backward(k.problem, fxb.data_ptr(), deslice ? gob.data_ptr() : nullptr,
                            deslice ? osb.data_ptr() : nullptr, gsb.data_ptr(),
                            gn.data_ptr<float>(), r.grad_x.data_ptr(), r.grad_fx.data_ptr(),
                            from_dlogits ? nullptr : r.grad_ws.data_ptr<float>(),
                            from_dlogits ? nullptr : r.grad_bias.data_ptr<float>(),
                            r.tau_acc.data_ptr<float>(), dot.data_ptr<float>(),
                            from_dlogits ? dlogits.data_ptr() : nullptr,
                            from_dlogits ? x_ext.data_ptr() : nullptr);
    if (from_dlogits) {
      // ws is shared by the heads: the sums run over every (b, n, h) row;
      // x_ext's column of ones gives grad_bias in the same GEMM.
      const auto rows = dlogits.view({-1, g}), xs = x_ext.view({-1, d + 8});
      at::Tensor both;
      if (!lt_matmul::mm(rows.t(), xs, {}, {}, both, at::kFloat)) {
        both = rows.t().mm(xs).to(at::kFloat);
      }
      auto grads = weight_grads_from_product(both, d);
      r.grad_ws = std::move(grads.grad_ws);
      r.grad_bias = std::move(grads.grad_bias);
    }
    return r;
  }
#endif
  const auto z = slice_logits(in);
  const auto t = z.scalar_type();
  const auto w = weights_from(z, lse);
  const auto gs_t = gs.to(t);
  // dL/dw = gout os^T + fx gs^T + gnorm
  auto dw = at::einsum("bnhd,bhgd->bnhg", {fx.to(t), gs_t}) + gnorm.to(t).unsqueeze(1);
  if (gout.defined()) dw = dw + at::einsum("bnhd,bhgd->bnhg", {gout.to(t), os.to(t)});
  const auto gz = w * (dw - (w * dw).sum(-1, /*keepdim=*/true));
  const auto gl = gz / in.tau.to(t).view({1, 1, -1, 1});
  BackwardResult r;
  r.grad_fx = at::einsum("bnhg,bhgd->bnhd", {w, gs_t}).to(in.x.scalar_type());
  r.grad_x = at::matmul(gl, in.ws.to(t)).to(in.x.scalar_type());
  r.grad_ws = at::einsum("bnhg,bnhd->gd", {gl, in.x.to(t)});
  r.grad_bias = gl.sum({0, 1, 2});
  r.tau_acc = (gz * z).sum({0, 1, 3});
  return r;
}

WeightGrads weight_grads_from_product(const at::Tensor& product, int64_t dim) {
  TORCH_CHECK(dim == 56 || dim == 64, "slice ops: weight gradients from dL/dlogits need head size ",
              "56 or 64, got ", dim);
  TORCH_CHECK(product.dim() == 2 && product.size(0) % 32 == 0 && product.size(1) == dim + 8,
              "slice ops: the dL/dlogits product must be (G, ", dim + 8,
              ") with G a multiple of 32, got ", product.sizes());
  const int64_t g = product.size(0);
  // Row 32 b + 8 q + 2 m + e holds slice 32 b + 8 m + 2 q + e: dims
  // (b, q, m, e) read as (b, m, q, e).
  const auto rows = product.view({g / 32, 4, 4, 2, dim + 8}).permute({0, 2, 1, 3, 4});
  // Of the first 64 columns, 32 a + 8 q + 4 k + 2 m + e holds column
  // 32 a + 16 k + 8 m + 2 q + e: dims (a, q, k, m, e) read as (a, k, m, q, e).
  const auto cols = rows.narrow(4, 0, 64)
                        .reshape({g / 32, 4, 4, 2, 2, 4, 2, 2, 2})
                        .permute({0, 1, 2, 3, 4, 6, 7, 5, 8})
                        .reshape({g, 64});
  WeightGrads r;
  r.grad_ws = cols.narrow(1, 0, dim).contiguous();
  r.grad_bias = dim < 64 ? cols.select(1, dim).contiguous() : rows.select(4, 64).reshape({g});
  return r;
}

}  // namespace slipstream::aero::slice_ops
