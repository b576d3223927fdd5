// GeoTransolver (PhysicsNeMo's models/geotransolver with GALE attention),
// laid out as PhysicsNeMo lays it out so that its state-dict names load
// unchanged (context_builder.local_extractors.0.processors.3.mlp.layers.0.
// weight, blocks.5.Attn.cross_k.weight, ...). One input stream.
//
// Inputs: local_embedding (B, N, F), geometry (B, N, 3), local_positions
// (B, N, 3), global_embedding (B, G, 3) (U_inf: G = 1).
//
// Context (built once per forward), with dh = n_hidden / n_head:
//   per scale i: the K_i nearest points within radius r_i (ball_query.h) of
//     each query, their coordinates flattened to 3 K_i, an MLP (3K_i -> L ->
//     L/2 -> L, GELU) and tanh: per-point features (B, N, L);
//     - queried at `geometry` among `local_positions`: a ContextProjector
//       turns them into slice tokens (B, H, S, dh);
//     - queried at `local_positions` among `geometry`: concatenated over the
//       scales into the local features (B, N, scales·L).
//     When geometry and local_positions are one tensor (the recipe passes the
//     points for both), the two queries are the same and run once.
//   geometry_tokenizer(geometry), global_tokenizer(global_embedding): slice
//   tokens (B, H, S, dh) each; context = concat over the last dim.
// A ContextProjector is physics attention's slicing alone: w = softmax(Ws
// (Wx x) / clamp(tau, 0.5, 5)) over slices, tokens = (w / (sum_N w + 0.01))^T
// (Wf x), per head.
//
// Then x = [preprocess(local_embedding), local features] (width E = n_hidden
// + scales·L, head dim D = E / H) and per block (GALE):
//   x = x + GALE(ln_1(x), context); x = x + MLP(LN(x))
//   GALE: slice tokens st of x as in Transolver; self = SDPA(Wqkv st);
//   cross = SDPA(Wq st, Wk context, Wv context); mixed by sigmoid(m) self +
//   (1 - sigmoid(m)) cross ("weighted") or GELU(Linear([self, cross]))
//   ("concat_project"); back to the points with w, heads merged, out_linear.
// Finally ln_mlp_out.0: LayerNorm, Linear(E -> out_dim).
//
// Initialisation as PyTorch's defaults (Linear kaiming-uniform, LayerNorm
// 1/0), GALE's in_project_slice orthogonal, temperatures 0.5, state_mixing 0.
// The volume config has 27,574,449 parameters, the surface one 9,046,016.
#pragma once

#include "aero/model/domain_parallel.h"
#include "aero/model/model.h"
#include "aero/model/transolver.h"

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <string>
#include <vector>

namespace slipstream::aero {

struct GeoTransolverOptions {
  int64_t functional_dim = 7;
  int64_t geometry_dim = 3;  // 0: no geometry context
  int64_t global_dim = 3;    // 0: no global context
  int64_t out_dim = 5;
  int64_t n_layers = 12;
  int64_t n_hidden = 256;
  int64_t n_head = 8;
  int64_t slice_num = 256;
  int64_t mlp_ratio = 4;
  bool include_local_features = true;
  std::vector<double> radii{0.01, 0.05, 0.25, 1.0, 2.5, 5.0};
  std::vector<int64_t> neighbors_in_radius{8, 16, 32, 32, 64, 128};
  int64_t n_hidden_local = 32;
  std::string state_mixing_mode = "weighted";  // weighted | concat_project
  bool bf16_layer_norm = true;                 // as TransolverOptions::bf16_layer_norm
  bool fused_attention = true;                 // GALE on the fused slice kernels where they apply
  bool mlp_recompute_gelu = true;              // as TransolverOptions::mlp_recompute_gelu
  // With mlp_recompute_gelu: the MLPs of the last this many GALE blocks keep
  // gelu(h) for the backward too (Mlp's keep_gelu): more memory (one hidden
  // layer each: the volume config's 4 took its step at 200k points from
  // 26.49 to 28.49 GiB on an H200), less time (one pass less over it).
  int64_t mlp_keep_gelu_layers = 0;
};

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
  // Whether forward takes the fused path for this (autocast-cast) input.
  bool uses_fused(const torch::Tensor& x) const;
  // forward over all points in chunks, in two passes (plain LibTorch, no
  // grad), as PhysicsAttentionImpl's: accumulate a chunk's slice sums, mix
  // the totals' tokens with the context, apply the mix to each chunk.
  void accumulate(const torch::Tensor& x, torch::Tensor& norm, torch::Tensor& token);
  torch::Tensor slice_outputs(const torch::Tensor& norm, const torch::Tensor& token,
                              const torch::Tensor& context);
  torch::Tensor apply(const torch::Tensor& x, const torch::Tensor& mixed);

