#include "aero/ops/linear.h"

#include <ATen/ATen.h>
#include <torch/autograd.h>

#include <array>
#include <atomic>
#include <cstdint>

#include "aero/ops/fp8_linear.h"
#include "aero/ops/lt_matmul.h"
#include "aero/ops/numerics.h"

#ifdef SLIPSTREAM_WITH_CUDA
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "aero/kernels/column_sum_kernels.h"
#include "aero/kernels/gelu_kernels.h"
#endif

namespace slipstream::aero {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

struct Offer {
  c10::weak_intrusive_ptr<c10::TensorImpl> grad{c10::intrusive_ptr<c10::TensorImpl>()};
  uint32_t version = 0;
  at::Tensor sums;
};
constexpr size_t kOffers = 4;
thread_local std::array<Offer, kOffers> offers;
thread_local size_t next_offer = 0;
std::atomic<int64_t> offers_used{0};

// The bias gradient from `grad`, the output gradient autograd passed in, and
// g, its (rows, out) view: the sums offered for grad, else column_sum(g).
// An offer is taken once: it is withdrawn as it is used.
at::Tensor bias_grad(const at::Tensor& grad, const at::Tensor& g, at::ScalarType dtype) {
  for (auto& o : offers) {
    if (!o.sums.defined() || o.sums.numel() != g.size(1)) continue;
    const auto held = o.grad.lock();
    if (held.get() != grad.unsafeGetTensorImpl() || o.version != grad._version()) continue;
    auto sums = std::move(o.sums);
    o = Offer();
    offers_used.fetch_add(1, std::memory_order_relaxed);
    return sums.to(dtype);
  }
  return column_sum(g).to(dtype);
}

// On CUDA for bf16: g <- gelu_backward(g, h) in place and a = gelu(h), in
// one pass (gelu_kernels.h). False (nothing done) where the kernel does not
// apply.
bool fused_gelu_backward(const at::Tensor& h, at::Tensor& g, at::Tensor& a) {
#ifdef SLIPSTREAM_WITH_CUDA
  if (h.is_cuda() && h.scalar_type() == at::kBFloat16 && g.scalar_type() == at::kBFloat16 &&
      h.is_contiguous() && g.is_contiguous()) {
    auto out = at::empty_like(h);
    if (gelu_kernels::supported(h.data_ptr(), g.data_ptr(), out.data_ptr(), h.numel())) {
      const c10::cuda::CUDAGuard guard(h.device());
      gelu_kernels::backward_and_forward(h.data_ptr(), g.data_ptr(), out.data_ptr(), h.numel(),
                                         at::cuda::getCurrentCUDAStream(h.get_device()).stream());
      a = out;
      return true;
    }
  }
#else
  (void)h, (void)g, (void)a;
#endif
  return false;
}

// The same on a (rows, width) h and g, with gb = the column sums of the new
// g (the bias gradient of the Linear that made h) from the same pass. With
// a already defined (gelu(h), kept from the forward) it is left as it is
// and the pass writes no gelu(h).
bool fused_gelu_backward_sums(const at::Tensor& h, at::Tensor& g, at::Tensor& a, at::Tensor& gb) {
#ifdef SLIPSTREAM_WITH_CUDA
  if (h.is_cuda() && h.scalar_type() == at::kBFloat16 && g.scalar_type() == at::kBFloat16 &&
      h.is_contiguous() && g.is_contiguous() && h.dim() == 2) {
    const int64_t rows = h.size(0), width = h.size(1);
    const bool kept = a.defined();
    auto out = kept ? at::Tensor() : at::empty_like(h);
    void* out_ptr = kept ? nullptr : out.data_ptr();
    if (gelu_kernels::sums_supported(h.data_ptr(), g.data_ptr(), out_ptr, width)) {
      const c10::cuda::CUDAGuard guard(h.device());
      const auto f32 = h.options().dtype(at::kFloat);
      auto partial = at::empty({gelu_kernels::sums_partial_rows(rows, width), width}, f32);
      gb = at::empty({width}, f32);
      gelu_kernels::backward_and_forward_sums(
          h.data_ptr(), g.data_ptr(), out_ptr, rows, width, partial.data_ptr<float>(),
          gb.data_ptr<float>(), at::cuda::getCurrentCUDAStream(h.get_device()).stream());
      if (!kept) a = out;
      return true;
    }
  }
#else
  (void)h, (void)g, (void)a, (void)gb;
#endif
  return false;
}

// gelu(h) (exact, erf): on CUDA for bf16 by gelu_kernels::forward, ATen's
// values bitwise; elsewhere at::gelu.
at::Tensor gelu_of(const at::Tensor& h) {
#ifdef SLIPSTREAM_WITH_CUDA
  if (h.is_cuda() && h.scalar_type() == at::kBFloat16 && h.is_contiguous()) {
    auto out = at::empty_like(h);
    if (gelu_kernels::supported(h.data_ptr(), out.data_ptr(), out.data_ptr(), h.numel())) {
      const c10::cuda::CUDAGuard guard(h.device());
      gelu_kernels::forward(h.data_ptr(), out.data_ptr(), h.numel(),
                            at::cuda::getCurrentCUDAStream(h.get_device()).stream());
      return out;
    }
  }
#endif
  return at::gelu(h);
}

// ---- widths padded to multiples of 8 ----
// cuBLASLt (lt_matmul) takes bf16 GEMMs whose widths are multiples of 8;
// ATen ran the others on align1 CUTLASS kernels. The GeoTransolver volume
// step has four: its first Linears on 3 and 7 input features, its last on
// 5 outputs, each several times slower than writing its output. Padded with
// zero columns (a zero column adds exact
// zeros to every fp32 sum) they run on cuBLASLt's aligned kernels instead;
// the pads and the unpadded copies of the results are copies of a few MB.

int64_t up8(int64_t n) { return (n + 7) / 8 * 8; }

// True on CUDA for bf16 operands of a weight (out, in) with in or out not a
// multiple of 8.
bool pads(const at::Tensor& t, const at::Tensor& w) {
  return t.is_cuda() && t.scalar_type() == at::kBFloat16 && w.scalar_type() == at::kBFloat16 &&
         w.dim() == 2 && (w.size(0) % 8 != 0 || w.size(1) % 8 != 0);
}

// m (rows, n) with zero columns up to `to`; m itself when n == to.
at::Tensor pad_columns(const at::Tensor& m, int64_t to) {
  return to == m.size(-1) ? m : at::constant_pad_nd(m, {0, to - m.size(-1)});
}

// w (out, in) with zero rows and columns up to multiples of 8.
at::Tensor padded_weight(const at::Tensor& w) {
  return at::constant_pad_nd(w, {0, up8(w.size(1)) - w.size(1), 0, up8(w.size(0)) - w.size(0)});
}

// The first rows x cols block of m, contiguous (m itself when it is that).
at::Tensor unpadded(const at::Tensor& m, int64_t rows, int64_t cols) {
  if (m.size(0) == rows && m.size(1) == cols) return m;
  return m.narrow(0, 0, rows).narrow(1, 0, cols).contiguous();
}

// The weight gradient g^T in, (out, in), in w_dtype. For fp32 weights the
// product goes to cuBLASLt with an fp32 output (accumulated in fp32 either
// way), which makes the gradient in its final type and layout: no cast or
// transposing copy after it (numerics.gemm_report shows which problems
// cuBLASLt wins against ATen's bf16 GEMM and its cast). Otherwise, for
// out > in it is made as (in^T g)^T, the layout cuBLAS runs faster at the
// MLP's shapes (dev/probes/gemm_layouts.py); the transpose and the cast to
// w_dtype are then one copy.
at::Tensor weight_grad(const at::Tensor& g, const at::Tensor& in, at::ScalarType w_dtype) {
  const auto lt_dtype = g.scalar_type();
  at::Tensor r;
  if (g.is_cuda() && lt_dtype == at::kBFloat16 && in.scalar_type() == at::kBFloat16 &&
      (g.size(1) % 8 != 0 || in.size(1) % 8 != 0)) {
    // Widths padded (above): (out8, in8), its (out, in) block kept.
    const auto gp = pad_columns(g, up8(g.size(1))), ip = pad_columns(in, up8(in.size(1)));
    if (lt_matmul::mm(gp.t(), ip, {}, {}, r, w_dtype == at::kFloat ? at::kFloat : lt_dtype)) {
      return unpadded(r, g.size(1), in.size(1)).to(w_dtype);
    }
  }
  // fp32 weights from bf16 products: cuBLASLt writes the fp32 (out, in)
  // itself where, tuned, it beats ATen's bf16 GEMM and its cast.
  if (w_dtype == at::kFloat && lt_dtype == at::kBFloat16 &&
      lt_matmul::mm(g.t(), in, {}, {}, r, at::kFloat)) {
    return r;
  }
  if (g.size(1) > in.size(1)) {
    if (!lt_matmul::mm(in.t(), g, {}, {}, r, lt_dtype)) r = in.t().mm(g);
    return r.t().to(w_dtype, /*non_blocking=*/false, /*copy=*/false, at::MemoryFormat::Contiguous);
  }
  if (!lt_matmul::mm(g.t(), in, {}, {}, r, lt_dtype)) r = g.t().mm(in);
  return r.to(w_dtype);
}

// The input gradient g w, (rows, in), added to acc when it is defined. For
// out >= in, w goes to cuBLAS as the transpose of its transposed copy, the
// faster layout at those shapes; for out < in it keeps w
// (dev/probes/gemm_layouts.py measures each).
at::Tensor input_grad(const at::Tensor& g, const at::Tensor& w, const at::Tensor& acc = {}) {
  if (!acc.defined() && pads(g, w)) {
    // Widths padded (above): g (rows, out8) times w (out8, in8), its first
    // `in` columns kept.
    const auto wp = padded_weight(w);
    const auto bp = wp.size(0) >= wp.size(1) ? wp.t().contiguous().t() : wp;
    at::Tensor out;
    if (lt_matmul::mm(pad_columns(g, wp.size(0)), bp, {}, {}, out, g.scalar_type())) {
      return unpadded(out, out.size(0), w.size(1));
    }
  }
  const auto b = w.size(0) >= w.size(1) ? w.t().contiguous().t() : w;
  at::Tensor out = acc;  // accumulated in place on cuBLASLt
  if (lt_matmul::mm(g, b, {}, acc, out, g.scalar_type())) return out;
  if (acc.defined()) return acc.addmm_(g, b);
  return g.mm(b);
}

at::ScalarType saved_dtype(AutogradContext* ctx, const char* key) {
  return static_cast<at::ScalarType>(ctx->saved_data[key].toInt());
}

// at::linear(x, w, b), plus r when `residual`: on CUDA for bf16 on
// cuBLASLt (lt_matmul), r added in the GEMM's epilogue, else ATen's ops.
at::Tensor linear_plus(const at::Tensor& x, const at::Tensor& w, const at::Tensor& b,
                       const at::Tensor& r, bool residual) {
  at::Tensor y;
  if (residual) {
    if (lt_matmul::linear_residual(x, w, b, r, y)) return y;
    return at::linear(x, w, b) + r;
  }
  if (x.dim() >= 1 && x.numel() > 0 && x.is_contiguous() && w.dim() == 2) {
    auto sizes = x.sizes().vec();
    sizes.back() = w.size(0);
    const auto x2 = x.view({-1, x.size(-1)});
    if (lt_matmul::mm(x2, w.t(), b, {}, y, x.scalar_type())) return y.view(sizes);
    if (pads(x, w) && (!b.defined() || b.scalar_type() == at::kBFloat16)) {
      // Widths padded (above): (rows, in8) (in8, out8), its first `out`
      // columns kept.
      const auto wp = padded_weight(w);
      const auto bp = b.defined() ? pad_columns(b, wp.size(0)) : b;
      if (lt_matmul::mm(pad_columns(x2, wp.size(1)), wp.t(), bp, {}, y, x.scalar_type())) {
        return unpadded(y, y.size(0), w.size(0)).view(sizes);
      }
    }
  }
  return at::linear(x, w, b);
}

// linear(x) or, with `gelu`, linear(gelu(x)); either way x is what is kept
// for the backward (with gelu: the pre-activation, its GELU recomputed there).
// With `residual`, r is added to the result (without, r is a placeholder:
// an autograd function's inputs must be defined tensors in LibTorch 1.13).
class LinearFunction : public torch::autograd::Function<LinearFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& w_in,
                            const at::Tensor& b_in, const at::Tensor& r, bool gelu, bool residual) {
    const auto x = autocast_input(x_in), w = autocast_input(w_in), b = autocast_input(b_in);
    ctx->save_for_backward({x, w});
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(w_in.scalar_type());
    ctx->saved_data["b_dtype"] = static_cast<int64_t>(b_in.scalar_type());
    ctx->saved_data["gelu"] = gelu;
    ctx->saved_data["residual"] = residual;
    return linear_plus(gelu ? gelu_of(x) : x, w, b, r, residual);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &w = saved[1];
    const bool gelu = ctx->saved_data["gelu"].toBool();
    const auto g = grads[0].to(x.scalar_type()).reshape({-1, w.size(0)});
    at::Tensor gx, gw, gb, a;  // a: gelu(x), when the backward made it
    if (ctx->needs_input_grad(0)) {
      gx = input_grad(g, w).view(x.sizes());
      if (gelu && !fused_gelu_backward(x, gx, a)) gx = at::gelu_backward(gx, x);
    }
    if (ctx->needs_input_grad(1)) {
      if (gelu && !a.defined()) a = gelu_of(x);
      gw = weight_grad(g, (gelu ? a : x).reshape({-1, w.size(1)}), saved_dtype(ctx, "w_dtype"));
    }
    if (ctx->needs_input_grad(2)) gb = bias_grad(grads[0], g, saved_dtype(ctx, "b_dtype"));
    const bool residual = ctx->saved_data["residual"].toBool();
    return {gx, gw, gb, residual ? grads[0] : at::Tensor(), at::Tensor(), at::Tensor()};
  }
};

