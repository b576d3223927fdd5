#include "aero/ops/fp8_linear.h"

#include "aero/ops/linear.h"

#include <ATen/ATen.h>
#include <c10/core/GradMode.h>
#include <c10/core/TensorImpl.h>
#include <c10/util/intrusive_ptr.h>
#include <torch/autograd.h>
#include <torch/version.h>

#include <algorithm>
#include <atomic>
#include <mutex>
#include <optional>
#include <tuple>
#include <unordered_map>
#include <vector>

#if defined(SLIPSTREAM_WITH_CUDA) && \
    (TORCH_VERSION_MAJOR > 2 || (TORCH_VERSION_MAJOR == 2 && TORCH_VERSION_MINOR >= 1))
#define SLIPSTREAM_FP8 1
#include <ATen/cuda/CUDAContext.h>
#include <c10/cuda/CUDAGuard.h>

#include "aero/kernels/fp8_kernels.h"
#include "aero/kernels/layer_norm_kernels.h"
#include "aero/ops/fused_layer_norm.h"
#include "aero/ops/lt_matmul.h"
#endif

namespace slipstream::aero::fp8 {

namespace {

// Each Linear's three scaled tensors, in this order, three slots in a row.
enum Role : int64_t { kInput = 0, kWeight = 1, kGradOutput = 2, kRoles = 3 };

// Slots for this many Linears: the largest config has a few hundred.
constexpr int64_t kMaxLinears = 2048;
// cuBLASLt reads the inverse scales by pointer and wants them 16-byte
// aligned (else CUBLAS_STATUS_NOT_SUPPORTED): one to a 4-float row.
constexpr int64_t kInvStride = 4;

struct Registry {
  std::mutex mutex;
  // Written under the mutex; read without it by enabled(), so that every
  // Linear of a run without fp8 asks for no lock.
  std::atomic<bool> on{false};
  Recipe recipe;
  c10::Device device{c10::kCPU};
  // (slots), (slots, history), (slots), (slots, kInvStride), (slots), (1),
  // on the device.
  at::Tensor amax, history, scale, scale_inv, limit, cursor;
  std::unordered_map<const void*, int64_t> first_slot;  // by the weight's TensorImpl
  std::vector<bool> scaled;                             // a slot's first scale made
  // Each key's TensorImpl, held weakly: its memory is not freed while its
  // slots live, so no later tensor takes its address and with it its
  // scaling state (a weight made anew at each call without a KeyAs then
  // runs out of slots, loudly, instead of mixing states).
  std::vector<c10::weak_intrusive_ptr<c10::TensorImpl>> keys;
};

Registry& registry() {
  static Registry r;
  return r;
}

thread_local Part current_part = Part::kBlocks;  // the innermost Scope's
// The live KeyAs scopes' (derived, source) weights, innermost last.
thread_local std::vector<std::pair<const void*, c10::TensorImpl*>> key_as;

// The key of weight's scaling state: its TensorImpl, or its source's.
c10::TensorImpl* key_of(const at::Tensor& weight) {
  const void* key = weight.unsafeGetTensorImpl();
  for (auto it = key_as.rbegin(); it != key_as.rend(); ++it) {
    if (it->first == key) return it->second;
  }
  return weight.unsafeGetTensorImpl();
}

}  // namespace

std::string name_of(Part part) {
  switch (part) {
    case Part::kEmbedding:
      return "embedding";
    case Part::kAttentionInputs:
      return "attention_inputs";
    default:
      return "blocks";
  }
}

Part part_named(const std::string& name) {
  for (const Part p : {Part::kEmbedding, Part::kAttentionInputs}) {
    if (name == name_of(p)) return p;
  }
  TORCH_CHECK(false, "config: 'numerics.fp8_exclude' has '", name,
              "'; its entries are embedding and attention_inputs");
  return Part::kBlocks;
}

Scope::Scope(Part part) : previous_(current_part) { current_part = part; }

Scope::~Scope() { current_part = previous_; }

KeyAs::KeyAs(const at::Tensor& derived, const at::Tensor& source) {
  key_as.emplace_back(derived.unsafeGetTensorImpl(), key_of(source));
}

KeyAs::~KeyAs() { key_as.pop_back(); }

int64_t linears() {
  auto& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  return static_cast<int64_t>(r.first_slot.size());
}

bool enabled() { return registry().on.load(std::memory_order_relaxed); }

void configure(bool on, const Recipe& recipe) {
  TORCH_CHECK(recipe.history >= 1 && recipe.history <= 1024,
              "fp8: the amax history must hold 1 to 1024 steps, not ", recipe.history);
  TORCH_CHECK(recipe.margin >= 0 && recipe.margin <= 16, "fp8: the margin must be 0 to 16, not ",
              recipe.margin);
  auto& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  r.on = on;
  r.recipe = recipe;
  r.amax = r.history = r.scale = r.scale_inv = r.limit = r.cursor = at::Tensor();
  r.first_slot.clear();
  r.scaled.clear();
  r.keys.clear();
}

#ifdef SLIPSTREAM_FP8

namespace {

namespace fk = fp8_kernels;

cudaStream_t current_stream() { return at::cuda::getCurrentCUDAStream().stream(); }

// The first of weight's three slots, made (with the buffers, on the first
// Linear) where it has none. Host-side bookkeeping alone; r.mutex held.
int64_t slots_of(Registry& r, const at::Tensor& weight) {
  c10::TensorImpl* key = key_of(weight);
  const auto it = r.first_slot.find(key);
  if (it != r.first_slot.end()) return it->second;
  if (!r.amax.defined()) {
    const int64_t slots = kMaxLinears * kRoles;
    const auto f32 = weight.options().dtype(at::kFloat);
    r.device = weight.device();
    r.amax = at::zeros({slots}, f32);
    r.history = at::zeros({slots, r.recipe.history}, f32);
    r.scale = at::ones({slots}, f32);
    r.scale_inv = at::ones({slots, kInvStride}, f32);
    std::vector<float> limits(static_cast<size_t>(slots));
    for (int64_t s = 0; s < slots; ++s) {
      limits[static_cast<size_t>(s)] =
          fk::max_finite(s % kRoles == kGradOutput ? fk::Format::kE5M2 : fk::Format::kE4M3);
    }
    r.limit = at::tensor(limits, at::kFloat).to(weight.device());
    r.cursor = at::zeros({1}, weight.options().dtype(at::kLong));
  }
  TORCH_CHECK(weight.device() == r.device, "fp8: a Linear on ", weight.device(),
              " where the others are on ", r.device);
  const auto first = static_cast<int64_t>(r.first_slot.size()) * kRoles;
  TORCH_CHECK(first + kRoles <= kMaxLinears * kRoles, "fp8: more than ", kMaxLinears,
              " Linear layers (a weight made anew at each call must keep its parameter's "
              "scaling state through fp8::KeyAs)");
  r.first_slot.emplace(key, first);
  r.keys.emplace_back(c10::intrusive_ptr<c10::TensorImpl>::unsafe_reclaim_from_nonowning(key));
  r.scaled.resize(static_cast<size_t>(first + kRoles), false);
  return first;
}

fk::Format format_of(int64_t slot) {
  return slot % kRoles == kGradOutput ? fk::Format::kE5M2 : fk::Format::kE4M3;
}

at::ScalarType dtype_of(fk::Format f) {
  return f == fk::Format::kE5M2 ? at::ScalarType::Float8_e5m2 : at::ScalarType::Float8_e4m3fn;
}

// The fp8 GEMMs take widths that are multiples of 16; rows (the weight
// gradient's contracted dimension) are padded with zeros up to one.
int64_t padded(int64_t rows) { return (rows + 15) / 16 * 16; }

struct Cast {
  at::Tensor q, q_t;  // (padded rows, cols) and, where asked for, (cols, padded rows)
};

// A (rows, cols) tensor cast into slot's format and scale by cast(scale,
// out, out_t, amax, last), which writes the fp8 copy (rows padded with
// zeros to a multiple of 16) and its transpose where given and records the
// amax; a slot's first cast makes its first scale from the amax alone
// (out null, last false) before casting.
template <class CastFn>
Cast quantize_by(Registry& r, int64_t slot, int64_t rows, int64_t cols,
                 const at::TensorOptions& options, bool want, bool want_t, const CastFn& cast) {
  float* amax = r.amax.data_ptr<float>() + slot;
  float* scale = r.scale.data_ptr<float>() + slot;
  const auto format = format_of(slot);
  if (!r.scaled[static_cast<size_t>(slot)]) {
    cast(scale, nullptr, nullptr, amax, false);
    fk::scale_from_amax(amax, fk::max_finite(format), r.recipe.margin, scale,
                        r.scale_inv.data_ptr<float>() + slot * kInvStride, current_stream());
    r.scaled[static_cast<size_t>(slot)] = true;
  }
  const auto o = options.dtype(dtype_of(format));
  Cast c;
  if (want || want_t) c.q = at::empty({padded(rows), cols}, o);
  if (want_t) c.q_t = at::empty({cols, padded(rows)}, o);
  cast(scale, c.q.defined() ? static_cast<uint8_t*>(c.q.data_ptr()) : nullptr,
       c.q_t.defined() ? static_cast<uint8_t*>(c.q_t.data_ptr()) : nullptr, amax, true);
  return c;
}

// m (rows, cols), bf16 or fp32, contiguous, cast as above.
Cast quantize(Registry& r, int64_t slot, const at::Tensor& m, bool want, bool want_t) {
  const int64_t rows = m.size(0), cols = m.size(1);
  const bool in_fp32 = m.scalar_type() == at::kFloat;
  return quantize_by(r, slot, rows, cols, m.options(), want, want_t,
                     [&](const float* scale, uint8_t* out, uint8_t* out_t, float* amax, bool) {
                       fk::quantize(m.data_ptr(), in_fp32, rows, padded(rows), cols, scale,
                                    format_of(slot), out, out_t, amax, current_stream());
                     });
}

// The inverse scale of `slot`, 0-dim, as the fp8 GEMMs take it.
at::Tensor inv(const Registry& r, int64_t slot) { return r.scale_inv[slot][0]; }

at::Tensor as_matrix(const at::Tensor& t) {
  auto m = t.reshape({-1, t.size(-1)});
  if (m.scalar_type() != at::kFloat && m.scalar_type() != at::kBFloat16) m = m.to(at::kBFloat16);
  return m.contiguous();
}

// An fp8 product's bias as _scaled_mm takes it (bf16), or none for the
// empty tensor that stands for none (an autograd function's inputs are
// defined tensors).
std::optional<at::Tensor> bias_of(const at::Tensor& bias) {
  return bias.numel() > 0 ? std::optional<at::Tensor>(bias.to(at::kBFloat16))
                          : std::optional<at::Tensor>();
}

// The first `rows` rows of the fp8 product a b (a's rows padded as
// quantize pads them) [+ bias] [+ c (rows, b's columns)]: on
// lt_matmul::scaled_mm (each problem's algorithm timed once, c read by the
// GEMM's epilogue, the sum rounded once) where it takes the product, else
// ATen's _scaled_mm and c added apart.
at::Tensor product(const at::Tensor& a, const at::Tensor& b, const at::Tensor& scale_a,
                   const at::Tensor& scale_b, const std::optional<at::Tensor>& bias,
                   const at::Tensor& c, int64_t rows, at::ScalarType dtype, bool fast_accum) {
  at::Tensor out;
  if (lt_matmul::scaled_mm(a.narrow(0, 0, rows), b, scale_a, scale_b, bias ? *bias : at::Tensor(),
                           c, out, dtype, fast_accum)) {
    return out;
  }
  auto y = at::_scaled_mm(a, b, scale_a, scale_b, bias, std::nullopt, dtype, fast_accum)
               .narrow(0, 0, rows);
  return c.defined() ? y + c : y;
}

// An optional tensor argument as an autograd function takes it (its inputs
// are defined tensors): the empty tensor for none.
at::Tensor or_empty(const at::Tensor& t, const at::Tensor& like) {
  return t.defined() ? t : at::empty({0}, like.options());
}

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

// What the two-Linear functions below keep besides their tensors: the
// Linears' first slots, x's sizes and each argument's dtype.
void save_two_linears(AutogradContext* ctx, int64_t s1, int64_t s2, const at::Tensor& x,
                      const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2,
                      const at::Tensor& b2) {
  ctx->saved_data["s1"] = s1;
  ctx->saved_data["s2"] = s2;
  ctx->saved_data["x_sizes"] = x.sizes().vec();
  for (const auto& [key, t] : {std::pair<const char*, const at::Tensor*>{"x", &x},
                               {"w1", &w1},
                               {"b1", &b1},
                               {"w2", &w2},
                               {"b2", &b2}}) {
    ctx->saved_data[key] = static_cast<int64_t>(t->scalar_type());
  }
}

// A LayerNorm over x's last dimension run as the prologue of the products
// of its output (the functions' `ln_w`, `ln_b`, `eps` arguments; ln_w
// empty: none): its output is written only as the first product's e4m3
// copies (layer_norm_kernels::forward_e4m3), never in bf16, and its
// backward kernel takes the products' gradient of that output.
struct Norm {
  at::Tensor x, weight, bias;  // x (rows, C) as the kernels take it; fp32 (C)
  at::Tensor mean, rstd;       // (rows) fp32, once the forward has run
  double eps = 0;

