#include "aero/model/geotransolver.h"

#include "aero/model/ball_query.h"
#include "aero/model/fused_physics_attention.h"
#include "aero/model/linear.h"
#include "aero/model/numerics.h"
#include "aero/model/slice_ops.h"

#include <torch/torch.h>

#include <algorithm>

namespace slipstream::aero {

namespace {

constexpr double kSliceNormEps = 1e-2;

// Slice weights (B, N, H, S) and normalised slice tokens (B, H, S, D) of
// the projections x_mid, fx_mid (B, N, H, D): physics attention's slicing.
torch::Tensor slice_weights(const torch::nn::LinearImpl& in_project_slice,
                            const torch::Tensor& temperature, const torch::Tensor& x_mid) {
  const auto logits = linear(in_project_slice, x_mid);
  return torch::softmax(logits / temperature.clamp(0.5, 5.0).to(logits.scalar_type()), -1);
}

// Under a domain group x_mid, fx_mid are this rank's shard of the points
// and both sums are taken over the group's.
std::pair<torch::Tensor, torch::Tensor> slice(const torch::nn::LinearImpl& in_project_slice,
                                              const torch::Tensor& temperature,
                                              const torch::Tensor& x_mid,
                                              const torch::Tensor& fx_mid, Communicator* group) {
  const auto w = slice_weights(in_project_slice, temperature, x_mid);
  if (group != nullptr) {
    const auto norm = domain_sum(w.sum(1), group) + kSliceNormEps;
    const auto sums = domain_sum(torch::einsum("bnhs,bnhd->bhsd", {w, fx_mid}), group);
    return {w, sums / norm.unsqueeze(-1)};
  }
  const auto norm = w.sum(1) + kSliceNormEps;  // (B, H, S)
  // (B, H, S, N) x (B, H, N, D): the products PhysicsNeMo's code runs.
  const auto tokens =
      torch::matmul((w / norm.unsqueeze(1)).permute({0, 2, 3, 1}), fx_mid.permute({0, 2, 1, 3}));
  return {w, tokens};
}

// Adds the slice sums of x_mid, fx_mid (B, n, H, D) to norm (B, H, S) and
// token (B, H, S, D), fp32 (allocated on the first chunk).
void accumulate_slices(const torch::nn::LinearImpl& in_project_slice,
                       const torch::Tensor& temperature, const torch::Tensor& x_mid,
                       const torch::Tensor& fx_mid, torch::Tensor& norm, torch::Tensor& token) {
  const auto w = slice_weights(in_project_slice, temperature, x_mid).to(torch::kFloat);
  if (!norm.defined()) {
    norm = torch::zeros({w.size(0), w.size(2), w.size(3)}, w.options());
    token = torch::zeros({w.size(0), w.size(2), w.size(3), fx_mid.size(3)}, w.options());
  }
  norm.add_(w.sum(1));
  token.add_(torch::einsum("bnhs,bnhd->bhsd", {w, fx_mid.to(torch::kFloat)}));
}

// The same for a module's input x: its in_project_x and in_project_fx
// first (a ContextProjector's or a GALE layer's).
template <class Module>
void accumulate_projected(Module& m, const torch::Tensor& x_in, torch::Tensor& norm,
                          torch::Tensor& token) {
  const auto x = autocast_input(x_in);
  const int64_t b = x.size(0), n = x.size(1);
  accumulate_slices(*m.in_project_slice, m.temperature,
                    linear(*m.in_project_x, x).view({b, n, m.heads, m.dim_head}),
                    linear(*m.in_project_fx, x).view({b, n, m.heads, m.dim_head}), norm, token);
}

torch::Tensor tokens_of(const torch::Tensor& norm, const torch::Tensor& token) {
  return token / (norm + kSliceNormEps).unsqueeze(-1);
}

// Calls f(begin, length) for the chunks of n points.
template <typename F>
void for_chunks(int64_t n, int64_t chunk, F&& f) {
  for (int64_t s = 0; s < n; s += chunk) f(s, std::min(chunk, n - s));
}

}  // namespace

void ContextProjectorImpl::accumulate(const torch::Tensor& x, torch::Tensor& norm,
                                      torch::Tensor& token) {
  accumulate_projected(*this, x, norm, token);
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
  const auto x_mid = linear(*in_project_x, x).view({b, n, heads, dim_head});
  const auto fx_mid = linear(*in_project_fx, x).view({b, n, heads, dim_head});
  if (domain_group == nullptr && uses_fused(x)) {
    return fused_slice_tokens(
        x_mid, fx_mid,
        {in_project_slice->weight, in_project_slice->bias, temperature, kSliceNormEps});
  }
  return slice(*in_project_slice, temperature, x_mid, fx_mid, domain_group).second;
}

GeometricFeatureProcessorImpl::GeometricFeatureProcessorImpl(int64_t neighbors, int64_t hidden) {
  mlp =
      register_module("mlp", Mlp(3 * neighbors, std::vector<int64_t>{hidden, hidden / 2}, hidden));
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

GaleAttentionImpl::GaleAttentionImpl(int64_t dim, int64_t heads_, int64_t slices_,
                                     int64_t context_dim, const std::string& mode,
                                     bool fused_attention)
    : heads(heads_),
      dim_head(dim / heads_),
      slices(slices_),
      weighted(mode == "weighted"),
      fused(fused_attention) {
  TORCH_CHECK(mode == "weighted" || mode == "concat_project", "model: state_mixing_mode '", mode,
              "' is not one of weighted, concat_project");
  TORCH_CHECK(dim % heads == 0, "model: GALE width ", dim, " is not divisible by ", heads,
              " heads");
  temperature = register_parameter("temperature", torch::full({1, 1, heads, 1}, 0.5));
  if (weighted) state_mixing = register_parameter("state_mixing", torch::zeros({}));
  in_project_slice = register_module("in_project_slice", torch::nn::Linear(dim_head, slices));
  qkv_project = register_module(
      "qkv_project",
      torch::nn::Linear(torch::nn::LinearOptions(dim_head, 3 * dim_head).bias(false)));
  out_linear = register_module("out_linear", torch::nn::Linear(dim, dim));
  in_project_x = register_module("in_project_x", torch::nn::Linear(dim, dim));
  in_project_fx = register_module("in_project_fx", torch::nn::Linear(dim, dim));
  cross_q = register_module("cross_q", torch::nn::Linear(dim_head, dim_head));
  cross_k = register_module("cross_k", torch::nn::Linear(context_dim, dim_head));
  cross_v = register_module("cross_v", torch::nn::Linear(context_dim, dim_head));
  if (!weighted) {
    concat_project = register_module(
        "concat_project",
        torch::nn::Sequential(torch::nn::Linear(2 * dim_head, dim_head), torch::nn::GELU()));
  }
  torch::NoGradGuard no_grad;
  torch::nn::init::orthogonal_(in_project_slice->weight);
}

bool GaleAttentionImpl::uses_fused(const torch::Tensor& x) const {
  return fused &&
         (force_fused || slice_ops::kernels_apply(x.device(), x.scalar_type(),
                                                  slice_ops::kernel_dim(dim_head), slices));
}

torch::Tensor GaleAttentionImpl::mix_tokens(const torch::Tensor& tokens,
                                            const torch::Tensor& context,
                                            const torch::Tensor& qkv_weight,
                                            const std::vector<torch::Tensor>& cross,
                                            const std::vector<torch::Tensor>& mixing) const {
  auto mixed = slice_token_attention(tokens, qkv_weight);
  if (!context.defined()) return mixed;
  // cross: cross_q, cross_k, cross_v weights and biases.
  const auto attended =
      dot_product_attention(linear(tokens, cross[0], cross[1]), linear(context, cross[2], cross[3]),
                            linear(context, cross[4], cross[5]))
          .to(mixed.scalar_type());
  if (weighted) {  // mixing: state_mixing
    const auto m = torch::sigmoid(mixing[0]).to(mixed.scalar_type());
    return m * mixed + (1 - m) * attended;
  }
  // mixing: concat_project's weight and bias
  return torch::gelu(linear(torch::cat({mixed, attended}, -1), mixing[0], mixing[1]));
}

torch::Tensor GaleAttentionImpl::mix_with_parameters(const torch::Tensor& tokens,
                                                     const torch::Tensor& context) {
  std::vector<torch::Tensor> cross, mixing;
  if (context.defined()) {
    cross = {cross_q->weight, cross_q->bias,   cross_k->weight,
             cross_k->bias,   cross_v->weight, cross_v->bias};
    if (weighted) {
      mixing = {state_mixing};
    } else {
      const auto& proj = *concat_project[0]->as<torch::nn::Linear>();
      mixing = {proj.weight, proj.bias};
    }
  }
  return mix_tokens(tokens, context, qkv_project->weight, cross, mixing);
}

torch::Tensor GaleAttentionImpl::deslice(const torch::Tensor& w, const torch::Tensor& mixed,
                                         const torch::Tensor& residual) {
  const int64_t b = w.size(0), n = w.size(1);
  const auto y = torch::einsum("bnhs,bhsd->bnhd", {w, mixed.to(w.scalar_type())});
  return linear_residual(y.reshape({b, n, heads * dim_head}), out_linear->weight, out_linear->bias,
                         residual);
}

torch::Tensor GaleAttentionImpl::forward(const torch::Tensor& x_in, const torch::Tensor& context,
                                         const torch::Tensor& residual) {
  const auto x = autocast_input(x_in);
  if (domain_group == nullptr && uses_fused(x)) return forward_fused(x, context, residual);
  const int64_t b = x.size(0), n = x.size(1);
  const auto [xm, fxm] = linear_pair(x, in_project_x->weight, in_project_x->bias,
                                     in_project_fx->weight, in_project_fx->bias);
  const auto x_mid = xm.view({b, n, heads, dim_head});
  const auto fx_mid = fxm.view({b, n, heads, dim_head});
  const auto [w, tokens] = slice(*in_project_slice, temperature, x_mid, fx_mid, domain_group);
  return deslice(w, mix_with_parameters(tokens, context), residual);
}

void GaleAttentionImpl::accumulate(const torch::Tensor& x, torch::Tensor& norm,
                                   torch::Tensor& token) {
  accumulate_projected(*this, x, norm, token);
}

torch::Tensor GaleAttentionImpl::slice_outputs(const torch::Tensor& norm,
                                               const torch::Tensor& token,
                                               const torch::Tensor& context) {
  return mix_with_parameters(tokens_of(norm, token), context);
}

torch::Tensor GaleAttentionImpl::apply(const torch::Tensor& x_in, const torch::Tensor& mixed) {
  const auto x = autocast_input(x_in);
  const int64_t b = x.size(0), n = x.size(1);
  const auto x_mid = linear(*in_project_x, x).view({b, n, heads, dim_head});
  return deslice(slice_weights(*in_project_slice, temperature, x_mid), mixed);
}

namespace {

// A projection's weight (H d, in) and bias (H d) with each head's rows
// padded with zeros to dp: (H dp, in), (H dp).
std::pair<torch::Tensor, torch::Tensor> pad_head_rows(const torch::nn::LinearImpl& l, int64_t heads,
                                                      int64_t d, int64_t dp) {
  if (dp == d) return {l.weight, l.bias};
  return {torch::constant_pad_nd(l.weight.view({heads, d, -1}), {0, 0, 0, dp - d})
              .view({heads * dp, -1}),
          torch::constant_pad_nd(l.bias.view({heads, d}), {0, dp - d}).view({heads * dp})};
}

// The last dim of t padded with zeros from d to dp (or narrowed back).
torch::Tensor pad_last(const torch::Tensor& t, int64_t dp) {
  const int64_t d = t.size(-1);
  if (dp == d) return t;
  return dp > d ? torch::constant_pad_nd(t, {0, dp - d}) : t.narrow(-1, 0, dp);
}

}  // namespace

torch::Tensor GaleAttentionImpl::forward_fused(const torch::Tensor& x, const torch::Tensor& context,
                                               const torch::Tensor& residual) {
  const int64_t b = x.size(0), n = x.size(1), d = dim_head;
  const int64_t dp = slice_ops::kernel_dim(d);
  const auto [wx, bx] = pad_head_rows(*in_project_x, heads, d, dp);
  const auto [wf, bf] = pad_head_rows(*in_project_fx, heads, d, dp);
  const auto [xm, fxm] = linear_pair(x, wx, bx, wf, bf);
  const auto x_mid = xm.view({b, n, heads, dp});
  const auto fx_mid = fxm.view({b, n, heads, dp});
  // The leaves of the mix, in order: Wqkv, then with a context the cross
  // projections, the mixing weights and the context itself.
  std::vector<torch::Tensor> leaves{qkv_project->weight};
  size_t mixing_count = 0;
  if (context.defined()) {
    leaves.insert(leaves.end(), {cross_q->weight, cross_q->bias, cross_k->weight, cross_k->bias,
                                 cross_v->weight, cross_v->bias});
    if (weighted) {
      leaves.push_back(state_mixing);
      mixing_count = 1;
    } else {
      const auto& proj = *concat_project[0]->as<torch::nn::Linear>();
      leaves.insert(leaves.end(), {proj.weight, proj.bias});
      mixing_count = 2;
    }
    leaves.push_back(context);
  }
  const TokenMixer mix = [&](const torch::Tensor& tokens, const std::vector<torch::Tensor>& l) {
    const bool with_context = l.size() > 1;
    const std::vector<torch::Tensor> cross =
        with_context ? std::vector<torch::Tensor>(l.begin() + 1, l.begin() + 7)
                     : std::vector<torch::Tensor>{};
    const std::vector<torch::Tensor> mixing =
        with_context ? std::vector<torch::Tensor>(l.begin() + 7, l.begin() + 7 + mixing_count)
                     : std::vector<torch::Tensor>{};
    const auto ctx = with_context ? l.back() : torch::Tensor();
    return pad_last(mix_tokens(pad_last(tokens, d), ctx, l[0], cross, mixing), dp);
  };
  const auto y = fused_slice_mix(
      x_mid, fx_mid,
      {pad_last(in_project_slice->weight, dp), in_project_slice->bias, temperature, kSliceNormEps},
      mix, leaves);
  // out_linear's weight (E, H d) padded per head to (E, H dp).
  const auto wo = dp == d
                      ? out_linear->weight
                      : torch::constant_pad_nd(out_linear->weight.view({-1, heads, d}), {0, dp - d})
                            .view({out_linear->weight.size(0), heads * dp});
  return linear_residual(y.reshape({b, n, heads * dp}), wo, out_linear->bias, residual);
}

GaleBlockImpl::GaleBlockImpl(int64_t width, const GeoTransolverOptions& o, int64_t context_dim)
    : bf16_layer_norm(o.bf16_layer_norm) {
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})));
  Attn = register_module("Attn", GaleAttention(width, o.n_head, o.slice_num, context_dim,
                                               o.state_mixing_mode, o.fused_attention));
  ln_mlp1 = register_module(
      "ln_mlp1", torch::nn::Sequential(torch::nn::LayerNorm(torch::nn::LayerNormOptions({width})),
                                       Mlp(width, width * o.mlp_ratio, width)));
}