// linear(gelu(linear(x, w1, b1)), w2, b2), keeping x and the hidden layer h
// for the backward (GELU recomputed there, as in gelu_linear; with
// `keep_gelu` gelu(h) is kept too and not recomputed), which makes h's
// gradient and the first bias's gradient in one pass (on CUDA for bf16)
// rather than summing the (rows, hidden) gradient again. With `residual`, r
// is added to the result (as in LinearFunction).
class GeluMlpFunction : public torch::autograd::Function<GeluMlpFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_in, const at::Tensor& w1_in,
                            const at::Tensor& b1_in, const at::Tensor& w2_in,
                            const at::Tensor& b2_in, const at::Tensor& r, bool residual,
                            bool keep_gelu) {
    const auto x = autocast_input(x_in), w1 = autocast_input(w1_in), w2 = autocast_input(w2_in);
    const auto h = linear_plus(x, w1, autocast_input(b1_in), x, false);
    const auto a = gelu_of(h);
    if (keep_gelu) {
      ctx->save_for_backward({x, h, w1, w2, a});
    } else {
      ctx->save_for_backward({x, h, w1, w2});
    }
    ctx->saved_data["w1_dtype"] = static_cast<int64_t>(w1_in.scalar_type());
    ctx->saved_data["b1_dtype"] = static_cast<int64_t>(b1_in.scalar_type());
    ctx->saved_data["w2_dtype"] = static_cast<int64_t>(w2_in.scalar_type());
    ctx->saved_data["b2_dtype"] = static_cast<int64_t>(b2_in.scalar_type());
    ctx->saved_data["residual"] = residual;
    return linear_plus(a, w2, autocast_input(b2_in), r, residual);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto &x = saved[0], &h_in = saved[1], &w1 = saved[2], &w2 = saved[3];
    const auto h = h_in.reshape({-1, w1.size(0)});
    const auto g = grads[0].to(x.scalar_type()).reshape({-1, w2.size(0)});
    variable_list out(8);
    if (ctx->needs_input_grad(4)) out[4] = bias_grad(grads[0], g, saved_dtype(ctx, "b2_dtype"));
    if (ctx->saved_data["residual"].toBool()) out[5] = grads[0];
    // dL/dh, gelu(h) (unless kept) and dL/db1.
    auto gh = input_grad(g, w2);
    at::Tensor a = saved.size() > 4 ? saved[4].reshape({-1, w1.size(0)}) : at::Tensor(), gb1;
    if (!fused_gelu_backward_sums(h, gh, a, gb1)) {
      if (!a.defined()) a = gelu_of(h);
      gh = at::gelu_backward(gh, h);
      gb1 = column_sum(gh);
    }
    if (ctx->needs_input_grad(3)) out[3] = weight_grad(g, a, saved_dtype(ctx, "w2_dtype"));
    if (ctx->needs_input_grad(2)) out[2] = gb1.to(saved_dtype(ctx, "b1_dtype"));
    if (ctx->needs_input_grad(1)) {
      out[1] = weight_grad(gh, x.reshape({-1, w1.size(1)}), saved_dtype(ctx, "w1_dtype"));
    }
    if (ctx->needs_input_grad(0)) out[0] = input_grad(gh, w1).view(x.sizes());
    return out;
  }
};

