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

#include "aero/model/geotransolver/context.h"
#include "aero/model/geotransolver/gale.h"
#include "aero/model/geotransolver/options.h"
#include "aero/model/model.h"
#include "aero/ops/domain_parallel.h"

#include <torch/nn/modules/container/modulelist.h>
#include <torch/nn/modules/container/sequential.h>
#include <torch/nn/modules/linear.h>
#include <torch/nn/modules/normalization.h>

#include <string>
#include <vector>

namespace slipstream::aero {

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
