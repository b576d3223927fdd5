// The layers every model family here builds from: PhysicsNeMo's MLP, and
// the two ways a Linear and a LayerNorm are applied (aero::linear's one
// autograd function with the bias in the GEMM; LayerNorm in bf16 under
// autocast, fused_layer_norm.h).
#pragma once

#include "aero/ops/fp8_linear.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <algorithm>
#include <cstdint>
#include <tuple>
#include <utility>
#include <vector>

namespace slipstream::aero {

// Linear, GELU, Linear (or more hidden layers, each followed by GELU),
// registered as "layers" (PhysicsNeMo's MLP: layers.0, layers.2, ...).
class MlpImpl : public torch::nn::Module {
 public:
  MlpImpl(int64_t in, int64_t hidden, int64_t out);
  MlpImpl(int64_t in, const std::vector<int64_t>& hidden, int64_t out);
  torch::Tensor forward(const torch::Tensor& x);
  // forward(x) + residual, the add in the last Linear's GEMM where
  // linear_residual (linear.h) can (residual undefined: forward(x)).
  torch::Tensor forward_plus(const torch::Tensor& x, const torch::Tensor& residual);
  // forward_plus(layer_norm(ln, x), x): a residual block's MLP on its own
  // input. Under precision: fp8 with bf16_layer_norm, on the LayerNorm
  // kernels' path, one function (fp8::norm_gelu_mlp: LayerNorm(x) written
  // only in fp8); else layer_norm_residual then forward_plus.
  torch::Tensor forward_normed(const torch::nn::LayerNormImpl& ln, const torch::Tensor& x,
                               bool bf16_layer_norm);
  torch::nn::Sequential layers{nullptr};
  // The one-hidden-layer form (Linear, GELU, Linear) runs as one function
  // (linear.h's gelu_mlp: the residual in the last GEMM, the first bias's
  // gradient in the GELU backward's pass), keeping x and h, and gelu(h)
  // unless recompute_gelu. Longer MLPs run layer by layer, each GELU with
  // the Linear after it where recompute_gelu (gelu_linear). recompute_gelu:
  // the hidden layers are kept for the backward once, before their GELU,
  // which the backward recomputes (under precision: fp8, gelu(h)'s e4m3
  // copy for w2's gradient is not kept but cast again from h). The same
  // values either way.
  bool recompute_gelu = false;
  // With recompute_gelu, on the one-hidden-layer form: gelu(h) is kept for
  // the backward too (gelu_mlp's keep_gelu), one more hidden layer of memory
  // for one pass less over it.
  bool keep_gelu = false;
  // Which part of the model this MLP is, for precision: fp8's
  // numerics.fp8_exclude (the input embeddings say kEmbedding).
  fp8::Part part = fp8::Part::kBlocks;
};
TORCH_MODULE(Mlp);

// Sets recompute_gelu on every Mlp under `root`.
void set_mlp_recompute_gelu(torch::nn::Module& root, bool on);

// A Linear layer through aero::linear (one autograd function, the bias in
// the GEMM), and a LayerNorm in bf16 under autocast when `bf16_layer_norm`
// (fused_layer_norm.h): the two ways every model here applies them.
torch::Tensor linear(const torch::nn::LinearImpl& l, const torch::Tensor& x);
// linear() and linear_pair() for an attention block's input projections
// (in_project_x, in_project_fx), marked as fp8::Part::kAttentionInputs.
torch::Tensor attention_input(const torch::nn::LinearImpl& l, const torch::Tensor& x);
std::pair<torch::Tensor, torch::Tensor> attention_inputs_pair(const torch::Tensor& x,
                                                              const torch::Tensor& w1,
                                                              const torch::Tensor& b1,
                                                              const torch::Tensor& w2,
                                                              const torch::Tensor& b2);
// An attention block's input: x, projected as it is, `residual` added to
// the block's output; or, with `norm` (the block's ln_1), LayerNorm(x)
// projected and x itself the residual.
struct AttentionInput {
  torch::Tensor x, residual;
  const torch::nn::LayerNormImpl* norm = nullptr;
  bool bf16_layer_norm = true;
};
// {in's two input projections (in_project_x's and in_project_fx's weights
// and biases) as attention_inputs_pair makes them, the residual}. With a
// LayerNorm under precision: fp8 with bf16_layer_norm, on the LayerNorm
// kernels' path, one function (fp8::norm_linear_pair: LayerNorm(x) written
// only in fp8); else layer_norm_residual, then attention_inputs_pair of its
// output (autocast_input).
std::tuple<torch::Tensor, torch::Tensor, torch::Tensor> project_attention_input(
    const AttentionInput& in, const torch::Tensor& w1, const torch::Tensor& b1,
    const torch::Tensor& w2, const torch::Tensor& b2);
torch::Tensor layer_norm(const torch::nn::LayerNormImpl& ln, const torch::Tensor& x,
                         bool bf16_layer_norm);
// {layer_norm(ln, x), r} with r equal to x, for a block that adds x back
// (fused_layer_norm_residual: in bf16, the two gradients meet in one kernel).
std::pair<torch::Tensor, torch::Tensor> layer_norm_residual(const torch::nn::LayerNormImpl& ln,
                                                            const torch::Tensor& x,
                                                            bool bf16_layer_norm);

// Fills `t` from a normal(0, std) truncated to [a, b] (absolute bounds), by
// the inverse CDF, as torch.nn.init.trunc_normal_ does.
void trunc_normal_(const torch::Tensor& t, double std, double a = -2.0, double b = 2.0);

// Calls f(begin, length) for the chunks of n points (chunked inference).
template <typename F>
void for_chunks(int64_t n, int64_t chunk, F&& f) {
  for (int64_t s = 0; s < n; s += chunk) f(s, std::min(chunk, n - s));
}

}  // namespace slipstream::aero
