// GeoTransolver's context (see geotransolver.h): the context projectors
// (physics attention's slicing alone) and the multi-scale neighbourhood
// features, built once per forward.
#pragma once

#include "aero/model/geotransolver/options.h"
#include "aero/model/layers.h"
#include "aero/model/physics_attention.h"
#include "aero/ops/domain_parallel.h"
#include "aero/ops/recompute.h"

#include <torch/nn/module.h>
#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/linear.h>

#include <cstdint>

namespace slipstream::aero {

// Slice tokens of a set of points: (B, N, dim) -> (B, H, S, dh). On CUDA
// under bf16 autocast (fused on) through fused_slice_tokens, which keeps no
// points x heads x slices tensor; force_fused as GaleAttentionImpl's.
// It is its own Recomputable (run: forward), for training.recompute=block.
class ContextProjectorImpl : public torch::nn::Module, public Recomputable {
 public:
  ContextProjectorImpl(int64_t dim, int64_t heads, int64_t dim_head, int64_t slices,
                       bool fused_attention = true);
  torch::Tensor forward(const torch::Tensor& x);
  torch::Tensor run(const torch::Tensor& x) override { return forward(x); }
  bool uses_fused(const torch::Tensor& x) const;
  // forward in chunks: adds a chunk's slice sums (norm (B, H, S), token (B,
  // H, S, dh), fp32) over its points; the tokens are token / (norm + eps).
  void accumulate(const torch::Tensor& x, torch::Tensor& norm, torch::Tensor& token);

  // The slicing (physics_attention.h), in GALE's form.
  SliceProjection projection() const;

  int64_t heads, dim_head, slices;
  bool fused, force_fused = false;
  // x is this rank's shard of the points and the slice sums are summed over
  // this group (domain_parallel.h), on the plain path; null: x is all of them.
  Communicator* domain_group = nullptr;
  torch::Tensor temperature;
  torch::nn::Linear in_project_x{nullptr}, in_project_fx{nullptr}, in_project_slice{nullptr};
};
TORCH_MODULE(ContextProjector);

// The neighbourhood MLP of one scale: (B, M, K, 3) -> tanh(MLP) (B, M, L).
class GeometricFeatureProcessorImpl : public torch::nn::Module {
 public:
  GeometricFeatureProcessorImpl(int64_t neighbors, int64_t hidden);
  torch::Tensor forward(const torch::Tensor& neighbor_points);
  Mlp mlp{nullptr};
};
TORCH_MODULE(GeometricFeatureProcessor);

class MultiScaleFeatureExtractorImpl : public torch::nn::Module {
 public:
  MultiScaleFeatureExtractorImpl(const GeoTransolverOptions& o, int64_t dim_head);
  torch::nn::ModuleList processors{nullptr}, tokenizers{nullptr};
};
TORCH_MODULE(MultiScaleFeatureExtractor);

class GlobalContextBuilderImpl : public torch::nn::Module {
 public:
  explicit GlobalContextBuilderImpl(const GeoTransolverOptions& o);
  struct Built {
    torch::Tensor context;         // (B, H, S, context_dim)
    torch::Tensor local_features;  // (B, N, scales·L) or undefined
  };
  // Every point of local_positions and geometry is searched among; the
  // queries are this rank's shards of them (all of them without a domain
  // group): `positions` of local_positions, `geometry_shard` of geometry.
  Built build(const torch::Tensor& local_positions, const torch::Tensor& geometry,
              const torch::Tensor& global_embedding, const PointShard& positions,
              const PointShard& geometry_shard);
  int64_t context_dim() const { return context_dim_; }
  // Whether build() recomputes the context projectors in the backward
  // (training.recompute=block), keeping only their inputs.
  bool recompute_projectors = false;

  torch::nn::ModuleList local_extractors{nullptr};
  ContextProjector geometry_tokenizer{nullptr}, global_tokenizer{nullptr};

 private:
  GeoTransolverOptions options_;
  int64_t context_dim_ = 0;
};
TORCH_MODULE(GlobalContextBuilder);

}  // namespace slipstream::aero
