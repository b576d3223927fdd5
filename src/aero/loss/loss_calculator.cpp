#include "aero/loss/loss_calculator.h"

#include <torch/torch.h>

namespace slipstream::aero {

std::vector<TargetField> default_target_fields() {
  return {{"velocity", 3, 1.0}, {"pressure", 1, 1.0}, {"nut", 1, 1.0}};
}

int64_t total_channels(const std::vector<TargetField>& fields) {
  int64_t n = 0;
  for (const auto& f : fields) n += f.channels;
  return n;
}

namespace {
const char* kComponents[] = {"x", "y", "z"};
}

LossCalculator::LossCalculator(LossOptions options)
    : options_(std::move(options)), channels_(total_channels(options_.fields)) {
  TORCH_CHECK(options_.type == "huber" || options_.type == "mse" || options_.type == "rmse",
              "loss: type '", options_.type, "' is not one of huber, mse, rmse");
  for (const auto& f : options_.fields) {
    TORCH_CHECK(f.channels == 1 || f.channels == 3, "loss: field '", f.name,
                "' must have 1 (scalar) or 3 (vector) channels, got ", f.channels);
  }
  for (const auto& m : options_.metrics) {
    TORCH_CHECK(m == "l1" || m == "l2" || m == "mae", "loss: metric '", m,
                "' is not one of l1, l2, mae");
  }
}

std::vector<std::string> LossCalculator::keys() const {
  std::vector<std::string> keys{"loss"};
  for (const auto& f : options_.fields) keys.push_back("loss/" + f.name);
  for (const auto& f : options_.fields) {
    for (const auto& m : options_.metrics) {
      if (f.channels == 3) {
        for (int c = 0; c < 3; ++c) keys.push_back(f.name + "_" + kComponents[c] + "_" + m);
      }
      keys.push_back(f.name + "_" + m);
    }
  }
  return keys;
}

LossResult LossCalculator::compute(const torch::Tensor& prediction_in,
                                   const torch::Tensor& target_in,
                                   const torch::Tensor& weights_in) const {
  TORCH_CHECK(prediction_in.sizes() == target_in.sizes(), "loss: prediction shape ",
              prediction_in.sizes(), " differs from target shape ", target_in.sizes());
  TORCH_CHECK(prediction_in.size(-1) == channels_, "loss: expected ", channels_,
              " channels, got ", prediction_in.size(-1));
  auto p = prediction_in.reshape({-1, channels_}).to(torch::kFloat);
  auto t = target_in.reshape({-1, channels_}).to(torch::kFloat);
  torch::Tensor w;  // (N, 1) or undefined
  if (weights_in.defined()) {
    w = weights_in.reshape({-1, 1}).to(torch::kFloat);
    TORCH_CHECK(w.size(0) == p.size(0), "loss: ", w.size(0), " weights for ", p.size(0),
                " points");
  }
  torch::Tensor mask;  // (N, C) float, or undefined
  if (options_.mask_nonfinite) {
    auto finite = torch::isfinite(t);
    mask = finite.to(torch::kFloat);
    t = torch::where(finite, t, torch::zeros({}, t.options()));
  }
  // Per-point, per-channel weight: area/volume times the finite mask.
  torch::Tensor pw;
  if (w.defined() && mask.defined()) pw = w * mask;
  else if (w.defined()) pw = w.expand_as(p);
  else if (mask.defined()) pw = mask;

  auto d = p - t;
  auto wsum_of = [&](const torch::Tensor& x) {
    return pw.defined() ? (x * pw).sum(0) : x.sum(0);
  };
  // One (6, C) block of per-channel sums; metrics and losses are views of it.
  auto abs_d = d.abs();
  auto sq_d = d * d;
  std::vector<torch::Tensor> rows = {wsum_of(abs_d), wsum_of(t.abs()), wsum_of(sq_d),
                                     wsum_of(t * t)};
  torch::Tensor weight_sum = pw.defined() ? pw.sum(0)
                                          : torch::full({channels_}, static_cast<double>(p.size(0)),
                                                        p.options());
  rows.push_back(weight_sum);
  if (options_.type == "huber") {
    auto huber = torch::where(abs_d < 1.0, 0.5 * sq_d, abs_d - 0.5);
    rows.push_back(wsum_of(huber));
  }
  auto sums = torch::stack(rows);  // (R, C)
  auto sad = sums[0], sat = sums[1], ssd = sums[2], sst = sums[3], wsum = sums[4];
  torch::Tensor per_channel_loss;
  if (options_.type == "huber") per_channel_loss = sums[5] / wsum;
  else if (options_.type == "mse") per_channel_loss = ssd / wsum;
  else per_channel_loss = ssd / sst;  // relative mse: mse / mean(t^2)
  torch::Tensor counts = mask.defined() ? mask.sum(0) : torch::Tensor();

  LossResult out;
  std::vector<torch::Tensor> field_losses;
  torch::Tensor total;
  int64_t c0 = 0;
  for (const auto& f : options_.fields) {
    auto fl = per_channel_loss.narrow(0, c0, f.channels).sum();
    field_losses.push_back(fl);
    total = total.defined() ? total + fl * f.loss_weight : fl * f.loss_weight;
    c0 += f.channels;
  }
  out.total = total / static_cast<double>(channels_);
  out.scalars.add("loss", out.total.detach());
  for (size_t i = 0; i < field_losses.size(); ++i) {
    out.scalars.add("loss/" + options_.fields[i].name, field_losses[i].detach());
  }
  // Metrics, from detached sums.
  auto sad_d = sad.detach(), sat_d = sat.detach(), ssd_d = ssd.detach(), sst_d = sst.detach(),
       wsum_d = wsum.detach();
  auto metric = [&](const std::string& m, int64_t begin, int64_t len) {
    auto s = [&](const torch::Tensor& row) { return row.narrow(0, begin, len).sum(); };
    if (m == "l1") return s(sad_d) / s(sat_d);
    if (m == "l2") return (s(ssd_d) / s(sst_d)).sqrt();
    return s(sad_d) / s(wsum_d);  // mae
  };
  auto add_metric = [&](const std::string& key, const std::string& m, int64_t begin, int64_t len) {
    auto value = metric(m, begin, len);
    if (counts.defined()) {
      out.scalars.add_counted(key, value, counts.narrow(0, begin, len).sum());
    } else {
      out.scalars.add(key, value);
    }
  };
  c0 = 0;
  for (const auto& f : options_.fields) {
    for (const auto& m : options_.metrics) {
      if (f.channels == 3) {
        for (int c = 0; c < 3; ++c) add_metric(f.name + "_" + kComponents[c] + "_" + m, m, c0 + c, 1);
      }
      add_metric(f.name + "_" + m, m, c0, f.channels);
    }
    c0 += f.channels;
  }
  return out;
}

}  // namespace slipstream::aero
