#include "aero/model/layers.h"

#include "aero/ops/fused_layer_norm.h"
#include "aero/ops/linear.h"

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
