#include "aero/ops/fused_physics_attention.h"

#include "aero/ops/fp8_linear.h"
#include "aero/ops/numerics.h"

#include <torch/autograd.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <cmath>
#include <memory>
#include <vector>

#include "aero/ops/slice_ops.h"

namespace slipstream::aero {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kTauMin = 0.5, kTauMax = 5.0;

slice_ops::Weights weights_of(const at::Tensor& x_mid, AutogradContext* ctx) {
  return {x_mid, ctx->saved_data["ws"].toTensor(), ctx->saved_data["bias"].toTensor(),
          ctx->saved_data["tau"].toTensor()};
}

// The forward's slice weights (detached, the temperature clamped), also
// kept in ctx for the backward.
slice_ops::Weights save_weights(AutogradContext* ctx, const at::Tensor& x_mid,
                                const at::Tensor& slice_weight, const at::Tensor& slice_bias,
                                const at::Tensor& temperature) {
  slice_ops::Weights in{x_mid, slice_weight.detach(), slice_bias.detach(),
                        temperature.detach().clamp(kTauMin, kTauMax).reshape({-1}).to(at::kFloat)};
  ctx->saved_data["ws"] = in.ws;
  ctx->saved_data["bias"] = in.bias;
  ctx->saved_data["tau"] = in.tau;
  return in;
}

// The forward's slicing, shared by both functions: the slice tokens (B, H,
// G, D) fp32 of x_mid, fx_mid; ctx keeps x_mid, fx_mid, the temperature,
// the slice weights, the per-point lse, the normaliser and the tokens.
struct Sliced {
  slice_ops::Weights in;
  at::Tensor lse, tokens;
};

Sliced slice_and_save(AutogradContext* ctx, const at::Tensor& x_mid, const at::Tensor& fx_mid,
                      const at::Tensor& slice_weight, const at::Tensor& slice_bias,
                      const at::Tensor& temperature, double eps) {
  const auto in = save_weights(ctx, x_mid, slice_weight, slice_bias, temperature);
  auto first = slice_ops::reduce_first(in, fx_mid);
  const auto denom = first.colsum + eps;
  auto tokens = first.sums / denom.unsqueeze(-1);
  ctx->save_for_backward({x_mid, fx_mid, temperature});
  ctx->saved_data["lse"] = first.lse;
  ctx->saved_data["denom"] = denom;
  ctx->saved_data["tokens"] = tokens;
  return {in, first.lse, tokens};
}

// Through tokens = S / (sum_n w + eps), S = sum_n w fx, to the gradients of
// S, gs = g / denom, and of sum_n w, gnorm = -(g . tokens) / denom = -(gs .
// tokens). The backward forms dL/dw[n] = fx[n] gs + gnorm = gs (fx[n] -
// tokens): the two terms nearly cancel, and do so in bf16 on the kernels'
// path only if gnorm is made of the same bf16-rounded gs the kernels read.
std::pair<at::Tensor, at::Tensor> token_grads(const slice_ops::Weights& in,
                                              const at::Tensor& grad_tokens,
                                              const at::Tensor& tokens, const at::Tensor& denom) {
  auto gs = grad_tokens / denom.unsqueeze(-1);
  if (slice_ops::kernels_apply(in.x, in.ws.size(0))) gs = gs.to(at::kBFloat16).to(gs.scalar_type());
  auto gnorm = -(gs * tokens).sum(-1);
  return {gs, gnorm};
}

// The slice weights' gradients as the function returns them: x_mid,
// fx_mid, in_project_slice weight and bias, and the temperature. z =
// logits / tau: dL/dtau = -sum(dL/dz * z) / tau, where the clamp passes it
// (bounds included, as torch.clamp's gradient does).
variable_list slice_weight_grads(const slice_ops::BackwardResult& r, const slice_ops::Weights& in,
                                 const at::Tensor& temperature) {
  const auto inside = temperature.ge(kTauMin).logical_and(temperature.le(kTauMax));
  const auto grad_tau =
      (-r.tau_acc / in.tau).view(temperature.sizes()).to(temperature.scalar_type()) *
      inside.to(temperature.scalar_type());
  return {r.grad_x, r.grad_fx, r.grad_ws.to(in.ws.scalar_type()),
          r.grad_bias.to(in.bias.scalar_type()), grad_tau};
}

// The slice tokens alone (a context projector): x_mid, fx_mid -> (B, H, G,
// D) fp32, keeping x_mid, fx_mid and the per-point lse.
class SliceTokensFunction : public torch::autograd::Function<SliceTokensFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_mid, const at::Tensor& fx_mid,
                            const at::Tensor& slice_weight, const at::Tensor& slice_bias,
                            const at::Tensor& temperature, double eps) {
    return slice_and_save(ctx, x_mid, fx_mid, slice_weight, slice_bias, temperature, eps).tokens;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x_mid = saved[0];
    const auto& fx_mid = saved[1];
    const auto in = weights_of(x_mid, ctx);
    const auto tokens = ctx->saved_data["tokens"].toTensor();
    const auto [grad_sums, grad_norm] =
        token_grads(in, grads[0], tokens, ctx->saved_data["denom"].toTensor());
    // No deslice here: its term of dL/dw (gout os^T) is absent.
    const auto r = slice_ops::backward(in, ctx->saved_data["lse"].toTensor(), fx_mid, at::Tensor(),
                                       at::Tensor(), grad_sums, grad_norm);
    auto out = slice_weight_grads(r, in, saved[2]);
    out.emplace_back();  // eps
    return out;
  }
};

