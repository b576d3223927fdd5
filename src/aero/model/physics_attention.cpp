#include "aero/model/physics_attention.h"

#include "aero/model/layers.h"
#include "aero/ops/domain_parallel.h"
#include "aero/ops/numerics.h"

#include <torch/torch.h>

namespace slipstream::aero {

torch::Tensor slice_weights(const SliceProjection& s, const torch::Tensor& x_mid) {
  const auto logits = linear(s.in_project_slice, x_mid);
  const auto tau = s.temperature.clamp(0.5, 5.0);
  if (s.form == SliceForm::kGale) return torch::softmax(logits / tau.to(logits.scalar_type()), -1);
  return torch::softmax(logits / tau, -1);
}

Slices slice(const SliceProjection& s, const torch::Tensor& x_mid, const torch::Tensor& fx_mid,
             Communicator* group) {
  const auto w = slice_weights(s, x_mid);
  if (s.form == SliceForm::kGale && group == nullptr) {
    const auto norm = w.sum(1) + s.eps;  // (B, H, S)
    // (B, H, S, N) x (B, H, N, D): the products PhysicsNeMo's GALE runs.
    const auto tokens =
        torch::matmul((w / norm.unsqueeze(1)).permute({0, 2, 3, 1}), fx_mid.permute({0, 2, 1, 3}));
    return {w, tokens};
  }
  // Sums over the points: over every rank's shard under domain parallelism.
  const auto norm = domain_sum(w.sum(1), group);
  const auto sums = domain_sum(torch::einsum("bnhs,bnhd->bhsd", {w, fx_mid}), group);
  return {w, sums / (norm + s.eps).unsqueeze(-1)};
}

void accumulate_slices(const SliceProjection& s, const torch::Tensor& x_mid,
                       const torch::Tensor& fx_mid, torch::Tensor& norm, torch::Tensor& token) {
  const auto w = slice_weights(s, x_mid).to(torch::kFloat);
  if (!norm.defined()) {
    norm = torch::zeros({w.size(0), w.size(2), w.size(3)}, w.options());
    token = torch::zeros({w.size(0), w.size(2), w.size(3), fx_mid.size(3)}, w.options());
  }
  norm.add_(w.sum(1));
  token.add_(torch::einsum("bnhs,bnhd->bhsd", {w, fx_mid.to(torch::kFloat)}));
}

void accumulate_projected(const SliceProjection& s, const torch::nn::LinearImpl& in_project_x,
                          const torch::nn::LinearImpl& in_project_fx, int64_t heads,
                          const torch::Tensor& x_in, torch::Tensor& norm, torch::Tensor& token) {
  const auto x = autocast_input(x_in);
  const int64_t b = x.size(0), n = x.size(1);
  accumulate_slices(s, attention_input(in_project_x, x).view({b, n, heads, -1}),
                    attention_input(in_project_fx, x).view({b, n, heads, -1}), norm, token);
}

torch::Tensor tokens_of(const torch::Tensor& norm, const torch::Tensor& token, double eps) {
  return token / (norm + eps).unsqueeze(-1);
}

torch::Tensor deslice(const torch::Tensor& w, const torch::Tensor& tokens) {
  return torch::einsum("bnhs,bhsd->bnhd", {w, tokens});
}

}  // namespace slipstream::aero
