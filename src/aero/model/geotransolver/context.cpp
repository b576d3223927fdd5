#include "aero/model/geotransolver/context.h"

#include "aero/ops/ball_query.h"
#include "aero/ops/fused_physics_attention.h"
#include "aero/ops/linear.h"
#include "aero/ops/numerics.h"
#include "aero/ops/slice_ops.h"

#include <torch/torch.h>

#include <vector>

namespace slipstream::aero {

SliceProjection ContextProjectorImpl::projection() const {
  return {*in_project_slice, temperature, kGeoSliceNormEps, SliceForm::kGale};
}

void ContextProjectorImpl::accumulate(const torch::Tensor& x, torch::Tensor& norm,
                                      torch::Tensor& token) {
  accumulate_projected(projection(), *in_project_x, *in_project_fx, heads, x, norm, token);
}

ContextProjectorImpl::ContextProjectorImpl(int64_t dim, int64_t heads_, int64_t dim_head_,
                                           int64_t slices_, bool fused_attention)
    : heads(heads_), dim_head(dim_head_), slices(slices_), fused(fused_attention) {
  temperature = register_parameter("temperature", torch::full({1, 1, heads, 1}, 0.5));
  in_project_x = register_module("in_project_x", torch::nn::Linear(dim, heads * dim_head));
  in_project_fx = register_module("in_project_fx", torch::nn::Linear(dim, heads * dim_head));
  in_project_slice = register_module("in_project_slice", torch::nn::Linear(dim_head, slices));
}

bool ContextProjectorImpl::uses_fused(const torch::Tensor& x) const {
  return fused &&
         (force_fused || slice_ops::kernels_apply(x.device(), x.scalar_type(), dim_head, slices));
}

torch::Tensor ContextProjectorImpl::forward(const torch::Tensor& x_in) {
  const auto x = autocast_input(x_in);
  const int64_t b = x.size(0), n = x.size(1);
  const auto x_mid = attention_input(*in_project_x, x).view({b, n, heads, dim_head});
  const auto fx_mid = attention_input(*in_project_fx, x).view({b, n, heads, dim_head});
  if (domain_group == nullptr && uses_fused(x)) {
    return fused_slice_tokens(
        x_mid, fx_mid,
        {in_project_slice->weight, in_project_slice->bias, temperature, kGeoSliceNormEps});
  }
  return slice(projection(), x_mid, fx_mid, domain_group).tokens;
}

GeometricFeatureProcessorImpl::GeometricFeatureProcessorImpl(int64_t neighbors, int64_t hidden) {
  mlp =
      register_module("mlp", Mlp(3 * neighbors, std::vector<int64_t>{hidden, hidden / 2}, hidden));
  mlp->part = fp8::Part::kEmbedding;
}

torch::Tensor GeometricFeatureProcessorImpl::forward(const torch::Tensor& neighbor_points) {
  return torch::tanh(mlp->forward(neighbor_points.flatten(2)));
}

MultiScaleFeatureExtractorImpl::MultiScaleFeatureExtractorImpl(const GeoTransolverOptions& o,
                                                               int64_t dim_head) {
  processors = register_module("processors", torch::nn::ModuleList());
  tokenizers = register_module("tokenizers", torch::nn::ModuleList());
  for (size_t i = 0; i < o.radii.size(); ++i) {
    processors->push_back(GeometricFeatureProcessor(o.neighbors_in_radius[i], o.n_hidden_local));
    tokenizers->push_back(
        ContextProjector(o.n_hidden_local, o.n_head, dim_head, o.slice_num, o.fused_attention));
  }
}

GlobalContextBuilderImpl::GlobalContextBuilderImpl(const GeoTransolverOptions& o) : options_(o) {
  const int64_t dh = o.n_hidden / o.n_head;
  if (o.include_local_features && o.geometry_dim > 0) {
    local_extractors = register_module("local_extractors", torch::nn::ModuleList());
    local_extractors->push_back(MultiScaleFeatureExtractor(o, dh));
    context_dim_ += dh * static_cast<int64_t>(o.radii.size());
  }
  if (o.geometry_dim > 0) {
    geometry_tokenizer = register_module(
        "geometry_tokenizer",
        ContextProjector(o.geometry_dim, o.n_head, dh, o.slice_num, o.fused_attention));
    context_dim_ += dh;
  }
  if (o.global_dim > 0) {
    global_tokenizer = register_module(
        "global_tokenizer",
        ContextProjector(o.global_dim, o.n_head, dh, o.slice_num, o.fused_attention));
    context_dim_ += dh;
  }
}

GlobalContextBuilderImpl::Built GlobalContextBuilderImpl::build(
    const torch::Tensor& local_positions, const torch::Tensor& geometry,
    const torch::Tensor& global_embedding, const PointShard& positions,
    const PointShard& geometry_shard) {
  Built out;
  std::vector<torch::Tensor> parts, local;
  const auto project = [&](ContextProjectorImpl& p, const torch::Tensor& x) {
    return recompute_projectors ? recompute(p, x) : p.forward(x);
  };
  const auto geometry_queries = geometry.narrow(1, geometry_shard.begin, geometry_shard.count);
  if (!local_extractors.is_empty()) {
    auto& extractor = *local_extractors[0]->as<MultiScaleFeatureExtractor>();
    // One search serves every scale, and both paths when the two point sets
    // are one tensor.
    std::vector<BallQueryScale> scales;
    for (size_t i = 0; i < options_.radii.size(); ++i) {
      scales.push_back({options_.radii[i], options_.neighbors_in_radius[i]});
    }
    const bool same = geometry.is_same(local_positions);
    const auto at_geometry_nn = ball_query_scales(local_positions, geometry_queries, scales);
    const auto at_local_nn =
        same ? std::vector<BallQueryResult>{}
             : ball_query_scales(
                   geometry, local_positions.narrow(1, positions.begin, positions.count), scales);
    for (size_t i = 0; i < scales.size(); ++i) {
      auto& processor = *extractor.processors[i]->as<GeometricFeatureProcessor>();
      auto& tokenizer = *extractor.tokenizers[i]->as<ContextProjector>();
      const auto at_geometry = processor.forward(at_geometry_nn[i].neighbors);
      parts.push_back(project(tokenizer, at_geometry));
      local.push_back(same ? at_geometry : processor.forward(at_local_nn[i].neighbors));
    }
    out.local_features = torch::cat(local, -1);
  }
  if (!geometry_tokenizer.is_empty()) {
    parts.push_back(project(*geometry_tokenizer, geometry_queries));
  }
  if (!global_tokenizer.is_empty()) parts.push_back(global_tokenizer->forward(global_embedding));
  if (!parts.empty()) out.context = torch::cat(parts, -1);
  return out;
}

}  // namespace slipstream::aero
