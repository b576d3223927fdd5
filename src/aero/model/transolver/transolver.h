// Transolver (Wu et al., 2024) for irregular meshes, laid out as PhysicsNeMo
// lays it out, so that its state-dict names load unchanged
// (preprocess.layers.0.weight, blocks.3.Attn.in_project_slice.weight, ...).
//
// Input per point: embedding (coordinates 3 + SDF 1 + SDF normal 3) and
// functional values (free-stream velocity 3), concatenated [embedding, fx].
//   preprocess: Linear(E+F -> 2C), GELU, Linear(2C -> C)
//   each block: x = x + Attn(LN(x)); x = x + MLP(LN(x))
//   last block: then LN, Linear(C -> out_dim)
// Under bf16 autocast the LayerNorms run in bf16 (bf16_layer_norm below).
// Physics attention (per head of size D = C/H, G slices):
//   w = softmax(Ws(Wx x) / clamp(tau, 0.5, 5)) over slices     (B,N,H,G)
//   s = (w^T Wf x) / (sum_N w + eps)                           (B,H,G,D)
//   s' = SDPA(q, k, v) among the G slice tokens, q,k,v = Wqkv s
//   y = w s' (back to points), heads merged, Linear(C -> C)
// On CUDA the middle three lines run fused (fused_physics_attention.h).
// The volume configuration (C 256, H 8, G 256, 12 layers, out 5) has
// 8,964,709 parameters.
#pragma once

#include "aero/model/layers.h"
#include "aero/model/model.h"
#include "aero/model/physics_attention.h"
#include "aero/model/transolver/options.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/activation.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <string>
#include <vector>

namespace slipstream::aero {

class PhysicsAttentionImpl : public torch::nn::Module {
 public:
  explicit PhysicsAttentionImpl(const TransolverOptions& o);
  // The attention of x, plus residual where defined (added in out_linear's
  // GEMM where linear_residual, linear.h, can).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& residual = {});
  // The same of an AttentionInput (layers.h): with its LayerNorm, the
  // attention of LayerNorm(x) plus x.
  torch::Tensor forward(const AttentionInput& in);
  // The slice weights (B, N, H, G), for tests and tools.
  torch::Tensor slice_weights(const torch::Tensor& x_mid);
  // Whether forward(x) takes the fused path for this x_mid.
  bool uses_fused(const torch::Tensor& x_mid) const;

  // forward(x) over all N points in chunks, in two passes: accumulate()
  // adds a chunk's slice sums (norm (B, H, G), token (B, H, G, D), fp32),
  // slice_outputs() turns the totals into the attended slice tokens, and
  // apply() gives a chunk's output from them. Plain LibTorch, no grad.
  void accumulate(const torch::Tensor& x, torch::Tensor& norm, torch::Tensor& token);
  torch::Tensor slice_outputs(const torch::Tensor& norm, const torch::Tensor& token);
  torch::Tensor apply(const torch::Tensor& x, const torch::Tensor& out_slice);

  // This layer's slicing (physics_attention.h), in Transolver's form.
  SliceProjection projection() const;

  int64_t heads, dim_head, slices;
  double eps;
  bool fused;
  // Set by TransolverImpl::set_domain_group: the slice statistics are summed
  // over this group (domain_parallel.h), on the plain path.
  Communicator* domain_group = nullptr;
  torch::Tensor temperature;
  torch::nn::Linear in_project_x{nullptr}, in_project_fx{nullptr}, in_project_slice{nullptr},
      qkv_project{nullptr}, out_linear{nullptr};
};
TORCH_MODULE(PhysicsAttention);

class TransolverBlockImpl : public torch::nn::Module {
 public:
  TransolverBlockImpl(const TransolverOptions& o, bool last);
  // x + Attn(LN(x)), then x + MLP(LN(x)) (the last block: its head), keeping
  // for the backward what `recompute` says.
  torch::Tensor forward(const torch::Tensor& x);
  RecomputeOptions recompute_options;
  // forward over x (B, N, C) in chunks of `chunk` points: x is updated in
  // place; the last block returns its output (B, N, out_dim).
  torch::Tensor forward_in_chunks(torch::Tensor& x, int64_t chunk);

  bool bf16_layer_norm;
  torch::nn::LayerNorm ln_1{nullptr};
  PhysicsAttention Attn{nullptr};
  torch::nn::Sequential ln_mlp1{nullptr};
  torch::nn::Sequential ln_mlp2{nullptr};  // last block only

 private:
  // The two sub-blocks, as recompute() runs them.
  struct AttentionPart : Recomputable {
    explicit AttentionPart(TransolverBlockImpl* b) : block(b) {}
    TransolverBlockImpl* block;
    torch::Tensor run(const torch::Tensor& x) override;
  };
  struct MlpPart : Recomputable {  // pointwise
    explicit MlpPart(TransolverBlockImpl* b) : block(b) {}
    TransolverBlockImpl* block;
    torch::Tensor run(const torch::Tensor& x) override;
  };
  AttentionPart attention_part_{this};
  MlpPart mlp_part_{this};
};
TORCH_MODULE(TransolverBlock);

// Inputs: "embedding" (B, N, E) and "fx" (B, N, F).
class TransolverImpl : public Model {
 public:
  explicit TransolverImpl(TransolverOptions o);
  // embedding (B, N, E), fx (B, N, F) -> (B, N, out_dim)
  torch::Tensor forward(const torch::Tensor& embedding, const torch::Tensor& fx);
  torch::Tensor forward(const ModelInputs& inputs) override;
  std::vector<std::string> input_names() const override { return {"embedding", "fx"}; }
  std::string class_name() const override { return "Transolver"; }
  std::string physicsnemo_module() const override {
    return "physicsnemo.models.transolver.transolver";
  }
  nlohmann::json physicsnemo_args() const override;
  bool exact_in_chunks() const override { return true; }
  void set_recompute(const RecomputeOptions& options) override;
  void set_domain_group(Communicator* group) override;
  torch::Tensor forward_in_chunks(const ModelInputs& inputs, int64_t chunk) override;
  // physics_attention: "fused CUDA kernels" or "plain LibTorch"; layer_norm:
  // "bf16" or "fp32".
  nlohmann::json numerics(c10::Device device, bool bf16) const override;
  // Truncated-normal(std 0.02) Linear weights, zero biases, LayerNorm 1/0,
  // temperatures 0.5.
  void reset_parameters();
  const TransolverOptions& options() const { return options_; }

  Mlp preprocess{nullptr};
  torch::nn::ModuleList blocks{nullptr};

 private:
  struct Preprocess : Recomputable {  // pointwise
    explicit Preprocess(TransolverImpl* m) : model(m) {}
    TransolverImpl* model;
    torch::Tensor run(const torch::Tensor& x) override { return model->preprocess->forward(x); }
  };
  TransolverOptions options_;
  RecomputeOptions recompute_;
  Preprocess preprocess_part_{this};
};
TORCH_MODULE(Transolver);

}  // namespace slipstream::aero