  int64_t heads, dim_head, slices;
  bool weighted, fused, force_fused = false;
  Communicator* domain_group = nullptr;  // as ContextProjectorImpl's
  torch::Tensor temperature, state_mixing;
  torch::nn::Linear in_project_slice{nullptr}, qkv_project{nullptr}, out_linear{nullptr},
      in_project_x{nullptr}, in_project_fx{nullptr}, cross_q{nullptr}, cross_k{nullptr},
      cross_v{nullptr};
  torch::nn::Sequential concat_project{nullptr};

 private:
  torch::Tensor forward_fused(const torch::Tensor& x, const torch::Tensor& context,
                              const torch::Tensor& residual);
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

// Inputs: "local_embedding", "geometry", "local_positions", "global_embedding".
class GeoTransolverImpl : public Model {
 public:
  explicit GeoTransolverImpl(GeoTransolverOptions o);
  torch::Tensor forward(const torch::Tensor& local_embedding, const torch::Tensor& geometry,
                        const torch::Tensor& local_positions,
                        const torch::Tensor& global_embedding);
  torch::Tensor forward(const ModelInputs& inputs) override;
  // Exact in chunks: the context projectors and GALE see every point only
  // through slice sums (taken over all chunks first), and each chunk's
  // neighbours are searched among all points.
  bool exact_in_chunks() const override { return true; }
  torch::Tensor forward_in_chunks(const ModelInputs& inputs, int64_t chunk) override;
  // training.recompute: attention recomputes each GALE sub-block; block each
  // whole block (its MLP in chunks of points), the preprocess MLP and the
  // context projectors, from their inputs.
  void set_recompute(const RecomputeOptions& options) override;
  // Under a domain group local_embedding is this rank's shard of the points
  // (point_shard of local_positions' N) and geometry and local_positions are
  // whole: each rank searches its shard's neighbours among all points, and
  // the context projectors and GALE sum their slice statistics over the
  // group (on their plain paths). The global tokenizer runs on every rank.
  void set_domain_group(Communicator* group) override;
  std::vector<std::string> whole_point_inputs() const override {
    return {"geometry", "local_positions"};
  }
  std::vector<std::string> input_names() const override {
    return {"global_embedding", "geometry", "local_embedding", "local_positions"};
  }
  std::string class_name() const override { return "GeoTransolver"; }
  std::string physicsnemo_module() const override {
    return "physicsnemo.models.geotransolver.geotransolver";
  }
  nlohmann::json physicsnemo_args() const override;
  nlohmann::json numerics(c10::Device device, bool bf16) const override;
  const GeoTransolverOptions& options() const { return options_; }

  GlobalContextBuilder context_builder{nullptr};
  torch::nn::ModuleList preprocess{nullptr}, blocks{nullptr}, ln_mlp_out{nullptr};

 private:
  struct Preprocess : Recomputable {  // pointwise
    explicit Preprocess(GeoTransolverImpl* m) : model(m) {}
    GeoTransolverImpl* model;
    torch::Tensor run(const torch::Tensor& x) override;
  };
  // This rank's shards of local_positions' and geometry's points (all of
  // them without a domain group); checks local_embedding is the first.
  std::pair<PointShard, PointShard> shards(const torch::Tensor& local_embedding,
                                           const torch::Tensor& geometry,
                                           const torch::Tensor& local_positions) const;
  GeoTransolverOptions options_;
  RecomputeOptions recompute_;
  Communicator* domain_group_ = nullptr;
  Preprocess preprocess_part_{this};
};
TORCH_MODULE(GeoTransolver);

}  // namespace slipstream::aero