  bool on() const { return weight.defined(); }
};

Norm norm_of(const at::Tensor& x, const at::Tensor& ln_w, const at::Tensor& ln_b, double eps) {
  Norm n;
  if (ln_w.numel() == 0) return n;
  n.x = layer_norm_kernels_input(x).reshape({-1, x.size(-1)});
  n.weight = ln_w.detach().contiguous();
  n.bias = ln_b.detach().contiguous();
  n.eps = eps;
  const auto f32 = n.x.options().dtype(at::kFloat);
  n.mean = at::empty({n.x.size(0)}, f32);
  n.rstd = at::empty({n.x.size(0)}, f32);
  return n;
}

// The LayerNorm's output, cast into `slot` (an input slot: e4m3) as
// quantize() casts a tensor.
Cast quantize_norm(Registry& r, int64_t slot, const Norm& n, bool want_t) {
  const int64_t rows = n.x.size(0), cols = n.x.size(1);
  return quantize_by(r, slot, rows, cols, n.x.options(), true, want_t,
                     [&](const float* scale, uint8_t* out, uint8_t* out_t, float* amax, bool) {
                       layer_norm_kernels::forward_e4m3(
                           n.x.data_ptr(), n.weight.data_ptr<float>(), n.bias.data_ptr<float>(),
                           rows, padded(rows), cols, static_cast<float>(n.eps), scale, out, out_t,
                           amax, n.mean.data_ptr<float>(), n.rstd.data_ptr<float>(),
                           current_stream());
                     });
}

// The saved tensors' tail for the LayerNorm (undefined where there is none).
std::vector<at::Tensor> norm_saved(const Norm& n, bool grad) {
  if (!n.on() || !grad) return {at::Tensor(), at::Tensor(), at::Tensor(), at::Tensor()};
  return {n.x, n.weight, n.mean, n.rstd};
}

// The LayerNorm's backward from saved[first...] (norm_saved's), the
// products' gradient of its output `gy` and a residual path's `gres`:
// x's gradient, and the weight's and bias's into out[w], out[w + 1].
at::Tensor norm_backward(const variable_list& saved, size_t first, const at::Tensor& gy,
                         const at::Tensor& gres, variable_list& out, size_t w) {
  const auto g = layer_norm_kernels_backward(saved[first], saved[first + 1], saved[first + 2],
                                             saved[first + 3], gy, gres);
  out[w] = g.weight;
  out[w + 1] = g.bias;
  return g.x;
}

class Fp8LinearFunction : public torch::autograd::Function<Fp8LinearFunction> {
 public:
  // grad: grad mode was on at the call (inside forward it is off), so
  // that a no-grad forward keeps no transposed copies.
  // residual: added to the output (the empty tensor: nothing added).
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& weight,
                            const at::Tensor& bias, const at::Tensor& residual, bool grad) {
    const c10::cuda::CUDAGuard guard(x.device());
    auto& r = registry();
    const std::lock_guard<std::mutex> lock(r.mutex);
    const int64_t slot = slots_of(r, weight);
    const auto x2 = as_matrix(x), w = as_matrix(weight);
    // The backward's GEMMs take x transposed (weight gradient) and the
    // weight transposed (input gradient).
    const Cast xq = quantize(r, slot + kInput, x2, true, grad && weight.requires_grad());
    const Cast wq = quantize(r, slot + kWeight, w, true, grad && x.requires_grad());
    const bool with = residual.numel() > 0;
    // The padding rows' products dropped.
    const auto y = product(xq.q, wq.q.t(), inv(r, slot + kInput), inv(r, slot + kWeight),
                           bias_of(bias), with ? as_matrix(residual) : at::Tensor(), x2.size(0),
                           at::kBFloat16, /*fast_accum=*/true);
    ctx->saved_data["residual"] = with;
    ctx->save_for_backward({xq.q_t, wq.q_t});
    ctx->saved_data["slot"] = slot;
    ctx->saved_data["x_dtype"] = static_cast<int64_t>(x.scalar_type());
    ctx->saved_data["x_sizes"] = x.sizes().vec();
    ctx->saved_data["w_dtype"] = static_cast<int64_t>(weight.scalar_type());
    ctx->saved_data["b_dtype"] = static_cast<int64_t>(bias.scalar_type());
    ctx->saved_data["bias"] = bias.numel() > 0;
    auto sizes = x.sizes().vec();
    sizes.back() = weight.size(0);
    return y.view(sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(5);
    if (!grads[0].defined()) return out;
    if (ctx->saved_data["residual"].toBool()) out[3] = grads[0];
    const auto saved = ctx->get_saved_variables();
    const auto &x_t = saved[0], &w_t = saved[1];
    const int64_t slot = ctx->saved_data["slot"].toInt();
    const auto g = as_matrix(grads[0].to(at::kBFloat16));
    const c10::cuda::CUDAGuard guard(g.device());
    auto& r = registry();
    const std::lock_guard<std::mutex> lock(r.mutex);
    const bool want_x = ctx->needs_input_grad(0) && w_t.defined();
    const bool want_w = ctx->needs_input_grad(1) && x_t.defined();
    const Cast gq = quantize(r, slot + kGradOutput, g, want_x, want_w);
    const auto dtype = [&](const char* key) {
      return static_cast<at::ScalarType>(ctx->saved_data[key].toInt());
    };
    if (want_x) {
      const auto gx = product(gq.q, w_t.t(), inv(r, slot + kGradOutput), inv(r, slot + kWeight),
                              std::nullopt, {}, gq.q.size(0), at::kBFloat16, /*fast_accum=*/false);
      out[0] = gx.narrow(0, 0, g.size(0))
                   .view(ctx->saved_data["x_sizes"].toIntVector())
                   .to(dtype("x_dtype"));
    }
    if (want_w) {
      const auto gw = product(gq.q_t, x_t.t(), inv(r, slot + kGradOutput), inv(r, slot + kInput),
                              std::nullopt, {}, gq.q_t.size(0), at::kFloat, /*fast_accum=*/false);
      out[1] = gw.to(dtype("w_dtype"));
    }
    if (ctx->needs_input_grad(2) && ctx->saved_data["bias"].toBool()) {
      out[2] = bias_gradient(grads[0], g, dtype("b_dtype"));
    }
    return out;
  }
};

// linear(x, w1, b1) and linear(x, w2, b2) of one x, both as
// Fp8LinearFunction makes them from one e4m3 copy of x (and its
// transpose), at the first Linear's input scale: the second's input slot
// stays unused (its amax history would be the same). Backward, x's
// gradient is g1 w1 with g2 w2 added by the second GEMM's epilogue.
// With a Norm (ln_w not empty), of LayerNorm(x) instead, and a third
// output r equal to x, whose gradient the LayerNorm's backward kernel adds.
class Fp8LinearPairFunction : public torch::autograd::Function<Fp8LinearPairFunction> {
 public:
  static variable_list forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w1,
                               const at::Tensor& b1, const at::Tensor& w2, const at::Tensor& b2,
                               const at::Tensor& ln_w, const at::Tensor& ln_b, double eps,
                               bool grad) {
    const c10::cuda::CUDAGuard guard(x.device());
    auto& r = registry();
    const std::lock_guard<std::mutex> lock(r.mutex);
    const int64_t s1 = slots_of(r, w1), s2 = slots_of(r, w2);
    const Norm norm = norm_of(x, ln_w, ln_b, eps);
    if (norm.on()) ctx->set_materialize_grads(false);
    const auto x2 = norm.on() ? norm.x : as_matrix(x);
    const int64_t rows = x2.size(0);
    const bool want_w = grad && (w1.requires_grad() || w2.requires_grad());
    // x's gradient (LayerNorm's output's, with a Norm) is wanted for x's or the LayerNorm's.
    const bool want_x = grad && (x.requires_grad() ||
                                 (norm.on() && (ln_w.requires_grad() || ln_b.requires_grad())));
    const Cast xq = norm.on() ? quantize_norm(r, s1 + kInput, norm, want_w)
                              : quantize(r, s1 + kInput, x2, true, want_w);
    const Cast w1q = quantize(r, s1 + kWeight, as_matrix(w1), true, want_x);
    const Cast w2q = quantize(r, s2 + kWeight, as_matrix(w2), true, want_x);
    const auto y1 = product(xq.q, w1q.q.t(), inv(r, s1 + kInput), inv(r, s1 + kWeight), bias_of(b1),
                            {}, rows, at::kBFloat16, /*fast_accum=*/true);
    const auto y2 = product(xq.q, w2q.q.t(), inv(r, s1 + kInput), inv(r, s2 + kWeight), bias_of(b2),
                            {}, rows, at::kBFloat16, /*fast_accum=*/true);
    auto saved = norm_saved(norm, grad);
    saved.insert(saved.begin(), {xq.q_t, w1q.q_t, w2q.q_t});
    ctx->save_for_backward(saved);
    save_two_linears(ctx, s1, s2, x, w1, b1, w2, b2);
    auto sizes = x.sizes().vec();
    sizes.back() = w1.size(0);
    auto sizes2 = sizes;
    sizes2.back() = w2.size(0);
    variable_list out{y1.view(sizes), y2.view(sizes2)};
    if (norm.on()) out.push_back(x);
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(9);
    const auto saved = ctx->get_saved_variables();
    const auto& x_t = saved[0];
    const at::Tensor* w_t[2] = {&saved[1], &saved[2]};
    const int64_t slot[2] = {ctx->saved_data["s1"].toInt(), ctx->saved_data["s2"].toInt()};
    const bool norm = saved[3].defined();
    const auto dtype = [&](const char* key) {
      return static_cast<at::ScalarType>(ctx->saved_data[key].toInt());
    };
    const char* w_key[2] = {"w1", "w2"};
    const char* b_key[2] = {"b1", "b2"};
    const bool want_x = ctx->needs_input_grad(0) ||
                        (norm && (ctx->needs_input_grad(5) || ctx->needs_input_grad(6)));
    auto& r = registry();
    at::Tensor gx;  // (rows, in): g1 w1, then + g2 w2
    for (int i = 0; i < 2; ++i) {
      if (!grads[i].defined()) continue;
      const auto g = as_matrix(grads[i].to(at::kBFloat16));
      const c10::cuda::CUDAGuard guard(g.device());
      const std::lock_guard<std::mutex> lock(r.mutex);
      const bool to_x = want_x && w_t[i]->defined();
      const bool want_w = ctx->needs_input_grad(1 + 2 * i) && x_t.defined();
      const Cast gq = quantize(r, slot[i] + kGradOutput, g, to_x, want_w);
      if (to_x) {
        gx = product(gq.q, w_t[i]->t(), inv(r, slot[i] + kGradOutput), inv(r, slot[i] + kWeight),
                     std::nullopt, gx, g.size(0), at::kBFloat16, /*fast_accum=*/false);
      }
      if (want_w) {
        out[1 + 2 * i] =
            product(gq.q_t, x_t.t(), inv(r, slot[i] + kGradOutput), inv(r, slot[0] + kInput),
                    std::nullopt, {}, gq.q_t.size(0), at::kFloat, /*fast_accum=*/false)
                .to(dtype(w_key[i]));
      }
      if (ctx->needs_input_grad(2 + 2 * i))
        out[2 + 2 * i] = bias_gradient(grads[i], g, dtype(b_key[i]));
    }
    if (norm) {
      const c10::cuda::CUDAGuard guard(saved[3].device());
      gx = norm_backward(saved, 3, gx, grads.size() > 2 ? grads[2] : at::Tensor(), out, 5);
    }
    if (gx.defined()) {
      out[0] = gx.view(ctx->saved_data["x_sizes"].toIntVector()).to(dtype("x"));
    }
    return out;
  }
};

// gelu(h) cast into slot (h: (padded rows, hidden) bf16, its first `rows`
// rows read), and its transposed copy where want_t.
Cast gelu_cast(Registry& r, int64_t slot, const at::Tensor& h, int64_t rows, bool want_t) {
  const int64_t hidden = h.size(1);
  return quantize_by(r, slot, rows, hidden, h.options(), true, want_t,
                     [&](const float* scale, uint8_t* out, uint8_t* out_t, float* amax, bool) {
                       fk::quantize_gelu(h.data_ptr(), nullptr, rows, padded(rows), hidden, scale,
                                         format_of(slot), out, out_t, amax, nullptr, nullptr,
                                         current_stream());
                     });
}

// linear(gelu(linear(x, w1, b1)), w2, b2) with both products as
// Fp8LinearFunction makes them, gelu(h) cast straight to the second
// product's e4m3 copies and GELU's backward straight to the e5m2 copies of
// h's gradient, with b1's gradient summed in the same pass
// (fp8_kernels.h's quantize_gelu). Keeps x's, gelu(h)'s and both weights'
// transposed fp8 copies and h (gelu(h)'s not with keep_gelu false: the
// backward casts it again from h). With a Norm (ln_w not empty), of
// LayerNorm(x) instead, with x itself the residual (`residual` empty):
// x's gradient is the LayerNorm's and the residual's, in one kernel.
class Fp8GeluMlpFunction : public torch::autograd::Function<Fp8GeluMlpFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x, const at::Tensor& w1,
                            const at::Tensor& b1, const at::Tensor& w2, const at::Tensor& b2,
                            const at::Tensor& residual, const at::Tensor& ln_w,
                            const at::Tensor& ln_b, double eps, bool grad, bool keep_gelu) {
    const c10::cuda::CUDAGuard guard(x.device());
    auto& r = registry();
    const std::lock_guard<std::mutex> lock(r.mutex);
    const int64_t s1 = slots_of(r, w1), s2 = slots_of(r, w2);
    const Norm norm = norm_of(x, ln_w, ln_b, eps);
    const auto x2 = norm.on() ? norm.x : as_matrix(x);
    const int64_t rows = x2.size(0);
    // x's gradient (LayerNorm's output's, with a Norm) is wanted for x's or the LayerNorm's.
    const bool want_x = grad && (x.requires_grad() ||
                                 (norm.on() && (ln_w.requires_grad() || ln_b.requires_grad())));
    // h's gradient is needed for x's, w1's or b1's.
    const bool to_h = want_x || (grad && (w1.requires_grad() || b1.requires_grad()));
    const Cast xq = norm.on() ? quantize_norm(r, s1 + kInput, norm, grad && w1.requires_grad())
                              : quantize(r, s1 + kInput, x2, true, grad && w1.requires_grad());
    const Cast w1q = quantize(r, s1 + kWeight, as_matrix(w1), true, want_x);
    // (padded rows, hidden): the padding rows' values are b1, and no cast reads them.
    const auto h = product(xq.q, w1q.q.t(), inv(r, s1 + kInput), inv(r, s1 + kWeight), bias_of(b1),
                           {}, xq.q.size(0), at::kBFloat16, /*fast_accum=*/true);
    // gelu(h)'s transposed copy, w2's gradient's operand: kept, or (not
    // keep_gelu) made again from h by the backward.
    const bool want_w2 = grad && w2.requires_grad();
    const Cast aq = gelu_cast(r, s2 + kInput, h, rows, keep_gelu && want_w2);
    const Cast w2q = quantize(r, s2 + kWeight, as_matrix(w2), true, to_h);
    const bool with = residual.numel() > 0;
    const auto c = norm.on() ? x2 : (with ? as_matrix(residual) : at::Tensor());
    const auto y = product(aq.q, w2q.q.t(), inv(r, s2 + kInput), inv(r, s2 + kWeight), bias_of(b2),
                           c, rows, at::kBFloat16, /*fast_accum=*/true);
    ctx->saved_data["residual"] = with;
    auto saved = norm_saved(norm, grad);
    const bool keep_h = to_h || (want_w2 && !keep_gelu);
    saved.insert(saved.begin(), {xq.q_t, w1q.q_t, aq.q_t, w2q.q_t, keep_h ? h : at::Tensor()});
    ctx->save_for_backward(saved);
    ctx->saved_data["remake_gelu"] = want_w2 && !keep_gelu;
    save_two_linears(ctx, s1, s2, x, w1, b1, w2, b2);
    auto sizes = x.sizes().vec();
    sizes.back() = w2.size(0);
    return y.view(sizes);
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    variable_list out(11);
    if (!grads[0].defined()) return out;
    if (ctx->saved_data["residual"].toBool()) out[5] = grads[0];
    const auto saved = ctx->get_saved_variables();
    const auto &x_t = saved[0], &w1_t = saved[1], &w2_t = saved[3], &h = saved[4];
    at::Tensor a_t = saved[2];
    const bool norm = saved[5].defined();
    const int64_t s1 = ctx->saved_data["s1"].toInt(), s2 = ctx->saved_data["s2"].toInt();
    const auto dtype = [&](const char* key) {
      return static_cast<at::ScalarType>(ctx->saved_data[key].toInt());
    };
    const auto g = as_matrix(grads[0].to(at::kBFloat16));
    const int64_t rows = g.size(0);
    const c10::cuda::CUDAGuard guard(g.device());
    auto& r = registry();
    const std::lock_guard<std::mutex> lock(r.mutex);
    const auto x_sizes = ctx->saved_data["x_sizes"].toIntVector();
    // x's gradient: the products' (with a Norm: through the LayerNorm, the
    // residual's added there).
    const auto finish = [&](const at::Tensor& gn) {
      if (!norm) return gn.view(x_sizes).to(dtype("x"));
      return norm_backward(saved, 5, gn, g, out, 6).view(x_sizes).to(dtype("x"));
    };
    const bool want_x = (ctx->needs_input_grad(0) ||
                         (norm && (ctx->needs_input_grad(6) || ctx->needs_input_grad(7)))) &&
                        w1_t.defined();
    const bool want_w1 = ctx->needs_input_grad(1) && x_t.defined();
    const bool want_b1 = ctx->needs_input_grad(2) && h.defined();
    const bool want_h = h.defined() && w2_t.defined() && (want_x || want_w1 || want_b1);
    const bool remake_gelu = ctx->saved_data["remake_gelu"].toBool();
    const bool want_w2 = ctx->needs_input_grad(3) && (a_t.defined() || remake_gelu);
    // gelu(h)'s transposed copy as the forward made it (the same scale
    // within a step: the same bytes), where it was not kept: by the pass
    // over h that makes h's gradient's fp8 copies where there is one, else
    // by a pass of its own.
    const bool remake_in_pass = want_w2 && !a_t.defined() && want_h && (want_x || want_w1);
    if (want_w2 && !a_t.defined() && !remake_in_pass) {
      a_t = gelu_cast(r, s2 + kInput, h, rows, true).q_t;
    }
    if (ctx->needs_input_grad(4)) out[4] = bias_gradient(grads[0], g, dtype("b2"));
    // dL/dgelu(h), (padded rows, hidden), its padding rows zero; g's fp8
    // copies freed once it is made and w2's gradient taken.
    at::Tensor ga;
    Cast gq = quantize(r, s2 + kGradOutput, g, want_h, want_w2);
    const auto w2_gradient = [&] {
      out[3] = product(gq.q_t, a_t.t(), inv(r, s2 + kGradOutput), inv(r, s2 + kInput), std::nullopt,
                       {}, gq.q_t.size(0), at::kFloat, /*fast_accum=*/false)
                   .to(dtype("w2"));
    };
    if (want_w2 && !remake_in_pass) w2_gradient();
    if (want_h) {
      ga = product(gq.q, w2_t.t(), inv(r, s2 + kGradOutput), inv(r, s2 + kWeight), std::nullopt, {},
                   gq.q.size(0), at::kBFloat16, /*fast_accum=*/false);
    }
    if (!remake_in_pass) gq = Cast{};
    if (!want_h) {
      if (norm && ctx->needs_input_grad(0)) out[0] = finish(at::Tensor());
      return out;
    }
    const int64_t hidden = ga.size(1);
    const auto format = format_of(s1 + kGradOutput);
    const auto f32 = ga.options().dtype(at::kFloat);
    at::Tensor colsum, partial;
    if (want_b1) {
      colsum = at::empty({hidden}, f32);
      partial = at::empty({fk::gelu_partial_rows(padded(rows), hidden, format), hidden}, f32);
    }
    if (remake_in_pass) {
      a_t = at::empty({hidden, padded(rows)}, ga.options().dtype(dtype_of(format_of(s2 + kInput))));
    }
    const fk::GeluForwardCopy also{r.scale.data_ptr<float>() + s2 + kInput,
                                   remake_in_pass ? static_cast<uint8_t*>(a_t.data_ptr()) : nullptr,
                                   r.amax.data_ptr<float>() + s2 + kInput};
    const Cast ghq = quantize_by(
        r, s1 + kGradOutput, rows, hidden, ga.options(), want_x, want_w1,
        [&](const float* scale, uint8_t* o, uint8_t* o_t, float* amax, bool last) {
          fk::quantize_gelu(h.data_ptr(), ga.data_ptr(), rows, padded(rows), hidden, scale, format,
                            o, o_t, amax, last && want_b1 ? partial.data_ptr<float>() : nullptr,
                            last && want_b1 ? colsum.data_ptr<float>() : nullptr, current_stream(),
                            last && remake_in_pass ? &also : nullptr);
        });
    ga.reset();  // before the GEMMs' outputs are made
    if (remake_in_pass) {
      w2_gradient();
      gq = Cast{};
      a_t.reset();
    }
    if (want_x) {
      out[0] = finish(product(ghq.q, w1_t.t(), inv(r, s1 + kGradOutput), inv(r, s1 + kWeight),
                              std::nullopt, {}, ghq.q.size(0), at::kBFloat16, /*fast_accum=*/false)
                          .narrow(0, 0, rows));
    }
    if (want_w1) {
      out[1] = product(ghq.q_t, x_t.t(), inv(r, s1 + kGradOutput), inv(r, s1 + kInput),
                       std::nullopt, {}, ghq.q_t.size(0), at::kFloat, /*fast_accum=*/false)
                   .to(dtype("w1"));
    }
    if (want_b1) out[2] = colsum.to(dtype("b1"));
    return out;
  }
};

}  // namespace