// linear(x, w1, b1) and linear(x, w2, b2) with one backward for x: g1 w1,
// then g2 w2 accumulated into it by the GEMM (beta 1).
class LinearPairFunction : public torch::autograd::Function<LinearPairFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x_in,
                               const at::Tensor& w1_in, const at::Tensor& b1_in,
                               const at::Tensor& w2_in, const at::Tensor& b2_in) {
    const auto x = autocast_input(x_in), w1 = autocast_input(w1_in), w2 = autocast_input(w2_in);
    ctx->save_for_backward({x, w1, w2});
    ctx->saved_data["w1_dtype"] = static_cast<int64_t>(w1_in.scalar_type());
    ctx->saved_data["b1_dtype"] = static_cast<int64_t>(b1_in.scalar_type());
    ctx->saved_data["w2_dtype"] = static_cast<int64_t>(w2_in.scalar_type());
    ctx->saved_data["b2_dtype"] = static_cast<int64_t>(b2_in.scalar_type());
    return {linear_plus(x, w1, autocast_input(b1_in), x, false),
            linear_plus(x, w2, autocast_input(b2_in), x, false)};
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x = saved[0];
    const at::Tensor* w[2] = {&saved[1], &saved[2]};
    at::Tensor g[2];
    for (int i = 0; i < 2; ++i) {
      if (grads[i].defined()) g[i] = grads[i].to(x.scalar_type()).reshape({-1, w[i]->size(0)});
    }
    variable_list out(5);
    if (ctx->needs_input_grad(0)) {
      at::Tensor gx;
      for (int i = 0; i < 2; ++i) {
        if (g[i].defined()) gx = input_grad(g[i], *w[i], gx);
      }
      if (gx.defined()) out[0] = gx.view(x.sizes());
    }
    const auto x2 = x.reshape({-1, x.size(-1)});
    const char* w_key[2] = {"w1_dtype", "w2_dtype"};
    const char* b_key[2] = {"b1_dtype", "b2_dtype"};
    for (int i = 0; i < 2; ++i) {
      if (!g[i].defined()) continue;
      if (ctx->needs_input_grad(1 + 2 * i))
        out[1 + 2 * i] = weight_grad(g[i], x2, saved_dtype(ctx, w_key[i]));
      if (ctx->needs_input_grad(2 + 2 * i))
        out[2 + 2 * i] = bias_grad(grads[i], g[i], saved_dtype(ctx, b_key[i]));
    }
    return out;
  }
};

}  // namespace

