#include "aero/model/transolver/transolver.h"

#include <torch/torch.h>

#include "aero/model/physics_attention.h"
#include "aero/ops/domain_parallel.h"
#include "aero/ops/fused_physics_attention.h"
#include "aero/ops/linear.h"
#include "aero/ops/numerics.h"
#include "aero/ops/slice_ops.h"

namespace slipstream::aero {

PhysicsAttentionImpl::PhysicsAttentionImpl(const TransolverOptions& o)
    : heads(o.n_head),
      dim_head(o.n_hidden / o.n_head),
      slices(o.slice_num),
      eps(o.slice_norm_eps),
      fused(o.fused_attention) {
  TORCH_CHECK(o.n_hidden % o.n_head == 0, "model: n_hidden (", o.n_hidden,
              ") must be divisible by n_head (", o.n_head, ")");
  const int64_t c = o.n_hidden;
  temperature = register_parameter("temperature", torch::full({1, 1, heads, 1}, 0.5));
  in_project_slice = register_module("in_project_slice", torch::nn::Linear(dim_head, slices));
  qkv_project = register_module(
      "qkv_project",
      torch::nn::Linear(torch::nn::LinearOptions(dim_head, 3 * dim_head).bias(false)));
  out_linear = register_module("out_linear", torch::nn::Linear(c, c));
  in_project_x = register_module("in_project_x", torch::nn::Linear(c, c));
  in_project_fx = register_module("in_project_fx", torch::nn::Linear(c, c));
}

SliceProjection PhysicsAttentionImpl::projection() const {
  return {*in_project_slice, temperature, eps, SliceForm::kTransolver};
}

torch::Tensor PhysicsAttentionImpl::slice_weights(const torch::Tensor& x_mid) {
  return aero::slice_weights(projection(), x_mid);
}

bool PhysicsAttentionImpl::uses_fused(const torch::Tensor& x_mid) const {
  return fused && slice_ops::kernels_apply(x_mid, slices);
}

torch::Tensor PhysicsAttentionImpl::forward(const torch::Tensor& x_in,
                                            const torch::Tensor& residual) {
  return forward(AttentionInput{autocast_input(x_in), residual});
}

torch::Tensor PhysicsAttentionImpl::forward(const AttentionInput& in) {
  const int64_t b = in.x.size(0), n = in.x.size(1);
  // Both input projections read x (or its LayerNorm): cast once under autocast.
  const auto [xm, fxm, residual] = project_attention_input(
      in, in_project_x->weight, in_project_x->bias, in_project_fx->weight, in_project_fx->bias);
  auto x_mid = xm.view({b, n, heads, dim_head});
  auto fx_mid = fxm.view({b, n, heads, dim_head});
  torch::Tensor out;
  if (domain_group == nullptr && uses_fused(x_mid)) {
    out = fused_physics_attention(
        x_mid, fx_mid,
        {in_project_slice->weight, in_project_slice->bias, temperature, qkv_project->weight, eps});
  } else {
    const auto [w, slice_token] = slice(projection(), x_mid, fx_mid, domain_group);
    out = deslice(w, slice_token_attention(slice_token, qkv_project->weight));  // B N H D
  }
  return linear_residual(out.reshape({b, n, heads * dim_head}), out_linear->weight,
                         out_linear->bias, residual);
}

void PhysicsAttentionImpl::accumulate(const torch::Tensor& x_in, torch::Tensor& norm,
                                      torch::Tensor& token) {
  accumulate_projected(projection(), *in_project_x, *in_project_fx, heads, x_in, norm, token);
}

torch::Tensor PhysicsAttentionImpl::slice_outputs(const torch::Tensor& norm,
                                                  const torch::Tensor& token) {
  return slice_token_attention(tokens_of(norm, token, eps), qkv_project->weight);
}

torch::Tensor PhysicsAttentionImpl::apply(const torch::Tensor& x_in,
                                          const torch::Tensor& out_slice) {
  const int64_t b = x_in.size(0), n = x_in.size(1);
  const auto x = autocast_input(x_in);
  const auto x_mid = attention_input(*in_project_x, x).view({b, n, heads, dim_head});
  const auto w = slice_weights(x_mid);
  const auto out = deslice(w, out_slice.to(w.scalar_type()));
  return linear(*out_linear, out.reshape({b, n, heads * dim_head}));
}

TransolverBlockImpl::TransolverBlockImpl(const TransolverOptions& o, bool last)
    : bf16_layer_norm(o.bf16_layer_norm) {
  const int64_t c = o.n_hidden;
  ln_1 = register_module("ln_1", torch::nn::LayerNorm(torch::nn::LayerNormOptions({c})));
  Attn = register_module("Attn", PhysicsAttention(o));
  ln_mlp1 = register_module(
      "ln_mlp1", torch::nn::Sequential(torch::nn::LayerNorm(torch::nn::LayerNormOptions({c})),
                                       Mlp(c, c * o.mlp_ratio, c)));
  if (last) {
    ln_mlp2 = register_module(
        "ln_mlp2", torch::nn::Sequential(torch::nn::LayerNorm(torch::nn::LayerNormOptions({c})),
                                         torch::nn::Linear(c, o.out_dim)));
  }
}

torch::Tensor TransolverBlockImpl::AttentionPart::run(const torch::Tensor& x) {
  return block->Attn->forward(AttentionInput{x, {}, block->ln_1.get(), block->bf16_layer_norm});
}

torch::Tensor TransolverBlockImpl::MlpPart::run(const torch::Tensor& x_in) {
  auto& b = *block;
  auto x = b.ln_mlp1[1]->as<Mlp>()->forward_normed(*b.ln_mlp1[0]->as<torch::nn::LayerNorm>(), x_in,
                                                   b.bf16_layer_norm);
  if (b.ln_mlp2.is_empty()) return x;
  return linear(*b.ln_mlp2[1]->as<torch::nn::Linear>(),
                layer_norm(*b.ln_mlp2[0]->as<torch::nn::LayerNorm>(), x, b.bf16_layer_norm));
}

torch::Tensor TransolverBlockImpl::forward(const torch::Tensor& x) {
  switch (recompute_options.mode) {
    case Recompute::kAttention:
      return mlp_part_.run(recompute(attention_part_, x));
    case Recompute::kBlock:
      return recompute_pair(attention_part_, mlp_part_, x, recompute_options.point_chunk);
    default:
      return mlp_part_.run(attention_part_.run(x));
  }
}

torch::Tensor TransolverBlockImpl::forward_in_chunks(torch::Tensor& x, int64_t chunk) {
  TORCH_CHECK(chunk > 0, "model: chunk must be > 0");
  const auto norm = [&](const torch::nn::LayerNormImpl& ln, const torch::Tensor& t) {
    return layer_norm(ln, t, bf16_layer_norm);
  };
  const int64_t n = x.size(1);
  torch::Tensor slice_norm, slice_token, out;
  for (int64_t s = 0; s < n; s += chunk) {
    Attn->accumulate(norm(*ln_1, x.narrow(1, s, std::min(chunk, n - s))), slice_norm, slice_token);
  }
  slice_norm = domain_sum(slice_norm, Attn->domain_group);
  slice_token = domain_sum(slice_token, Attn->domain_group);
  const auto out_slice = Attn->slice_outputs(slice_norm, slice_token);
  for (int64_t s = 0; s < n; s += chunk) {
    auto xc = x.narrow(1, s, std::min(chunk, n - s));
    auto y = Attn->apply(norm(*ln_1, xc), out_slice) + xc;
    y = ln_mlp1[1]->as<Mlp>()->forward(norm(*ln_mlp1[0]->as<torch::nn::LayerNorm>(), y)) + y;
    if (!ln_mlp2.is_empty()) {
      y = linear(*ln_mlp2[1]->as<torch::nn::Linear>(),
                 norm(*ln_mlp2[0]->as<torch::nn::LayerNorm>(), y));
      if (!out.defined()) out = torch::empty({x.size(0), n, y.size(-1)}, y.options());
      out.narrow(1, s, y.size(1)).copy_(y);
    } else {
      xc.copy_(y);
    }
  }
  return out;
}

TransolverImpl::TransolverImpl(TransolverOptions o) : options_(o) {
  TORCH_CHECK(o.n_layers >= 1, "model: n_layers must be >= 1, got ", o.n_layers);
  preprocess = register_module("preprocess",
                               Mlp(o.functional_dim + o.embedding_dim, 2 * o.n_hidden, o.n_hidden));
  preprocess->part = fp8::Part::kEmbedding;
  blocks = register_module("blocks", torch::nn::ModuleList());
  for (int64_t i = 0; i < o.n_layers; ++i) {
    blocks->push_back(TransolverBlock(o, i == o.n_layers - 1));
  }
  set_mlp_recompute_gelu(*this, o.mlp_recompute_gelu);
  reset_parameters();
}

void TransolverImpl::reset_parameters() {
  torch::NoGradGuard no_grad;
  for (auto& m : modules(/*include_self=*/false)) {
    if (auto* lin = m->as<torch::nn::Linear>()) {
      trunc_normal_(lin->weight, 0.02);
      if (lin->bias.defined()) lin->bias.zero_();
    } else if (auto* ln = m->as<torch::nn::LayerNorm>()) {
      ln->weight.fill_(1.0);
      ln->bias.zero_();
    } else if (auto* attn = m->as<PhysicsAttention>()) {
      attn->temperature.fill_(0.5);
    }
  }
}

torch::Tensor TransolverImpl::forward(const torch::Tensor& embedding, const torch::Tensor& fx) {
  TORCH_CHECK(embedding.dim() == 3 && fx.dim() == 3,
              "model: expected (B, N, E) and (B, N, F) inputs, got ", embedding.sizes(), " and ",
              fx.sizes());
  TORCH_CHECK(
      embedding.size(-1) == options_.embedding_dim && fx.size(-1) == options_.functional_dim,
      "model: expected embedding dim ", options_.embedding_dim, " and functional dim ",
      options_.functional_dim, ", got ", embedding.size(-1), " and ", fx.size(-1));
  const auto input = torch::cat({embedding, fx}, -1);
  auto x = recompute_.mode == Recompute::kBlock
               ? recompute(preprocess_part_, input, recompute_.point_chunk)
               : preprocess->forward(input);
  for (const auto& block : *blocks) x = block->as<TransolverBlock>()->forward(x);
  return x;
}

void TransolverImpl::set_domain_group(Communicator* group) {
  for (const auto& block : *blocks) {
    block->as<TransolverBlock>()->Attn->domain_group =
        group != nullptr && group->world_size() > 1 ? group : nullptr;
  }
}

void TransolverImpl::set_recompute(const RecomputeOptions& options) {
  recompute_ = options;
  for (const auto& block : *blocks) block->as<TransolverBlock>()->recompute_options = options;
}

torch::Tensor TransolverImpl::forward_in_chunks(const ModelInputs& inputs, int64_t chunk) {
  TORCH_CHECK(chunk > 0, "model: chunk must be > 0");
  torch::NoGradGuard no_grad;
  const auto& embedding = input(inputs, "embedding");
  const auto& fx = input(inputs, "fx");
  TORCH_CHECK(embedding.dim() == 3 && fx.dim() == 3 && embedding.size(1) == fx.size(1),
              "model: expected (B, N, E) and (B, N, F) inputs, got ", embedding.sizes(), " and ",
              fx.sizes());
  const int64_t n = embedding.size(1);
  torch::Tensor x;  // (B, N, C): the hidden state of every point, one block at a time
  for (int64_t s = 0; s < n; s += chunk) {
    const int64_t len = std::min(chunk, n - s);
    const auto h =
        preprocess->forward(torch::cat({embedding.narrow(1, s, len), fx.narrow(1, s, len)}, -1));
    if (!x.defined()) x = torch::empty({h.size(0), n, h.size(-1)}, h.options());
    x.narrow(1, s, len).copy_(h);
  }
  torch::Tensor out;
  for (const auto& block : *blocks) out = block->as<TransolverBlock>()->forward_in_chunks(x, chunk);
  return out;
}

torch::Tensor TransolverImpl::forward(const ModelInputs& inputs) {
  return forward(input(inputs, "embedding"), input(inputs, "fx"));
}

nlohmann::json TransolverImpl::physicsnemo_args() const { return aero::physicsnemo_args(options_); }

nlohmann::json TransolverImpl::numerics(c10::Device device, bool bf16) const {
  const auto& m = options_;
  bool fused = false;
  if (m.fused_attention && bf16) {
    const auto probe = torch::empty({1, 1, m.n_head, m.n_hidden / m.n_head},
                                    torch::dtype(torch::kBFloat16).device(device));
    fused = slice_ops::kernels_apply(probe, m.slice_num);
  }
  return {{"physics_attention", fused ? "fused CUDA kernels" : "plain LibTorch"},
          {"layer_norm", bf16 && m.bf16_layer_norm ? "bf16" : "fp32"}};
}

}  // namespace slipstream::aero
