#include "aero/optim/muon_adamw.h"

#include <torch/torch.h>
#include <torch/version.h>

#include <cmath>

namespace slipstream::aero {

torch::Tensor newton_schulz_orthogonalize(const torch::Tensor& update, const MuonOptions& o) {
  TORCH_CHECK(update.dim() == 2 || update.dim() == 3,
              "muon: expected a matrix or a stack of matrices, got shape ", update.sizes());
  if (update.dim() == 2) return newton_schulz_orthogonalize(update.unsqueeze(0), o).squeeze(0);
  auto x = update.to(torch::kBFloat16);
  const bool transposed = update.size(1) > update.size(2);
  if (transposed) x = x.transpose(1, 2);
  // Each matrix by its own Frobenius norm.
  x = x / x.flatten(1).norm(2, 1).clamp_min(o.eps).view({-1, 1, 1});
  // beta * c + alpha * a b as a bf16 GEMM: products summed in fp32, the
  // result rounded to bf16 once (cuBLAS, and oneDNN on AVX-512 CPUs).
  // LibTorch's CPU bf16 bmm on CPUs without AVX-512 sums in bf16 instead,
  // an error that grows with the inner size, and baddbmm rounds the
  // product before adding. So on the CPU the GEMM runs in fp32.
  const bool cuda = x.is_cuda();
  const auto gemm = [cuda](const torch::Tensor& c, const torch::Tensor& a, const torch::Tensor& b,
                           double beta, double alpha) {
    if (cuda) return torch::baddbmm(c, a, b, beta, alpha);
    return torch::baddbmm(c.to(torch::kFloat), a.to(torch::kFloat), b.to(torch::kFloat), beta,
                          alpha)
        .to(torch::kBFloat16);
  };
  for (int i = 0; i < o.ns_steps; ++i) {
    const auto xt = x.transpose(1, 2);
    auto gram = cuda ? torch::bmm(x, xt)
                     : torch::bmm(x.to(torch::kFloat), xt.to(torch::kFloat)).to(torch::kBFloat16);
    auto gram_update = gemm(gram, gram, gram, /*beta=*/o.ns_b, /*alpha=*/o.ns_c);
    x = gemm(x, gram_update, x, /*beta=*/o.ns_a, /*alpha=*/1.0);
  }
  if (transposed) x = x.transpose(1, 2);
  return x;
}

namespace {

// The momentum step; returns the update to orthogonalise.
torch::Tensor muon_momentum(const torch::Tensor& grad, torch::Tensor& buffer,
                            const MuonOptions& o) {
  buffer.lerp_(grad, 1.0 - o.momentum);
  return o.nesterov ? grad.lerp(buffer, o.momentum) : buffer;
}

void muon_apply(torch::Tensor& param, const torch::Tensor& ortho, double lr, double weight_decay,
                const MuonOptions& o) {
  const double rows = static_cast<double>(param.size(0)), cols = static_cast<double>(param.size(1));
  const double ratio = o.adjust_lr == "match_rms_adamw" ? 0.2 * std::sqrt(std::max(rows, cols))
                                                        : std::sqrt(std::max(1.0, rows / cols));
  param.mul_(1.0 - lr * weight_decay);
  param.add_(ortho.to(param.scalar_type()), -lr * ratio);
}

}  // namespace

void muon_update(torch::Tensor& param, const torch::Tensor& grad, torch::Tensor& buffer, double lr,
                 double weight_decay, const MuonOptions& o) {
  torch::NoGradGuard no_grad;
  muon_apply(param, newton_schulz_orthogonalize(muon_momentum(grad, buffer, o), o), lr,
             weight_decay, o);
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
      auto& group = muon_groups_[{p.size(0), p.size(1)}];
      group.push_back(muon_.size());
      muon_.push_back({name, p, torch::zeros_like(p)});
    } else {
      adam_.push_back({name, p, torch::zeros_like(p), torch::zeros_like(p)});
    }
  }
}