at::Tensor column_sum(const at::Tensor& m) {
  const int64_t rows = m.size(0), width = m.size(1);
#ifdef SLIPSTREAM_WITH_CUDA
  if (m.is_cuda() && m.scalar_type() == at::kBFloat16 && column_sum_kernels::supported(width)) {
    const auto c = m.contiguous();
    if (reinterpret_cast<uintptr_t>(c.data_ptr()) % 16 == 0) {
      const c10::cuda::CUDAGuard guard(c.device());
      const auto f32 = c.options().dtype(at::kFloat);
      auto partial = at::empty({column_sum_kernels::partial_rows(rows, width), width}, f32);
      auto out = at::empty({width}, f32);
      column_sum_kernels::column_sum(c.data_ptr(), rows, width, partial.data_ptr<float>(),
                                     out.data_ptr<float>(),
                                     at::cuda::getCurrentCUDAStream(c.get_device()).stream());
      return out;
    }
  }
#endif
  const auto acc = at::promote_types(m.scalar_type(), at::kFloat);
  int64_t fold = 1;
  for (const int64_t f : {8, 4, 2}) {
    if (rows % f == 0 && width * f <= 2048) {
      fold = f;
      break;
    }
  }
  return m.contiguous()
      .view({rows / fold, fold * width})
      .sum(0, false, acc)
      .view({fold, width})
      .sum(0);
}