class SliceMixFunction : public torch::autograd::Function<SliceMixFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_mid, const at::Tensor& fx_mid,
                            const at::Tensor& slice_weight, const at::Tensor& slice_bias,
                            const at::Tensor& temperature, at::TensorList leaves, double eps,
                            const TokenMixer* mix) {
    const auto sliced =
        slice_and_save(ctx, x_mid, fx_mid, slice_weight, slice_bias, temperature, eps);
    const auto& in = sliced.in;
    // The mix among slices is small (B x H x G x D); it keeps its own
    // autograd graph, which the backward differentiates.
    at::Tensor token_leaf, mixed;
    std::vector<at::Tensor> leaf_copies;
    {
      const torch::AutoGradMode grad_on(true);
      token_leaf = sliced.tokens.detach().requires_grad_(true);
      // Under precision: fp8, a copy taken as a Linear's weight keeps its
      // leaf's scaling state (a new copy each call, the same state each step).
      std::vector<std::unique_ptr<fp8::KeyAs>> keys;
      for (const auto& leaf : leaves) {
        leaf_copies.push_back(leaf.detach().requires_grad_(true));
        keys.push_back(std::make_unique<fp8::KeyAs>(leaf_copies.back(), leaf));
      }
      mixed = (*mix)(token_leaf, leaf_copies);
    }
    auto out = slice_ops::expand(in, sliced.lse, mixed.detach());
    ctx->saved_data["token_leaf"] = token_leaf;
    ctx->saved_data["leaves"] = leaf_copies;
    ctx->saved_data["mixed"] = mixed;
    return out;
  }

  static variable_list backward(AutogradContext* ctx, variable_list grads) {
    const auto saved = ctx->get_saved_variables();
    const auto& x_mid = saved[0];
    const auto& fx_mid = saved[1];
    const auto& temperature = saved[2];
    const auto in = weights_of(x_mid, ctx);
    const auto lse = ctx->saved_data["lse"].toTensor();
    const auto denom = ctx->saved_data["denom"].toTensor();
    const auto tokens = ctx->saved_data["tokens"].toTensor();
    const auto mixed = ctx->saved_data["mixed"].toTensor();
    const auto leaves = ctx->saved_data["leaves"].toTensorVector();
    const auto gout = grads[0].contiguous();

    // Through the deslice to the mix's output, then through the mix to the
    // slice tokens and the leaves.
    const auto grad_mixed = slice_ops::reduce(in, lse, gout);
    variable_list inputs{ctx->saved_data["token_leaf"].toTensor()};
    inputs.insert(inputs.end(), leaves.begin(), leaves.end());
    const auto mix_grads =
        torch::autograd::grad({mixed}, inputs, {grad_mixed.to(mixed.scalar_type())},
                              /*retain_graph=*/c10::nullopt, /*create_graph=*/false,
                              /*allow_unused=*/true);
    const auto [grad_sums, grad_norm] = token_grads(in, mix_grads[0], tokens, denom);
    const auto r = slice_ops::backward(in, lse, fx_mid, gout, mixed.detach(), grad_sums, grad_norm);
    auto out = slice_weight_grads(r, in, temperature);
    out.insert(out.end(), mix_grads.begin() + 1, mix_grads.end());
    out.emplace_back();  // eps
    out.emplace_back();  // mix
    return out;
  }
};

}  // namespace

at::Tensor slice_token_attention(const at::Tensor& tokens, const at::Tensor& qkv_weight) {
  auto qkv = torch::linear(tokens, qkv_weight).chunk(3, -1);
  return dot_product_attention(qkv[0], qkv[1], qkv[2]);
}

at::Tensor fused_slice_mix(const at::Tensor& x_mid, const at::Tensor& fx_mid, const SliceParams& p,
                           const TokenMixer& mix, const std::vector<at::Tensor>& leaves) {
  TORCH_CHECK(x_mid.sizes() == fx_mid.sizes(), "fused slice attention: x_mid ", x_mid.sizes(),
              " and fx_mid ", fx_mid.sizes(), " differ");
  for (size_t i = 0; i < leaves.size(); ++i) {
    TORCH_CHECK(leaves[i].defined(), "fused slice attention: leaf ", i, " is undefined");
  }
  return SliceMixFunction::apply(x_mid, fx_mid, p.slice_weight, p.slice_bias, p.temperature,
                                 at::TensorList(leaves), p.eps, &mix);
}

at::Tensor fused_slice_tokens(const at::Tensor& x_mid, const at::Tensor& fx_mid,
                              const SliceParams& p) {
  TORCH_CHECK(x_mid.sizes() == fx_mid.sizes(), "fused slice tokens: x_mid ", x_mid.sizes(),
              " and fx_mid ", fx_mid.sizes(), " differ");
  return SliceTokensFunction::apply(x_mid, fx_mid, p.slice_weight, p.slice_bias, p.temperature,
                                    p.eps);
}

at::Tensor fused_physics_attention(const at::Tensor& x_mid, const at::Tensor& fx_mid,
                                   const SliceAttentionParams& p) {
  static const TokenMixer attention = [](const at::Tensor& tokens,
                                         const std::vector<at::Tensor>& leaves) {
    return slice_token_attention(tokens, leaves[0]);
  };
  return fused_slice_mix(x_mid, fx_mid, {p.slice_weight, p.slice_bias, p.temperature, p.eps},
                         attention, {p.qkv_weight});
}

}  // namespace slipstream::aero
