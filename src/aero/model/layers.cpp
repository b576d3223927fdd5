#include "aero/model/layers.h"

#include "aero/ops/fused_layer_norm.h"
#include "aero/ops/linear.h"
#include "aero/ops/numerics.h"

#include <torch/torch.h>

#include <cmath>

namespace slipstream::aero {

void trunc_normal_(const torch::Tensor& t, double std, double a, double b) {
  torch::NoGradGuard no_grad;
  auto cdf = [](double x) { return 0.5 * (1.0 + std::erf(x / std::sqrt(2.0))); };
  const double lo = cdf(a / std), hi = cdf(b / std);
  t.uniform_(2 * lo - 1, 2 * hi - 1);
  t.erfinv_();
  t.mul_(std * std::sqrt(2.0));
  t.clamp_(a, b);
}

MlpImpl::MlpImpl(int64_t in, int64_t hidden, int64_t out)
    : MlpImpl(in, std::vector<int64_t>{hidden}, out) {}

MlpImpl::MlpImpl(int64_t in, const std::vector<int64_t>& hidden, int64_t out) {
  torch::nn::Sequential seq;
  int64_t width = in;
  for (int64_t h : hidden) {
    seq->push_back(torch::nn::Linear(width, h));
    seq->push_back(torch::nn::GELU());
    width = h;
  }
  seq->push_back(torch::nn::Linear(width, out));
  layers = register_module("layers", seq);
}

// aero::linear (linear.h) rather than the C++ frontend's Linear::forward:
// for inputs of more than two dimensions the latter runs matmul and then
// `out += bias`, which under autocast adds an fp32 bias into a bf16 output
// through a slow mixed-dtype kernel.
torch::Tensor linear(const torch::nn::LinearImpl& l, const torch::Tensor& x) {
  return aero::linear(x, l.weight, l.bias);
}

std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> project_attention_input(
    const AttentionInput& in, const torch::Tensor& w1, const torch::Tensor& b1,
    const torch::Tensor& w2, const torch::Tensor& b2) {
  if (in.norm == nullptr) {
    auto [y1, y2] = attention_inputs_pair(autocast_input(in.x), w1, b1, w2, b2);
    return {y1, y2, in.residual};
  }
  const auto& ln = *in.norm;
  if (in.bf16_layer_norm) {
    const fp8::Scope scope(fp8::Part::kAttentionInputs);
    if (fp8::norm_linear_pair_applies(in.x, ln.weight, ln.bias, w1, w2)) {
      return fp8::norm_linear_pair(in.x, ln.weight, ln.bias, ln.options.eps(), w1, b1, w2, b2);
    }
  }
  const auto [norm, residual] = layer_norm_residual(ln, in.x, in.bf16_layer_norm);
  auto [y1, y2] = attention_inputs_pair(autocast_input(norm), w1, b1, w2, b2);
  return {y1, y2, residual};
}

torch::Tensor layer_norm(const torch::nn::LayerNormImpl& ln, const torch::Tensor& x,
                         bool bf16_layer_norm) {
  const auto& o = ln.options;
  if (bf16_layer_norm)
    return fused_layer_norm(x, o.normalized_shape(), ln.weight, ln.bias, o.eps());
  return torch::layer_norm(x, o.normalized_shape(), ln.weight, ln.bias, o.eps());
}

std::pair<torch::Tensor, torch::Tensor> layer_norm_residual(const torch::nn::LayerNormImpl& ln,
                                                            const torch::Tensor& x,
                                                            bool bf16_layer_norm) {
  const auto& o = ln.options;
  if (bf16_layer_norm) {
    return fused_layer_norm_residual(x, o.normalized_shape(), ln.weight, ln.bias, o.eps());
  }
  return {torch::layer_norm(x, o.normalized_shape(), ln.weight, ln.bias, o.eps()), x};
}

torch::Tensor MlpImpl::forward(const torch::Tensor& x) { return forward_plus(x, {}); }

torch::Tensor MlpImpl::forward_plus(const torch::Tensor& x, const torch::Tensor& residual) {
  const fp8::Scope scope(part);
  if (layers->size() == 3) {  // Linear, GELU, Linear: one function
    const auto& l1 = *layers[0]->as<torch::nn::Linear>();
    const auto& l2 = *layers[2]->as<torch::nn::Linear>();
    if (l1.bias.defined() && l2.bias.defined()) {
      return gelu_mlp(x, l1.weight, l1.bias, l2.weight, l2.bias, residual,
                      keep_gelu || !recompute_gelu);
    }
  }
  const size_t last = layers->size() - 1;
  const auto& l0 = *layers[0]->as<torch::nn::Linear>();
  torch::Tensor y =
      aero::linear_residual(x, l0.weight, l0.bias, last == 0 ? residual : torch::Tensor());
  for (size_t i = 2; i < layers->size(); i += 2) {
    const auto& l = *layers[i]->as<torch::nn::Linear>();
    if (recompute_gelu) {
      y = gelu_linear(y, l.weight, l.bias);
      if (i == last && residual.defined()) y = y + residual;
    } else {
      y = aero::linear_residual(torch::gelu(y), l.weight, l.bias,
                                i == last ? residual : torch::Tensor());
    }
  }
  return y;
}

torch::Tensor MlpImpl::forward_normed(const torch::nn::LayerNormImpl& ln, const torch::Tensor& x,
                                      bool bf16_layer_norm) {
  if (bf16_layer_norm && layers->size() == 3) {
    const fp8::Scope scope(part);
    const auto& l1 = *layers[0]->as<torch::nn::Linear>();
    const auto& l2 = *layers[2]->as<torch::nn::Linear>();
    if (l1.bias.defined() && l2.bias.defined() &&
        fp8::norm_gelu_mlp_applies(x, ln.weight, ln.bias, l1.weight, l2.weight)) {
      return fp8::norm_gelu_mlp(x, ln.weight, ln.bias, ln.options.eps(), l1.weight, l1.bias,
                                l2.weight, l2.bias, keep_gelu || !recompute_gelu);
    }
  }
  const auto [norm, residual] = layer_norm_residual(ln, x, bf16_layer_norm);
  return forward_plus(norm, residual);
}

void set_mlp_recompute_gelu(torch::nn::Module& root, bool on) {
  for (auto& m : root.modules(/*include_self=*/false)) {
    if (auto* mlp = m->as<Mlp>()) mlp->recompute_gelu = on;
  }
}

torch::Tensor attention_input(const torch::nn::LinearImpl& l, const torch::Tensor& x) {
  const fp8::Scope scope(fp8::Part::kAttentionInputs);
  return linear(l, x);
}

std::pair<torch::Tensor, torch::Tensor> attention_inputs_pair(const torch::Tensor& x,
                                                              const torch::Tensor& w1,
                                                              const torch::Tensor& b1,
                                                              const torch::Tensor& w2,
                                                              const torch::Tensor& b2) {
  const fp8::Scope scope(fp8::Part::kAttentionInputs);
  return linear_pair(x, w1, b1, w2, b2);
}

}  // namespace slipstream::aero