torch::Tensor GaleBlockImpl::AttentionPart::run_with(const torch::Tensor& x,
                                                     const torch::Tensor& context) {
  const auto [norm, residual] = layer_norm_residual(*block->ln_1, x, block->bf16_layer_norm);
  return block->Attn->forward(norm, context, residual);
}

torch::Tensor GaleBlockImpl::MlpPart::run(const torch::Tensor& x) {
  const auto& ln = *block->ln_mlp1[0]->as<torch::nn::LayerNorm>();
  const auto [norm, residual] = layer_norm_residual(ln, x, block->bf16_layer_norm);
  return block->ln_mlp1[1]->as<Mlp>()->forward_plus(norm, residual);
}

torch::Tensor GaleBlockImpl::forward(const torch::Tensor& x, const torch::Tensor& context) {
  switch (recompute_options.mode) {
    case Recompute::kAttention:
      return mlp_part_.run(recompute(attention_part_, x, 0, context));
    case Recompute::kBlock:
      return recompute_pair(attention_part_, mlp_part_, x, recompute_options.point_chunk, context);
    default:
      return mlp_part_.run(attention_part_.run_with(x, context));
  }
}

void GaleBlockImpl::forward_in_chunks(torch::Tensor& x, const torch::Tensor& context,
                                      int64_t chunk) {
  const auto& ln = *ln_mlp1[0]->as<torch::nn::LayerNorm>();
  torch::Tensor norm, token;
  for_chunks(x.size(1), chunk, [&](int64_t s, int64_t len) {
    Attn->accumulate(layer_norm(*ln_1, x.narrow(1, s, len), bf16_layer_norm), norm, token);
  });
  norm = domain_sum(norm, Attn->domain_group);
  token = domain_sum(token, Attn->domain_group);
  const auto mixed = Attn->slice_outputs(norm, token, context);
  for_chunks(x.size(1), chunk, [&](int64_t s, int64_t len) {
    auto xc = x.narrow(1, s, len);
    auto y = Attn->apply(layer_norm(*ln_1, xc, bf16_layer_norm), mixed) + xc;
    xc.copy_(ln_mlp1[1]->as<Mlp>()->forward(layer_norm(ln, y, bf16_layer_norm)) + y);
  });
}

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
  const auto [positions, geometry_shard] = shards(local_embedding, geometry, local_positions);
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
      parts.push_back(tokens_of(sum(norms[i]), sum(tokens[i])));
    }
  }
  if (!builder.geometry_tokenizer.is_empty()) {
    torch::Tensor norm, token;
    for_chunks(geometry_shard.count, chunk, [&](int64_t s, int64_t len) {
      builder.geometry_tokenizer->accumulate(geometry.narrow(1, geometry_shard.begin + s, len),
                                             norm, token);
    });
    parts.push_back(tokens_of(sum(norm), sum(token)));
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
  const auto& o = options_;
  auto dim_or_none = [](int64_t d) { return d > 0 ? nlohmann::json(d) : nlohmann::json(nullptr); };
  return {{"functional_dim", o.functional_dim},
          {"out_dim", o.out_dim},
          {"geometry_dim", dim_or_none(o.geometry_dim)},
          {"global_dim", dim_or_none(o.global_dim)},
          {"n_layers", o.n_layers},
          {"n_hidden", o.n_hidden},
          {"dropout", 0.0},
          {"n_head", o.n_head},
          {"act", "gelu"},
          {"mlp_ratio", o.mlp_ratio},
          {"slice_num", o.slice_num},
          {"use_te", false},
          {"time_input", false},
          {"plus", false},
          {"include_local_features", o.include_local_features},
          {"radii", o.radii},
          {"neighbors_in_radius", o.neighbors_in_radius},
          {"n_hidden_local", o.n_hidden_local},
          {"structured_shape", nullptr},
          {"attention_type", "GALE"},
          {"concrete_dropout", false},
          {"state_mixing_mode", o.state_mixing_mode}};
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
