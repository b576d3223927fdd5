#include "aero/model/geotransolver/geotransolver.h"

#include "aero/model/layers.h"
#include "aero/model/physics_attention.h"
#include "aero/ops/ball_query.h"
#include "aero/ops/slice_ops.h"

#include <torch/torch.h>

#include <vector>

namespace slipstream::aero {

GeoTransolverImpl::GeoTransolverImpl(GeoTransolverOptions o) : options_(std::move(o)) {
  const auto& op = options_;
  TORCH_CHECK(op.n_layers >= 1 && op.n_head >= 1 && op.n_hidden % op.n_head == 0,
              "model: GeoTransolver needs n_layers >= 1 and n_hidden (", op.n_hidden,
              ") divisible by n_head (", op.n_head, ")");
  TORCH_CHECK(op.radii.size() == op.neighbors_in_radius.size(),
              "model: radii and neighbors_in_radius differ in length (", op.radii.size(), " and ",
              op.neighbors_in_radius.size(), ")");
  TORCH_CHECK(!op.include_local_features || op.geometry_dim == 3,
              "model: local features query 3-D points; geometry has ", op.geometry_dim,
              " channels");
  context_builder = register_module("context_builder", GlobalContextBuilder(op));
  preprocess = register_module("preprocess", torch::nn::ModuleList());
  preprocess->push_back(Mlp(op.functional_dim, 2 * op.n_hidden, op.n_hidden));
  preprocess[0]->as<Mlp>()->part = fp8::Part::kEmbedding;
  const bool local = op.include_local_features && op.geometry_dim > 0;
  const int64_t width =
      op.n_hidden + (local ? op.n_hidden_local * static_cast<int64_t>(op.radii.size()) : 0);
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < op.n_layers; ++i) {
    blocks->push_back(GaleBlock(width, op, context_builder->context_dim()));
  }
  ln_mlp_out = register_module("ln_mlp_out", torch::nn::ModuleList());
  ln_mlp_out->push_back(
      torch::nn::Sequential(torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})),
                            torch::nn::Linear(width, op.out_dim)));
  set_mlp_recompute_gelu(*this, op.mlp_recompute_gelu);
  TORCH_CHECK(op.mlp_keep_gelu_layers >= 0 && op.mlp_keep_gelu_layers <= op.n_layers,
              "model: mlp_keep_gelu_layers must be in [0, n_layers = ", op.n_layers, "], got ",
              op.mlp_keep_gelu_layers);
  for (int64_t i = op.n_layers - op.mlp_keep_gelu_layers; i < op.n_layers; ++i) {
    blocks[i]->as<GaleBlock>()->ln_mlp1[1]->as<Mlp>()->keep_gelu = true;
  }
}

torch::Tensor GeoTransolverImpl::Preprocess::run(const torch::Tensor& x) {
  return model->preprocess[0]->as<Mlp>()->forward(x);
}

std::pair<PointShard, PointShard> GeoTransolverImpl::shards(
    const torch::Tensor& local_embedding, const torch::Tensor& geometry,
    const torch::Tensor& local_positions) const {
  TORCH_CHECK(geometry.dim() == 3 && local_positions.dim() == 3,
              "model: GeoTransolver expects geometry and local_positions (B, N, 3), got ",
              geometry.sizes(), " and ", local_positions.sizes());
  const int64_t n = local_positions.size(1);
  if (domain_group_ == nullptr) {
    TORCH_CHECK(local_embedding.size(1) == n, "model: GeoTransolver's local_embedding has ",
                local_embedding.size(1), " points and local_positions ", n);
    return {PointShard{0, n}, PointShard{0, geometry.size(1)}};
  }
  const int rank = domain_group_->rank(), size = domain_group_->world_size();
  const auto mine = point_shard(n, rank, size);
  TORCH_CHECK(local_embedding.size(1) == mine.count, "model: GeoTransolver on domain rank ", rank,
              " of ", size, " expects local_embedding to be its shard of local_positions' ", n,
              " points (", mine.count, "), got ", local_embedding.size(1), " points");
  return {mine, point_shard(geometry.size(1), rank, size)};
}

void GeoTransolverImpl::set_recompute(const RecomputeOptions& options) {
  recompute_ = options;
  context_builder->recompute_projectors = options.mode == Recompute::kBlock;
  for (const auto& block : *blocks) block->as<GaleBlock>()->recompute_options = options;
}

