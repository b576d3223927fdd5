#include "aero/train/step_guard.h"

#include <torch/torch.h>

#include <cmath>

namespace slipstream::aero {

namespace {
constexpr const char* kNonFinite = "control/nonfinite_ranks";
constexpr const char* kNonFiniteGradients = "control/nonfinite_gradients";
constexpr const char* kStop = "control/stop";
}  // namespace

StepGuard::StepGuard(int rank, int world_size, int64_t lag)
    : rank_(rank), world_(world_size), lag_(lag) {
  TORCH_CHECK(world_size <= 52, "step guard: the rank bitmask holds 52 ranks, got ", world_size);
}

void StepGuard::add_controls(StepScalars& scalars, const torch::Tensor& loss,
                             const std::vector<torch::Tensor>& gradients,
                             bool stop_requested) const {
  const auto loss_bad = torch::logical_not(torch::isfinite(loss.detach()));
  auto bad = torch::zeros_like(loss_bad);
  std::vector<torch::Tensor> defined;
  for (const auto& g : gradients) {
    if (g.defined()) defined.push_back(g);
  }
  if (!defined.empty() && defined.front().is_cuda()) {
    // On CUDA, AMP's check: one multi-tensor kernel sets `found` where any
    // gradient element is NaN or Inf (the unscaling by exactly 1 leaves
    // every gradient as it is). One op for the host to launch at the step's
    // end, where the GPU may be waiting on it, instead of _foreach_norm's
    // tensor a gradient and a stack of them.
    const auto f32 = defined.front().options().dtype(torch::kFloat);
    auto found = torch::zeros({1}, f32);
    at::_amp_foreach_non_finite_check_and_unscale_(defined, found, torch::ones({1}, f32));
    bad = torch::logical_or(bad, found.squeeze(0) != 0);
  } else if (!defined.empty()) {
    auto norms = torch::stack(at::_foreach_norm(defined));
    bad = torch::logical_or(bad, torch::logical_not(torch::isfinite(norms.sum())));
  }
  // This rank's bit where its own loss is not finite: summed over ranks
  // (exactly, in fp64) into a bitmask. The gradients are flagged apart: they
  // are averaged over the ranks before this check, so one rank's NaN is on
  // every rank's, and a bit would blame them all.
  scalars.add(kNonFinite, loss_bad.to(torch::kDouble) * std::ldexp(1.0, rank_));
  scalars.add(kNonFiniteGradients, bad.to(torch::kDouble));
  scalars.add(kStop,
              torch::full({}, stop_requested ? 1.0 : 0.0,
                          torch::TensorOptions().dtype(torch::kDouble).device(loss.device())));
}

void StepGuard::observe(StepRecord& r) {
  double ranks = 0.0, gradients = 0.0, stop = 0.0;
  NamedValues kept;
  for (const auto& [key, value] : r.values) {
    if (key == kNonFinite) {
      ranks = value;
    } else if (key == kNonFiniteGradients) {
      gradients = value;
    } else if (key == kStop) {
      stop = value;
    } else {
      kept.emplace_back(key, value);
    }
  }
  r.values = std::move(kept);
  // The readback delivers the all-rank mean: undo it to get the bitmask.
  const auto mask = static_cast<uint64_t>(std::llround(ranks * world_));
  const bool loss_flagged = mask != 0 || !std::isfinite(ranks);
  const bool gradients_flagged = gradients != 0.0;  // NaN too
  if ((loss_flagged || gradients_flagged) && nonfinite_.empty()) {
    std::string who, what;
    for (int k = 0; k < world_; ++k) {
      if ((mask >> k) & 1u) who += (who.empty() ? "" : ", ") + std::to_string(k);
    }
    for (const auto& [key, value] : r.values) {
      if ((key == "loss" || key.rfind("loss/", 0) == 0) && !std::isfinite(value)) {
        what += (what.empty() ? "" : ", ") + key;
      }
    }
    const std::string step = "train: step " + std::to_string(r.step) + ": ";
    if (loss_flagged) {
      nonfinite_ = step + "non-finite " + (what.empty() ? std::string("loss") : what) + " on rank" +
                   (who.find(',') == std::string::npos ? " " : "s ") + (who.empty() ? "?" : who);
    } else if (world_ == 1) {
      nonfinite_ = step + "non-finite gradients on rank 0 (its loss is finite)";
    } else {
      nonfinite_ = step +
                   "non-finite gradients (every rank's loss is finite; the gradients are averaged "
                   "over the ranks, so no one rank is named)";
    }
    nonfinite_ += "; the run stops here and saves no checkpoint holding it";
    if (!flagged_step_) flagged_step_ = r.step;
    if (!stop_at_ || r.step + lag_ < *stop_at_) stop_at_ = r.step + lag_;
  }
  if (stop > 0 && !stop_requested_) {
    stop_requested_ = true;
    if (!flagged_step_) flagged_step_ = r.step;
    if (!stop_at_ || r.step + lag_ < *stop_at_) stop_at_ = r.step + lag_;
  }
}

void StepGuard::throw_if_nonfinite() const {
  if (!nonfinite_.empty()) throw NonFiniteError(nonfinite_);
}

}  // namespace slipstream::aero
