#include "aero/model/geotransolver/gale.h"

#include "aero/model/layers.h"
#include "aero/ops/domain_parallel.h"
#include "aero/ops/fused_physics_attention.h"
#include "aero/ops/linear.h"
#include "aero/ops/numerics.h"
#include "aero/ops/slice_ops.h"

#include <torch/torch.h>

#include <utility>

namespace slipstream::aero {

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

SliceProjection GaleAttentionImpl::projection() const {
  return {*in_project_slice, temperature, kGeoSliceNormEps, SliceForm::kGale};
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
  const auto y = aero::deslice(w, mixed.to(w.scalar_type()));
  return linear_residual(y.reshape({b, n, heads * dim_head}), out_linear->weight, out_linear->bias,
                         residual);
}

torch::Tensor GaleAttentionImpl::forward(const torch::Tensor& x_in, const torch::Tensor& context,
                                         const torch::Tensor& residual) {
  return forward(AttentionInput{autocast_input(x_in), residual}, context);
}

torch::Tensor GaleAttentionImpl::forward(const AttentionInput& in, const torch::Tensor& context) {
  // The projections' input dtype: x's (or its LayerNorm's) under autocast.
  if (domain_group == nullptr && uses_fused(autocast_input(in.x))) {
    return forward_fused(in, context);
  }
  const int64_t b = in.x.size(0), n = in.x.size(1);
  const auto [xm, fxm, residual] = project_attention_input(
      in, in_project_x->weight, in_project_x->bias, in_project_fx->weight, in_project_fx->bias);
  const auto x_mid = xm.view({b, n, heads, dim_head});
  const auto fx_mid = fxm.view({b, n, heads, dim_head});
  const auto [w, tokens] = slice(projection(), x_mid, fx_mid, domain_group);
  return deslice(w, mix_with_parameters(tokens, context), residual);
}

void GaleAttentionImpl::accumulate(const torch::Tensor& x, torch::Tensor& norm,
                                   torch::Tensor& token) {
  accumulate_projected(projection(), *in_project_x, *in_project_fx, heads, x, norm, token);
}

torch::Tensor GaleAttentionImpl::slice_outputs(const torch::Tensor& norm,
                                               const torch::Tensor& token,
                                               const torch::Tensor& context) {
  return mix_with_parameters(tokens_of(norm, token, kGeoSliceNormEps), context);
}

torch::Tensor GaleAttentionImpl::apply(const torch::Tensor& x_in, const torch::Tensor& mixed) {
  const auto x = autocast_input(x_in);
  const int64_t b = x.size(0), n = x.size(1);
  const auto x_mid = attention_input(*in_project_x, x).view({b, n, heads, dim_head});
  return deslice(slice_weights(projection(), x_mid), mixed);
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

torch::Tensor GaleAttentionImpl::forward_fused(const AttentionInput& in,
                                               const torch::Tensor& context) {
  const int64_t b = in.x.size(0), n = in.x.size(1), d = dim_head;
  const int64_t dp = slice_ops::kernel_dim(d);
  const auto [wx, bx] = pad_head_rows(*in_project_x, heads, d, dp);
  const auto [wf, bf] = pad_head_rows(*in_project_fx, heads, d, dp);
  // out_linear's weight (E, H d) padded per head to (E, H dp).
  const auto wo = dp == d
                      ? out_linear->weight
                      : torch::constant_pad_nd(out_linear->weight.view({-1, heads, d}), {0, dp - d})
                            .view({out_linear->weight.size(0), heads * dp});
  // Under precision: fp8, the padded copies' scaling state is the parameters'.
  const fp8::KeyAs key_x(wx, in_project_x->weight), key_f(wf, in_project_fx->weight),
      key_o(wo, out_linear->weight);
  const auto [xm, fxm, residual] = project_attention_input(in, wx, bx, wf, bf);
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
  const auto y = fused_slice_mix(x_mid, fx_mid,
                                 {pad_last(in_project_slice->weight, dp), in_project_slice->bias,
                                  temperature, kGeoSliceNormEps},
                                 mix, leaves);
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
  return block->Attn->forward(AttentionInput{x, {}, block->ln_1.get(), block->bf16_layer_norm},
                              context);
}

torch::Tensor GaleBlockImpl::MlpPart::run(const torch::Tensor& x) {
  const auto& ln = *block->ln_mlp1[0]->as<torch::nn::LayerNorm>();
  return block->ln_mlp1[1]->as<Mlp>()->forward_normed(ln, x, block->bf16_layer_norm);
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

}  // namespace slipstream::aero
