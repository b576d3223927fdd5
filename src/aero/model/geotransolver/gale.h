// GeoTransolver's attention (see geotransolver.h): GALE, physics
// attention whose slice tokens also attend to the context, and its block.
#pragma once

#include "aero/model/geotransolver/options.h"
#include "aero/model/physics_attention.h"
#include "aero/ops/recompute.h"
#include "core/distributed/communicator.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <cstdint>
#include <string>
#include <vector>

namespace slipstream::aero {

// GALE. On CUDA under bf16 autocast (fused_attention on) the slice ->
// self/cross-attention -> deslice runs as one fused_slice_mix
// (fused_physics_attention.h), each head padded with zeros to the kernels'
// head size (slice_ops::kernel_dim: the volume config's 56 runs as it is;
// 40 or 48 would run at 56) through zero-padded
// copies of the projection weights, so no activation is copied to pad it;
// the plain path below is the reference. force_fused takes the fused path
// on any device (on the CPU its ATen decomposition): for tests.
class GaleAttentionImpl : public torch::nn::Module {
 public:
  GaleAttentionImpl(int64_t dim, int64_t heads, int64_t slices, int64_t context_dim,
                    const std::string& state_mixing_mode, bool fused_attention = true);
  // The attention of x, plus residual where defined (added in out_linear's
  // GEMM where linear_residual, linear.h, can).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& context,
                        const torch::Tensor& residual = {});
  // The same of an AttentionInput (layers.h): with its LayerNorm, the
  // attention of LayerNorm(x) plus x.
  torch::Tensor forward(const AttentionInput& in, const torch::Tensor& context);
  // Whether forward takes the fused path for this (autocast-cast) input.
  bool uses_fused(const torch::Tensor& x) const;
  // forward over all points in chunks, in two passes (plain LibTorch, no
  // grad), as PhysicsAttentionImpl's: accumulate a chunk's slice sums, mix
  // the totals' tokens with the context, apply the mix to each chunk.
  void accumulate(const torch::Tensor& x, torch::Tensor& norm, torch::Tensor& token);
  torch::Tensor slice_outputs(const torch::Tensor& norm, const torch::Tensor& token,
                              const torch::Tensor& context);
  torch::Tensor apply(const torch::Tensor& x, const torch::Tensor& mixed);

  // The slicing (physics_attention.h), in GALE's form.
  SliceProjection projection() const;

  int64_t heads, dim_head, slices;
  bool weighted, fused, force_fused = false;
  Communicator* domain_group = nullptr;  // as ContextProjectorImpl's
  torch::Tensor temperature, state_mixing;
  torch::nn::Linear in_project_slice{nullptr}, qkv_project{nullptr}, out_linear{nullptr},
      in_project_x{nullptr}, in_project_fx{nullptr}, cross_q{nullptr}, cross_k{nullptr},
      cross_v{nullptr};
  torch::nn::Sequential concat_project{nullptr};

 private:
  torch::Tensor forward_fused(const AttentionInput& in, const torch::Tensor& context);
  torch::Tensor mix_with_parameters(const torch::Tensor& tokens, const torch::Tensor& context);
  // w (B, N, H, S) and the mixed tokens back to the points, out_linear.
  torch::Tensor deslice(const torch::Tensor& w, const torch::Tensor& mixed,
                        const torch::Tensor& residual = {});
  // The self- and cross-attention among the slice tokens and their mix.
  torch::Tensor mix_tokens(const torch::Tensor& tokens, const torch::Tensor& context,
                           const torch::Tensor& qkv_weight, const std::vector<torch::Tensor>& cross,
                           const std::vector<torch::Tensor>& mixing) const;
};
TORCH_MODULE(GaleAttention);

class GaleBlockImpl : public torch::nn::Module {
 public:
  GaleBlockImpl(int64_t width, const GeoTransolverOptions& o, int64_t context_dim);
  // x + GALE(LN(x), context), then x + MLP(LN(x)), keeping for the backward
  // what `recompute_options` says (the context is the recomputed GALE's
  // side input: recompute.h).
  torch::Tensor forward(const torch::Tensor& x, const torch::Tensor& context);
  // forward over x (B, N, E) in chunks of `chunk` points, x updated in place.
  void forward_in_chunks(torch::Tensor& x, const torch::Tensor& context, int64_t chunk);

  bool bf16_layer_norm;
  RecomputeOptions recompute_options;
  torch::nn::LayerNorm ln_1{nullptr};
  GaleAttention Attn{nullptr};
  torch::nn::Sequential ln_mlp1{nullptr};

 private:
  struct AttentionPart : Recomputable {
    explicit AttentionPart(GaleBlockImpl* b) : block(b) {}
    GaleBlockImpl* block;
    torch::Tensor run(const torch::Tensor& x) override { return run_with(x, {}); }
    torch::Tensor run_with(const torch::Tensor& x, const torch::Tensor& context) override;
  };
  struct MlpPart : Recomputable {  // pointwise
    explicit MlpPart(GaleBlockImpl* b) : block(b) {}
    GaleBlockImpl* block;
    torch::Tensor run(const torch::Tensor& x) override;
  };
  AttentionPart attention_part_{this};
  MlpPart mlp_part_{this};
};
TORCH_MODULE(GaleBlock);

}  // namespace slipstream::aero
