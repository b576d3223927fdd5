#include "aero/model/fused_physics_attention.h"

#include "aero/model/numerics.h"

#include <torch/autograd.h>
#include <torch/torch.h>
#include <torch/version.h>

#include <cmath>

#include "aero/model/slice_ops.h"

namespace slipstream::aero {
namespace {

using torch::autograd::AutogradContext;
using torch::autograd::variable_list;

constexpr double kTauMin = 0.5, kTauMax = 5.0;

slice_ops::Weights weights_of(const at::Tensor& x_mid, AutogradContext* ctx) {
  return {x_mid, ctx->saved_data["ws"].toTensor(), ctx->saved_data["bias"].toTensor(),
          ctx->saved_data["tau"].toTensor()};
}

class SliceAttentionFunction : public torch::autograd::Function<SliceAttentionFunction> {
 public:
  static at::Tensor forward(AutogradContext* ctx, const at::Tensor& x_mid, const at::Tensor& fx_mid,
                            const at::Tensor& slice_weight, const at::Tensor& slice_bias,
                            const at::Tensor& temperature, const at::Tensor& qkv_weight,
                            double eps) {
    const slice_ops::Weights in{
        x_mid, slice_weight.detach(), slice_bias.detach(),
        temperature.detach().clamp(kTauMin, kTauMax).reshape({-1}).to(at::kFloat)};
    auto first = slice_ops::reduce_first(in, fx_mid);
    const auto denom = first.colsum + eps;
    const auto tokens = first.sums / denom.unsqueeze(-1);
    // The attention among slices is small (B x H x G x D); it keeps its own
    // autograd graph, which the backward differentiates.
    at::Tensor token_leaf, qkv_leaf, attended;
    {
      const torch::AutoGradMode grad_on(true);
      token_leaf = tokens.detach().requires_grad_(true);
      qkv_leaf = qkv_weight.detach().requires_grad_(true);
      attended = slice_token_attention(token_leaf, qkv_leaf);
    }
    auto out = slice_ops::expand(in, first.lse, attended.detach());

    ctx->save_for_backward({x_mid, fx_mid, temperature});
    ctx->saved_data["ws"] = in.ws;
    ctx->saved_data["bias"] = in.bias;
    ctx->saved_data["tau"] = in.tau;
    ctx->saved_data["lse"] = first.lse;
    ctx->saved_data["denom"] = denom;
    ctx->saved_data["tokens"] = tokens;
    ctx->saved_data["token_leaf"] = token_leaf;
    ctx->saved_data["qkv_leaf"] = qkv_leaf;
    ctx->saved_data["attended"] = attended;
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
    const auto attended = ctx->saved_data["attended"].toTensor();
    const auto gout = grads[0].contiguous();

    // Through the deslice to the attention's output, then through the
    // attention to the slice tokens and Wqkv.
    const auto grad_attended = slice_ops::reduce(in, lse, gout);
    const auto token_grads = torch::autograd::grad(
        {attended},
        {ctx->saved_data["token_leaf"].toTensor(), ctx->saved_data["qkv_leaf"].toTensor()},
        {grad_attended.to(attended.scalar_type())});
    const auto& grad_tokens = token_grads[0];
    // tokens = S / (sum_n w + eps), S = sum_n w fx.
    const auto grad_sums = grad_tokens / denom.unsqueeze(-1);
    const auto grad_norm = -(grad_tokens * tokens).sum(-1) / denom;
    auto r = slice_ops::backward(in, lse, fx_mid, gout, attended.detach(), grad_sums, grad_norm);

    // z = logits / tau: dL/dtau = -sum(dL/dz * z) / tau, where the clamp
    // passes it (bounds included, as torch.clamp's gradient does).
    const auto inside = temperature.ge(kTauMin).logical_and(temperature.le(kTauMax));
    const auto grad_tau =
        (-r.tau_acc / in.tau).view(temperature.sizes()).to(temperature.scalar_type()) *
        inside.to(temperature.scalar_type());
    return {r.grad_x,
            r.grad_fx,
            r.grad_ws.to(in.ws.scalar_type()),
            r.grad_bias.to(in.bias.scalar_type()),
            grad_tau,
            token_grads[1],
            at::Tensor()};
  }
};

}  // namespace

at::Tensor slice_token_attention(const at::Tensor& tokens, const at::Tensor& qkv_weight) {
  auto qkv = torch::linear(tokens, qkv_weight).chunk(3, -1);
  return dot_product_attention(qkv[0], qkv[1], qkv[2]);
}

at::Tensor fused_physics_attention(const at::Tensor& x_mid, const at::Tensor& fx_mid,
                                   const SliceAttentionParams& p) {
  TORCH_CHECK(x_mid.sizes() == fx_mid.sizes(), "fused physics attention: x_mid ", x_mid.sizes(),
              " and fx_mid ", fx_mid.sizes(), " differ");
  return SliceAttentionFunction::apply(x_mid, fx_mid, p.slice_weight, p.slice_bias, p.temperature,
                                       p.qkv_weight, p.eps);
}

}  // namespace slipstream::aero