std::string unsupported(c10::Device device) {
  if (!device.is_cuda()) return "fp8 GEMMs need a CUDA GPU; this run is on " + device.str();
  const auto* p = at::cuda::getDeviceProperties(device.index() < 0 ? at::cuda::current_device()
                                                                   : device.index());
  if (p->major * 10 + p->minor < 89) {
    return std::string(
               "fp8 GEMMs need a GPU of compute capability 8.9 or newer (fp8 tensor "
               "cores: Ada, Hopper, Blackwell); ") +
           p->name + " is " + std::to_string(p->major) + "." + std::to_string(p->minor);
  }
  return "";
}

namespace {
// fp8 on, and the current Scope's part not excluded by the recipe.
bool enabled_here() {
  if (!enabled()) return false;
  auto& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  return r.on && std::find(r.recipe.exclude.begin(), r.recipe.exclude.end(), current_part) ==
                     r.recipe.exclude.end();
}
}  // namespace

bool applies(const at::Tensor& x, const at::Tensor& weight) {
  if (!enabled_here() || !x.defined() || !weight.defined()) return false;
  if (!x.is_cuda() || weight.device() != x.device() || !x.is_floating_point()) return false;
  if (weight.dim() != 2 || x.dim() < 1 || x.size(-1) != weight.size(1) || x.numel() == 0) {
    return false;
  }
  return weight.size(0) % 16 == 0 && weight.size(1) % 16 == 0;
}