void offer_column_sums(const at::Tensor& grad, const at::Tensor& sums) {
  TORCH_CHECK(grad.defined() && grad.dim() >= 1 && sums.dim() == 1 && sums.numel() == grad.size(-1),
              "offer_column_sums: sums must be (grad.size(-1))");
  auto& o = offers[next_offer];
  next_offer = (next_offer + 1) % kOffers;
  o.grad = c10::weak_intrusive_ptr<c10::TensorImpl>(grad.getIntrusivePtr());
  o.version = grad._version();
  o.sums = sums;
}

at::Tensor offered_column_sums(const at::Tensor& grad) {
  if (!grad.defined()) return {};
  for (const auto& o : offers) {
    if (o.sums.defined() && o.version == grad._version() &&
        o.grad.lock().get() == grad.unsafeGetTensorImpl()) {
      return o.sums;
    }
  }
  return {};
}

at::Tensor bias_gradient(const at::Tensor& grad, const at::Tensor& g, at::ScalarType dtype) {
  return bias_grad(grad, g, dtype);
}

int64_t offered_column_sums_used() { return offers_used.load(std::memory_order_relaxed); }

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias) {
  if (fp8::applies(x, weight)) return fp8::linear(x, weight, bias);
  if (!bias.defined()) return at::linear(x, weight);
  return LinearFunction::apply(x, weight, bias, x, false, false);
}