bool fused_adamw_applies(const torch::Tensor& param) {
#if TORCH_VERSION_MAJOR >= 2
  return param.is_cuda() && param.scalar_type() == torch::kFloat;
#else
  (void)param;
  return false;  // LibTorch 1.x has no _fused_adamw_
#endif
}

void MuonAdamW::zero_grad() {
  // As PyTorch's zero_grad(set_to_none=True): no kernel here, and the next
  // backward's AccumulateGrad takes each new gradient as it is instead of
  // adding it to a zeroed one (a kernel a parameter).
  for (auto& s : muon_) s.param.mutable_grad().reset();
  for (auto& s : adam_) s.param.mutable_grad().reset();
}

void MuonAdamW::step() {
  torch::NoGradGuard no_grad;
  ++steps_;
  // Newton-Schulz on each group of same-shape matrices at once (bmm): a few
  // launches per shape instead of per matrix.
  for (const auto& [shape, members] : muon_groups_) {
    std::vector<size_t> live;
    std::vector<torch::Tensor> updates;
    for (size_t i : members) {
      auto& s = muon_[i];
      if (!s.param.grad().defined()) continue;
      live.push_back(i);
      updates.push_back(muon_momentum(s.param.grad(), s.buffer, options_.muon));
    }
    if (live.empty()) continue;
    const auto ortho = newton_schulz_orthogonalize(torch::stack(updates), options_.muon);
    for (size_t k = 0; k < live.size(); ++k) {
      muon_apply(muon_[live[k]].param, ortho[static_cast<int64_t>(k)], lr_, options_.weight_decay,
                 options_.muon);
    }
  }
  const auto& a = options_.adamw;
  const double bc1 = 1.0 - std::pow(a.beta1, static_cast<double>(steps_));
  const double bc2 = 1.0 - std::pow(a.beta2, static_cast<double>(steps_));
  const double step_size = lr_ / bc1;
  const double bc2_sqrt = std::sqrt(bc2);
  // All AdamW tensors at once (multi-tensor kernels on CUDA): one launch
  // per operation rather than eight per parameter.
  std::vector<torch::Tensor> params, grads, exp_avgs, exp_avg_sqs;
  for (auto& s : adam_) {
    if (!s.param.grad().defined()) continue;
    params.push_back(s.param);
    grads.push_back(s.param.grad());
    exp_avgs.push_back(s.exp_avg);
    exp_avg_sqs.push_back(s.exp_avg_sq);
  }
  if (params.empty()) return;
#if TORCH_VERSION_MAJOR >= 2
  if (a.fused && fused_adamw_applies(params.front())) {
    // The kernel reads the step (after this one's increment) from a device
    // tensor per parameter: one tensor, set by a fill (a launch with the
    // value as its argument, no copy, no sync), stands for them all.
    if (!fused_step_.defined() || fused_step_.device() != params.front().device()) {
      fused_step_ = torch::zeros({}, params.front().options().dtype(torch::kFloat));
    }
    fused_step_.fill_(static_cast<double>(steps_));
    const std::vector<torch::Tensor> steps(params.size(), fused_step_);
    at::_fused_adamw_(params, grads, exp_avgs, exp_avg_sqs, at::TensorList(), steps, lr_, a.beta1,
                      a.beta2, options_.weight_decay, a.eps, /*amsgrad=*/false, /*maximize=*/false);
    return;
  }
#endif
  at::_foreach_mul_(params, 1.0 - lr_ * options_.weight_decay);
  at::_foreach_mul_(exp_avgs, a.beta1);  // exp_avg.lerp_(g, 1 - beta1)
  at::_foreach_add_(exp_avgs, grads, 1.0 - a.beta1);
  at::_foreach_mul_(exp_avg_sqs, a.beta2);
  at::_foreach_addcmul_(exp_avg_sqs, grads, grads, 1.0 - a.beta2);
  auto denom = at::_foreach_sqrt(exp_avg_sqs);
  at::_foreach_div_(denom, bc2_sqrt);
  at::_foreach_add_(denom, a.eps);
  at::_foreach_addcdiv_(params, exp_avgs, denom, -step_size);
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