void GeoTransolverImpl::set_domain_group(Communicator* group) {
  domain_group_ = group != nullptr && group->world_size() > 1 ? group : nullptr;
  auto& builder = *context_builder;
  if (!builder.local_extractors.is_empty()) {
    auto& extractor = *builder.local_extractors[0]->as<MultiScaleFeatureExtractor>();
    for (const auto& t : *extractor.tokenizers) {
      t->as<ContextProjector>()->domain_group = domain_group_;
    }
  }
  // The global tokenizer's one global point is on every rank: no sum.
  if (!builder.geometry_tokenizer.is_empty())
    builder.geometry_tokenizer->domain_group = domain_group_;
  for (const auto& block : *blocks) block->as<GaleBlock>()->Attn->domain_group = domain_group_;
}

torch::Tensor GeoTransolverImpl::forward(const torch::Tensor& local_embedding,
                                         const torch::Tensor& geometry,
                                         const torch::Tensor& local_positions,
                                         const torch::Tensor& global_embedding) {
  TORCH_CHECK(local_embedding.dim() == 3 && local_embedding.size(-1) == options_.functional_dim,
              "model: GeoTransolver expects local_embedding (B, N, ", options_.functional_dim,
              "), got ", local_embedding.sizes());
  const auto [positions, geometry_shard] = shards(local_embedding, geometry, local_positions);
  const auto built = context_builder->build(local_positions, geometry, global_embedding, positions,
                                            geometry_shard);
  auto x = recompute_.mode == Recompute::kBlock
               ? recompute(preprocess_part_, local_embedding, recompute_.point_chunk)
               : preprocess_part_.run(local_embedding);
  if (built.local_features.defined()) {
    x = torch::cat({x, built.local_features.to(x.scalar_type())}, -1);
  }
  for (const auto& block : *blocks) x = block->as<GaleBlock>()->forward(x, built.context);
  const auto& out = *ln_mlp_out[0]->as<torch::nn::Sequential>();
  return linear(*out[1]->as<torch::nn::Linear>(),
                layer_norm(*out[0]->as<torch::nn::LayerNorm>(), x, options_.bf16_layer_norm));
}