at::Tensor linear(const at::Tensor& x, const at::Tensor& weight, const at::Tensor& bias,
                  const at::Tensor& residual) {
  TORCH_CHECK(applies(x, weight), "fp8::linear: x ", x.sizes(), " and weight ", weight.sizes(),
              " are not an fp8 product (fp8 on, one GPU, widths multiples of 16)");
  if (residual.defined()) {
    auto sizes = x.sizes().vec();
    sizes.back() = weight.size(0);
    TORCH_CHECK(residual.sizes() == at::IntArrayRef(sizes), "fp8::linear: the residual ",
                residual.sizes(), " is not the output's shape ", at::IntArrayRef(sizes));
  }
  return Fp8LinearFunction::apply(x, weight, or_empty(bias, weight), or_empty(residual, x),
                                  at::GradMode::is_enabled());
}

bool linear_pair_applies(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2) {
  return applies(x, w1) && applies(x, w2);
}

std::pair<at::Tensor, at::Tensor> linear_pair(const at::Tensor& x, const at::Tensor& w1,
                                              const at::Tensor& b1, const at::Tensor& w2,
                                              const at::Tensor& b2) {
  TORCH_CHECK(linear_pair_applies(x, w1, w2), "fp8::linear_pair: x ", x.sizes(), ", w1 ",
              w1.sizes(), " and w2 ", w2.sizes(),
              " are not fp8 products (fp8 on, one GPU, widths multiples of 16)");
  TORCH_CHECK(b1.defined() && b2.defined(), "fp8::linear_pair: both biases must be defined");
  const auto none = at::empty({0}, w1.options());
  auto y =
      Fp8LinearPairFunction::apply(x, w1, b1, w2, b2, none, none, 0.0, at::GradMode::is_enabled());
  return {y[0], y[1]};
}

