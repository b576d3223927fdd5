#include "aero/optim/muon_adamw.h"

#include <torch/torch.h>

#include <cmath>

namespace slipstream::aero {

torch::Tensor newton_schulz_orthogonalize(const torch::Tensor& update, const MuonOptions& o) {
  TORCH_CHECK(update.dim() == 2, "muon: expected a matrix, got shape ", update.sizes());
  auto x = update.to(torch::kBFloat16);
  const bool transposed = update.size(0) > update.size(1);
  if (transposed) x = x.t();
  x = x / x.norm().clamp_min(o.eps);
  for (int i = 0; i < o.ns_steps; ++i) {
    auto gram = torch::mm(x, x.t());
    auto gram_update = torch::addmm(gram, gram, gram, /*beta=*/o.ns_b, /*alpha=*/o.ns_c);
    x = torch::addmm(x, gram_update, x, /*beta=*/o.ns_a);
  }
  if (transposed) x = x.t();
  return x;
}

void muon_update(torch::Tensor& param, const torch::Tensor& grad, torch::Tensor& buffer,
                 double lr, double weight_decay, const MuonOptions& o) {
  torch::NoGradGuard no_grad;
  buffer.lerp_(grad, 1.0 - o.momentum);
  auto update = o.nesterov ? grad.lerp(buffer, o.momentum) : buffer;
  auto ortho = newton_schulz_orthogonalize(update, o);
  const double rows = static_cast<double>(param.size(0)), cols = static_cast<double>(param.size(1));
  const double ratio = o.adjust_lr == "match_rms_adamw" ? 0.2 * std::sqrt(std::max(rows, cols))
                                                         : std::sqrt(std::max(1.0, rows / cols));
  param.mul_(1.0 - lr * weight_decay);
  param.add_(ortho.to(param.scalar_type()), -lr * ratio);
}

MuonAdamW::MuonAdamW(const std::vector<std::pair<std::string, torch::Tensor>>& named_parameters,
                     OptimizerOptions options)
    : options_(std::move(options)), lr_(options_.lr) {
  TORCH_CHECK(options_.name == "muon" || options_.name == "adamw", "optimizer: name '",
              options_.name, "' is not one of muon, adamw");
  TORCH_CHECK(options_.muon.adjust_lr == "match_rms_adamw" || options_.muon.adjust_lr == "original",
              "optimizer: muon.adjust_lr '", options_.muon.adjust_lr,
              "' is not one of match_rms_adamw, original");
  for (const auto& [name, p] : named_parameters) {
    if (!p.requires_grad()) continue;
    if (options_.name == "muon" && p.dim() == 2) {
      muon_.push_back({name, p, torch::zeros_like(p)});
    } else {
      adam_.push_back({name, p, torch::zeros_like(p), torch::zeros_like(p)});
    }
  }
}

void MuonAdamW::zero_grad() {
  for (auto& s : muon_) {
    if (s.param.grad().defined()) s.param.mutable_grad().zero_();
  }
  for (auto& s : adam_) {
    if (s.param.grad().defined()) s.param.mutable_grad().zero_();
  }
}

void MuonAdamW::step() {
  torch::NoGradGuard no_grad;
  ++steps_;
  for (auto& s : muon_) {
    if (!s.param.grad().defined()) continue;
    muon_update(s.param, s.param.grad(), s.buffer, lr_, options_.weight_decay, options_.muon);
  }
  const auto& a = options_.adamw;
  const double bc1 = 1.0 - std::pow(a.beta1, static_cast<double>(steps_));
  const double bc2 = 1.0 - std::pow(a.beta2, static_cast<double>(steps_));
  const double step_size = lr_ / bc1;
  const double bc2_sqrt = std::sqrt(bc2);
  for (auto& s : adam_) {
    if (!s.param.grad().defined()) continue;
    const auto& g = s.param.grad();
    s.param.mul_(1.0 - lr_ * options_.weight_decay);
    s.exp_avg.lerp_(g, 1.0 - a.beta1);
    s.exp_avg_sq.mul_(a.beta2).addcmul_(g, g, 1.0 - a.beta2);
    auto denom = (s.exp_avg_sq.sqrt() / bc2_sqrt).add_(a.eps);
    s.param.addcdiv_(s.exp_avg, denom, -step_size);
  }
}

std::vector<std::pair<std::string, torch::Tensor>> MuonAdamW::state_tensors() const {
  std::vector<std::pair<std::string, torch::Tensor>> out;
  out.emplace_back("steps", torch::tensor(steps_, torch::kLong));
  out.emplace_back("lr", torch::tensor(lr_, torch::kDouble));
  for (const auto& s : muon_) out.emplace_back(s.name + ".momentum_buffer", s.buffer);
  for (const auto& s : adam_) {
    out.emplace_back(s.name + ".exp_avg", s.exp_avg);
    out.emplace_back(s.name + ".exp_avg_sq", s.exp_avg_sq);
  }
  return out;
}

void MuonAdamW::load_state_tensors(const std::map<std::string, torch::Tensor>& state) {
  torch::NoGradGuard no_grad;
  auto get = [&](const std::string& key) -> const torch::Tensor& {
    auto it = state.find(key);
    TORCH_CHECK(it != state.end(), "optimizer: checkpoint has no state '", key, "'");
    return it->second;
  };
  steps_ = get("steps").item<int64_t>();
  lr_ = get("lr").item<double>();
  for (auto& s : muon_) s.buffer.copy_(get(s.name + ".momentum_buffer"));
  for (auto& s : adam_) {
    s.exp_avg.copy_(get(s.name + ".exp_avg"));
    s.exp_avg_sq.copy_(get(s.name + ".exp_avg_sq"));
  }
}

}  // namespace slipstream::aero