torch::Tensor GeoTransolverImpl::forward_in_chunks(const ModelInputs& inputs, int64_t chunk) {
  TORCH_CHECK(chunk > 0, "model: chunk must be > 0");
  torch::NoGradGuard no_grad;
  const auto& local_embedding = input(inputs, "local_embedding");
  const auto& geometry = input(inputs, "geometry");
  const auto& local_positions = input(inputs, "local_positions");
  TORCH_CHECK(local_embedding.dim() == 3 && local_embedding.size(-1) == options_.functional_dim,
              "model: GeoTransolver expects local_embedding (B, N, ", options_.functional_dim,
              "), got ", local_embedding.sizes());
  // Under a domain group: this rank's shard of the points, searched among all.
  // Named copies, not a structured binding: lambdas below capture them.
  const auto both = shards(local_embedding, geometry, local_positions);
  const PointShard positions = both.first, geometry_shard = both.second;
  const auto sum = [this](const torch::Tensor& t) { return domain_sum(t, domain_group_); };
  const int64_t n = local_embedding.size(1), hidden = options_.n_hidden;
  const int64_t width = blocks[0]->as<GaleBlock>()->ln_1->options.normalized_shape()[0];
  auto& builder = *context_builder;
  torch::Tensor x;  // (B, N, width): the hidden state of every point, one block at a time
  for_chunks(n, chunk, [&](int64_t s, int64_t len) {
    const auto h = preprocess[0]->as<Mlp>()->forward(local_embedding.narrow(1, s, len));
    if (!x.defined()) x = torch::empty({h.size(0), n, width}, h.options());
    x.narrow(1, s, len).narrow(2, 0, hidden).copy_(h);
  });
  // The context: every projector's slice sums over all chunks. Each chunk's
  // neighbours are searched among all points, so its local features are
  // those of the whole forward.
  std::vector<torch::Tensor> parts;
  if (!builder.local_extractors.is_empty()) {
    auto& extractor = *builder.local_extractors[0]->as<MultiScaleFeatureExtractor>();
    std::vector<BallQueryScale> scales;
    for (size_t i = 0; i < options_.radii.size(); ++i) {
      scales.push_back({options_.radii[i], options_.neighbors_in_radius[i]});
    }
    const int64_t local = options_.n_hidden_local;
    const bool same = geometry.is_same(local_positions);
    std::vector<torch::Tensor> norms(scales.size()), tokens(scales.size());
    // The points' grids built once for every chunk's queries.
    const BallQueryIndex among_positions(local_positions);
    for_chunks(geometry_shard.count, chunk, [&](int64_t s, int64_t len) {
      const auto nn =
          among_positions.query(geometry.narrow(1, geometry_shard.begin + s, len), scales);
      for (size_t i = 0; i < scales.size(); ++i) {
        const auto f =
            extractor.processors[i]->as<GeometricFeatureProcessor>()->forward(nn[i].neighbors);
        extractor.tokenizers[i]->as<ContextProjector>()->accumulate(f, norms[i], tokens[i]);
        if (same) x.narrow(1, s, len).narrow(2, hidden + i * local, local).copy_(f);
      }
    });
    if (!same) {
      const BallQueryIndex among_geometry(geometry);
      for_chunks(n, chunk, [&](int64_t s, int64_t len) {
        const auto nn =
            among_geometry.query(local_positions.narrow(1, positions.begin + s, len), scales);
        for (size_t i = 0; i < scales.size(); ++i) {
          x.narrow(1, s, len)
              .narrow(2, hidden + i * local, local)
              .copy_(extractor.processors[i]->as<GeometricFeatureProcessor>()->forward(
                  nn[i].neighbors));
        }
      });
    }
    for (size_t i = 0; i < scales.size(); ++i) {
      parts.push_back(tokens_of(sum(norms[i]), sum(tokens[i]), kGeoSliceNormEps));
    }
  }
  if (!builder.geometry_tokenizer.is_empty()) {
    torch::Tensor norm, token;
    for_chunks(geometry_shard.count, chunk, [&](int64_t s, int64_t len) {
      builder.geometry_tokenizer->accumulate(geometry.narrow(1, geometry_shard.begin + s, len),
                                             norm, token);
    });
    parts.push_back(tokens_of(sum(norm), sum(token), kGeoSliceNormEps));
  }
  if (!builder.global_tokenizer.is_empty()) {
    parts.push_back(builder.global_tokenizer->forward(input(inputs, "global_embedding")));
  }
  torch::Tensor context;
  if (!parts.empty()) {
    for (auto& p : parts) p = p.to(torch::kFloat);
    context = torch::cat(parts, -1);
  }
  for (const auto& block : *blocks) block->as<GaleBlock>()->forward_in_chunks(x, context, chunk);
  const auto& head = *ln_mlp_out[0]->as<torch::nn::Sequential>();
  torch::Tensor out;
  for_chunks(n, chunk, [&](int64_t s, int64_t len) {
    const auto y = linear(*head[1]->as<torch::nn::Linear>(),
                          layer_norm(*head[0]->as<torch::nn::LayerNorm>(), x.narrow(1, s, len),
                                     options_.bf16_layer_norm));
    if (!out.defined()) out = torch::empty({x.size(0), n, y.size(-1)}, y.options());
    out.narrow(1, s, len).copy_(y);
  });
  return out;
}

torch::Tensor GeoTransolverImpl::forward(const ModelInputs& inputs) {
  return forward(input(inputs, "local_embedding"), input(inputs, "geometry"),
                 input(inputs, "local_positions"), input(inputs, "global_embedding"));
}

nlohmann::json GeoTransolverImpl::physicsnemo_args() const {
  return aero::physicsnemo_args(options_);
}

nlohmann::json GeoTransolverImpl::numerics(c10::Device device, bool bf16) const {
  const int64_t width = options_.n_hidden +
                        (options_.include_local_features && options_.geometry_dim > 0
                             ? options_.n_hidden_local * static_cast<int64_t>(options_.radii.size())
                             : 0);
  const bool fused =
      options_.fused_attention && bf16 &&
      slice_ops::kernels_apply(device, torch::kBFloat16,
                               slice_ops::kernel_dim(width / options_.n_head), options_.slice_num);
  const bool fused_context =
      options_.fused_attention && bf16 &&
      slice_ops::kernels_apply(device, torch::kBFloat16, options_.n_hidden / options_.n_head,
                               options_.slice_num);
  return {{"gale_attention", fused ? "fused CUDA kernels" : "plain LibTorch"},
          {"context_projectors", fused_context ? "fused CUDA kernels" : "plain LibTorch"},
          {"ball_query", device.is_cuda() ? "CUDA grid search, every scale at once"
                                          : "ATen cdist + top-k, every scale at once"},
          {"layer_norm", bf16 && options_.bf16_layer_norm ? "bf16" : "fp32"}};
}

}  // namespace slipstream::aero