namespace {
// The LayerNorm kernels take LayerNorm(x) with this weight and bias on x's GPU.
bool norm_applies(const at::Tensor& x, const at::Tensor& ln_w, const at::Tensor& ln_b) {
  return layer_norm_kernels_apply(x, ln_w, ln_b) && ln_w.device() == x.device() &&
         ln_b.device() == x.device();
}
}  // namespace

bool norm_linear_pair_applies(const at::Tensor& x, const at::Tensor& ln_w, const at::Tensor& ln_b,
                              const at::Tensor& w1, const at::Tensor& w2) {
  return linear_pair_applies(x, w1, w2) && norm_applies(x, ln_w, ln_b);
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_linear_pair(
    const at::Tensor& x, const at::Tensor& ln_w, const at::Tensor& ln_b, double eps,
    const at::Tensor& w1, const at::Tensor& b1, const at::Tensor& w2, const at::Tensor& b2) {
  TORCH_CHECK(norm_linear_pair_applies(x, ln_w, ln_b, w1, w2), "fp8::norm_linear_pair: x ",
              x.sizes(), " (", x.scalar_type(), "), the LayerNorm's weight ", ln_w.sizes(), ", w1 ",
              w1.sizes(), " and w2 ", w2.sizes(),
              " are not a LayerNorm the kernels take before fp8 products");
  TORCH_CHECK(b1.defined() && b2.defined(), "fp8::norm_linear_pair: both biases must be defined");
  auto y =
      Fp8LinearPairFunction::apply(x, w1, b1, w2, b2, ln_w, ln_b, eps, at::GradMode::is_enabled());
  return {y[0], y[1], y[2]};
}

bool gelu_mlp_applies(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& w2) {
  return applies(x, w1) && w2.defined() && w2.dim() == 2 && w2.device() == x.device() &&
         w2.size(1) == w1.size(0) && w2.size(0) % 16 == 0;
}

at::Tensor gelu_mlp(const at::Tensor& x, const at::Tensor& w1, const at::Tensor& b1,
                    const at::Tensor& w2, const at::Tensor& b2, const at::Tensor& residual,
                    bool keep_gelu) {
  TORCH_CHECK(gelu_mlp_applies(x, w1, w2), "fp8::gelu_mlp: x ", x.sizes(), ", w1 ", w1.sizes(),
              " and w2 ", w2.sizes(),
              " are not fp8 products (fp8 on, one GPU, widths multiples of 16)");
  TORCH_CHECK(b1.defined() && b2.defined(), "fp8::gelu_mlp: both biases must be defined");
  if (residual.defined()) {
    auto sizes = x.sizes().vec();
    sizes.back() = w2.size(0);
    TORCH_CHECK(residual.sizes() == at::IntArrayRef(sizes), "fp8::gelu_mlp: the residual ",
                residual.sizes(), " is not the output's shape ", at::IntArrayRef(sizes));
  }
  const auto none = at::empty({0}, w1.options());
  return Fp8GeluMlpFunction::apply(x, w1, b1, w2, b2, or_empty(residual, x), none, none, 0.0,
                                   at::GradMode::is_enabled(), keep_gelu);
}

bool norm_gelu_mlp_applies(const at::Tensor& x, const at::Tensor& ln_w, const at::Tensor& ln_b,
                           const at::Tensor& w1, const at::Tensor& w2) {
  return gelu_mlp_applies(x, w1, w2) && w2.size(0) == x.size(-1) && norm_applies(x, ln_w, ln_b);
}

at::Tensor norm_gelu_mlp(const at::Tensor& x, const at::Tensor& ln_w, const at::Tensor& ln_b,
                         double eps, const at::Tensor& w1, const at::Tensor& b1,
                         const at::Tensor& w2, const at::Tensor& b2, bool keep_gelu) {
  TORCH_CHECK(norm_gelu_mlp_applies(x, ln_w, ln_b, w1, w2), "fp8::norm_gelu_mlp: x ", x.sizes(),
              " (", x.scalar_type(), "), the LayerNorm's weight ", ln_w.sizes(), ", w1 ",
              w1.sizes(), " and w2 ", w2.sizes(),
              " are not a LayerNorm the kernels take before an fp8 MLP of x's width");
  TORCH_CHECK(b1.defined() && b2.defined(), "fp8::norm_gelu_mlp: both biases must be defined");
  const auto none = at::empty({0}, w1.options());
  return Fp8GeluMlpFunction::apply(x, w1, b1, w2, b2, none, ln_w, ln_b, eps,
                                   at::GradMode::is_enabled(), keep_gelu);
}

void update_scales() {
  auto& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  if (!r.on || !r.amax.defined() || r.first_slot.empty()) return;
  const c10::cuda::CUDAGuard guard(r.device);
  fk::update_scales(r.amax.data_ptr<float>(), r.history.data_ptr<float>(),
                    r.scale.data_ptr<float>(), r.scale_inv.data_ptr<float>(), kInvStride,
                    r.limit.data_ptr<float>(), static_cast<int64_t>(r.first_slot.size()) * kRoles,
                    r.recipe.history, r.recipe.margin, r.cursor.data_ptr<int64_t>(),
                    current_stream());
}

#else  // no fp8 GEMMs in this build

std::string unsupported(c10::Device device) {
  if (!device.is_cuda()) return "fp8 GEMMs need a CUDA GPU; this run is on " + device.str();
  return "this build has no fp8 GEMMs (it needs CUDA and LibTorch 2.1 or newer)";
}

bool applies(const at::Tensor&, const at::Tensor&) { return false; }

at::Tensor linear(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  TORCH_CHECK(false, "fp8::linear: ", unsupported(c10::Device(c10::kCPU)));
  return {};
}

bool linear_pair_applies(const at::Tensor&, const at::Tensor&, const at::Tensor&) { return false; }

std::pair<at::Tensor, at::Tensor> linear_pair(const at::Tensor&, const at::Tensor&,
                                              const at::Tensor&, const at::Tensor&,
                                              const at::Tensor&) {
  TORCH_CHECK(false, "fp8::linear_pair: ", unsupported(c10::Device(c10::kCPU)));
  return {};
}

bool gelu_mlp_applies(const at::Tensor&, const at::Tensor&, const at::Tensor&) { return false; }

at::Tensor gelu_mlp(const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                    const at::Tensor&, const at::Tensor&, bool) {
  TORCH_CHECK(false, "fp8::gelu_mlp: ", unsupported(c10::Device(c10::kCPU)));
  return {};
}

bool norm_linear_pair_applies(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                              const at::Tensor&, const at::Tensor&) {
  return false;
}

std::tuple<at::Tensor, at::Tensor, at::Tensor> norm_linear_pair(
    const at::Tensor&, const at::Tensor&, const at::Tensor&, double, const at::Tensor&,
    const at::Tensor&, const at::Tensor&, const at::Tensor&) {
  TORCH_CHECK(false, "fp8::norm_linear_pair: ", unsupported(c10::Device(c10::kCPU)));
  return {};
}

bool norm_gelu_mlp_applies(const at::Tensor&, const at::Tensor&, const at::Tensor&,
                           const at::Tensor&, const at::Tensor&) {
  return false;
}

at::Tensor norm_gelu_mlp(const at::Tensor&, const at::Tensor&, const at::Tensor&, double,
                         const at::Tensor&, const at::Tensor&, const at::Tensor&, const at::Tensor&,
                         bool) {
  TORCH_CHECK(false, "fp8::norm_gelu_mlp: ", unsupported(c10::Device(c10::kCPU)));
  return {};
}

void update_scales() {}

#endif

State state_of(const at::Tensor& weight) {
  auto& r = registry();
  const std::lock_guard<std::mutex> lock(r.mutex);
  const auto it = r.first_slot.find(key_of(weight));
  if (it == r.first_slot.end()) return {};
  const int64_t s = it->second;
  return {r.amax.narrow(0, s, kRoles).clone(), r.history.narrow(0, s, kRoles).clone(),
          r.scale.narrow(0, s, kRoles).clone()};
}

}  // namespace slipstream::aero::fp8
