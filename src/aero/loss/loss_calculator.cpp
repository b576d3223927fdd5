#include "aero/loss/loss_calculator.h"

#include "aero/ops/domain_parallel.h"

#include <torch/torch.h>

#include <array>

namespace slipstream::aero {

namespace {
const char* kComponents[] = {"x", "y", "z"};
}

const LossCalculator::MetricSelection& LossCalculator::selection(c10::Device device) const {
  std::lock_guard<std::mutex> lock(selection_mutex_);
  auto it = selections_.find(device.str());
  if (it != selections_.end()) return it->second;
  // Rows of the per-channel sums: 0 sum|d|, 1 sum|t|, 2 sum d^2, 3 sum t^2, 4 weight.
  std::vector<std::string> keys;
  std::vector<std::array<int64_t, 2>> spans;  // channel begin, length
  std::vector<std::string> kinds;
  int64_t c0 = 0;
  for (const auto& f : options_.fields.fields()) {
    for (const auto& m : options_.metrics) {
      if (f.channels() == 3) {
        for (int c = 0; c < 3; ++c) {
          keys.push_back(f.name + "_" + kComponents[c] + "_" + m);
          spans.push_back({c0 + c, 1});
          kinds.push_back(m);
        }
      }
      keys.push_back(f.name + "_" + m);
      spans.push_back({c0, f.channels()});
      kinds.push_back(m);
    }
    c0 += f.channels();
  }
  const int64_t k = static_cast<int64_t>(keys.size());
  auto num = torch::zeros({5 * channels_, k}), den = torch::zeros({5 * channels_, k});
  auto channels = torch::zeros({channels_, k}), power = torch::ones({k});
  for (int64_t j = 0; j < k; ++j) {
    const int64_t num_row = kinds[j] == "l2" ? 2 : 0;
    const int64_t den_row = kinds[j] == "l1" ? 1 : kinds[j] == "l2" ? 3 : 4;
    if (kinds[j] == "l2") power[j] = 0.5;
    for (int64_t c = spans[j][0]; c < spans[j][0] + spans[j][1]; ++c) {
      num[num_row * channels_ + c][j] = 1.0;
      den[den_row * channels_ + c][j] = 1.0;
      channels[c][j] = 1.0;
    }
  }
  MetricSelection sel{keys, num.to(device), den.to(device), channels.to(device), power.to(device)};
  return selections_.emplace(device.str(), std::move(sel)).first->second;
}

LossCalculator::LossCalculator(LossOptions options)
    : options_(std::move(options)), channels_(options_.fields.total_channels()) {
  TORCH_CHECK(options_.type == "huber" || options_.type == "mse" || options_.type == "rmse",
              "loss: type '", options_.type, "' is not one of huber, mse, rmse");
  TORCH_CHECK(!options_.fields.empty(), "loss: no target fields");
  for (const auto& m : options_.metrics) {
    TORCH_CHECK(m == "l1" || m == "l2" || m == "mae", "loss: metric '", m,
                "' is not one of l1, l2, mae");
  }
  check_force_loss(options_.forces);
  if (options_.forces.enabled()) {
    TORCH_CHECK(force_fields(options_.fields).available(),
                "config: 'loss.forces' needs a pressure target (nondim pressure) and a wall shear "
                "target (nondim stress), as a surface dataset has");
    TORCH_CHECK(!options_.mask_nonfinite,
                "config: 'loss.forces' and 'loss.mask_nonfinite' do not go together: a force "
                "integral over a surface with missing values is not the surface's force");
  }
}

std::vector<std::string> LossCalculator::keys() const {
  std::vector<std::string> keys{"loss"};
  for (const auto& f : options_.fields.fields()) keys.push_back("loss/" + f.name);
  if (options_.forces.enabled()) keys.push_back("loss/forces");
  for (const auto& f : options_.fields.fields()) {
    for (const auto& m : options_.metrics) {
      if (f.channels() == 3) {
        for (int c = 0; c < 3; ++c) keys.push_back(f.name + "_" + kComponents[c] + "_" + m);
      }
      keys.push_back(f.name + "_" + m);
    }
  }
  if (options_.forces.enabled()) {
    for (const auto& c : options_.forces.coefficients) keys.push_back(c + "_error");
  }
  return keys;
}

LossResult LossCalculator::compute(const torch::Tensor& prediction_in,
                                   const torch::Tensor& target_in, const torch::Tensor& weights_in,
                                   const torch::Tensor& force_weights) const {
  TORCH_CHECK(prediction_in.sizes() == target_in.sizes(), "loss: prediction shape ",
              prediction_in.sizes(), " differs from target shape ", target_in.sizes());
  TORCH_CHECK(prediction_in.size(-1) == channels_, "loss: expected ", channels_, " channels, got ",
              prediction_in.size(-1));
  auto p = prediction_in.reshape({-1, channels_}).to(torch::kFloat);
  auto t = target_in.reshape({-1, channels_}).to(torch::kFloat);
  torch::Tensor w;  // (N, 1) or undefined
  if (weights_in.defined()) {
    w = weights_in.reshape({-1, 1}).to(torch::kFloat);
    TORCH_CHECK(w.size(0) == p.size(0), "loss: ", w.size(0), " weights for ", p.size(0), " points");
  }
  torch::Tensor mask;  // (N, C) float, or undefined
  if (options_.mask_nonfinite) {
    auto finite = torch::isfinite(t);
    mask = finite.to(torch::kFloat);
    t = torch::where(finite, t, torch::zeros({}, t.options()));
  }
  // Per-point, per-channel weight: area/volume times the finite mask.
  torch::Tensor pw;
  if (w.defined() && mask.defined())
    pw = w * mask;
  else if (w.defined())
    pw = w.expand_as(p);
  else if (mask.defined())
    pw = mask;

  auto d = p - t;
  auto wsum_of = [&](const torch::Tensor& x) { return pw.defined() ? (x * pw).sum(0) : x.sum(0); };
  // One (6, C) block of per-channel sums; metrics and losses are views of it.
  auto abs_d = d.abs();
  auto sq_d = d * d;
  std::vector<torch::Tensor> rows = {wsum_of(abs_d), wsum_of(t.abs()), wsum_of(sq_d),
                                     wsum_of(t * t)};
  torch::Tensor weight_sum =
      pw.defined() ? pw.sum(0)
                   : torch::full({channels_}, static_cast<double>(p.size(0)), p.options());
  rows.push_back(weight_sum);
  if (options_.type == "huber") {
    auto huber = torch::where(abs_d < 1.0, 0.5 * sq_d, abs_d - 0.5);
    rows.push_back(wsum_of(huber));
  }
  auto sums = domain_sum(torch::stack(rows), options_.domain_group);  // (R, C)
  auto ssd = sums[2], sst = sums[3], wsum = sums[4];
  torch::Tensor per_channel_loss;
  if (options_.type == "huber")
    per_channel_loss = sums[5] / wsum;
  else if (options_.type == "mse")
    per_channel_loss = ssd / wsum;
  else
    per_channel_loss = ssd / sst;  // relative mse: mse / mean(t^2)
  torch::Tensor counts =
      mask.defined() ? domain_sum(mask.sum(0), options_.domain_group) : torch::Tensor();

  LossResult out;
  std::vector<torch::Tensor> field_losses;
  torch::Tensor total;
  int64_t c0 = 0;
  for (const auto& f : options_.fields.fields()) {
    auto fl = per_channel_loss.narrow(0, c0, f.channels()).sum() * f.loss_weight;
    field_losses.push_back(fl);
    total = total.defined() ? total + fl : fl;
    c0 += f.channels();
  }
  out.total = total / static_cast<double>(channels_);
  // The coefficient errors (B, K): each sample's sum over its points.
  torch::Tensor force_loss, coefficient_error;
  if (options_.forces.enabled()) {
    const int64_t k = static_cast<int64_t>(options_.forces.coefficients.size());
    TORCH_CHECK(force_weights.defined(),
                "loss: loss.forces is on but the batch has no force weights");
    const int64_t b = prediction_in.dim() == 3 ? prediction_in.size(0) : 1;
    const auto fw = force_weights.reshape({b, -1, channels_, k}).to(torch::kFloat);
    TORCH_CHECK(fw.size(1) * b == p.size(0), "loss: force weights for ", fw.size(1) * b,
                " points, the prediction has ", p.size(0));
    coefficient_error = domain_sum(torch::einsum("bnc,bnck->bk", {d.view({b, -1, channels_}), fw}),
                                   options_.domain_group);
    force_loss =
        (coefficient_error / options_.forces.scale).square().sum(1).mean() * options_.forces.weight;
    out.total = out.total + force_loss;
  }
  out.scalars.add("loss", out.total.detach());
  for (size_t i = 0; i < field_losses.size(); ++i) {
    out.scalars.add("loss/" + options_.fields.fields()[i].name, field_losses[i].detach());
  }
  if (force_loss.defined()) out.scalars.add("loss/forces", force_loss.detach());
  // Metrics: every key's numerator and denominator are sums of per-channel
  // rows, so two matrix-vector products give them all (a handful of kernels
  // instead of several per metric); l2 takes a square root.
  const auto& sel = selection(p.device());
  auto flat = sums.narrow(0, 0, 5).detach().reshape({-1});
  auto metrics =
      (torch::matmul(flat, sel.numerator) / torch::matmul(flat, sel.denominator)).pow(sel.power);
  torch::Tensor metric_counts;
  if (counts.defined()) metric_counts = torch::matmul(counts, sel.channels);
  for (size_t j = 0; j < sel.keys.size(); ++j) {
    if (metric_counts.defined()) {
      out.scalars.add_counted(sel.keys[j], metrics.select(0, j), metric_counts.select(0, j));
    } else {
      out.scalars.add(sel.keys[j], metrics.select(0, j));
    }
  }
  if (coefficient_error.defined()) {
    const auto mean_abs = coefficient_error.detach().abs().mean(0);
    for (size_t j = 0; j < options_.forces.coefficients.size(); ++j) {
      out.scalars.add(options_.forces.coefficients[j] + "_error",
                      mean_abs.select(0, static_cast<int64_t>(j)));
    }
  }
  return out;
}

}  // namespace slipstream::aero