at::Tensor linear_residual(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                           const at::Tensor& residual) {
  if (fp8::applies(x, weight)) return fp8::linear(x, weight, bias, residual);
  if (!residual.defined()) return linear(x, weight, bias);
  if (!bias.defined()) return at::linear(x, weight) + residual;
  return LinearFunction::apply(x, weight, bias, residual, false, true);
}

std::pair<at::Tensor, at::Tensor> linear_pair(const at::Tensor& x, const at::Tensor& w1,
                                              const at::Tensor& b1, const at::Tensor& w2,
                                              const at::Tensor& b2) {
  TORCH_CHECK(b1.defined() && b2.defined(), "linear_pair: both biases must be defined");
  if (fp8::linear_pair_applies(x, w1, w2)) return fp8::linear_pair(x, w1, b1, w2, b2);
  if (fp8::applies(x, w1) || fp8::applies(x, w2)) return {linear(x, w1, b1), linear(x, w2, b2)};
  auto y = LinearPairFunction::apply(x, w1, b1, w2, b2);
  return {y[0], y[1]};
}

at::Tensor gelu_mlp(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1,
                    const at::Tensor& w2, const at::Tensor& b2) {
  return gelu_mlp(x, w1, b1, w2, b2, at::Tensor());
}

at::Tensor gelu_mlp(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1,
                    const at::Tensor& w2, const at::Tensor& b2, const at::Tensor& residual,
                    bool keep_gelu) {
  TORCH_CHECK(b1.defined() && b2.defined(), "gelu_mlp: both biases must be defined");
  if (fp8::gelu_mlp_applies(x, w1, w2)) {
    return fp8::gelu_mlp(x, w1, b1, w2, b2, residual, keep_gelu);
  }
  if (fp8::applies(x, w1)) {  // the second product in bf16: the two apart
    return linear_residual(at::gelu(linear(x, w1, b1)), w2, b2, residual);
  }
  const bool with = residual.defined();
  return GeluMlpFunction::apply(x, w1, b1, w2, b2, with ? residual : x, with, keep_gelu);
}

at::Tensor gelu_linear(const at::Tensor& h, const at::Tensor& weight, const at::Tensor& bias) {
  if (fp8::applies(h, weight)) return linear(at::gelu(h), weight, bias);
  // An autograd function's inputs must be defined tensors (LibTorch 1.13).
  if (!bias.defined()) return at::linear(at::gelu(h), weight);
  return LinearFunction::apply(h, weight, bias, h, true, false);
}

}  // namespace slipstream::aero
