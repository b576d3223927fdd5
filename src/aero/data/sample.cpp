#include "aero/data/sample.h"

#include <torch/torch.h>

namespace slipstream::aero {

int64_t Sample::num_points() const {
  auto it = point_data.find("points");
  return it != point_data.end() && it->second.defined() ? it->second.size(0) : 0;
}

const torch::Tensor& Sample::point(const std::string& name) const {
  auto it = point_data.find(name);
  TORCH_CHECK(it != point_data.end(), "dataset: sample ", id, " has no point field '", name, "'");
  return it->second;
}

const torch::Tensor& Sample::global(const std::string& name) const {
  auto it = global_data.find(name);
  TORCH_CHECK(it != global_data.end(), "dataset: sample ", id, " has no global value '", name, "'");
  return it->second;
}

double Sample::global_scalar(const std::string& name, double fallback) const {
  auto it = global_data.find(name);
  if (it == global_data.end()) return fallback;
  TORCH_CHECK(it->second.numel() == 1, "dataset: sample ", id, " global '", name, "' has ",
              it->second.numel(), " values, expected 1");
  return it->second.to(torch::kDouble).item<double>();
}

FreeStream Sample::free_stream() const {
  FreeStream fs;
  fs.speed = global("U_inf").to(torch::kDouble).norm().item<double>();
  fs.rho = global_scalar("rho_inf", 1.0);
  fs.p = global_scalar("p_inf", 0.0);
  return fs;
}

SampleLayout layout_of(const Sample& s) {
  SampleLayout out;
  for (const auto& [name, t] : s.point_data)
    out.point_channels[name] = t.dim() == 2 ? t.size(1) : 1;
  for (const auto& [name, t] : s.global_data) out.global_sizes[name] = t.numel();
  return out;
}

void validate_sample(const Sample& s, const SampleLayout& required,
                     const std::vector<std::string>& target_names, bool allow_nonfinite_targets) {
  TORCH_CHECK(s.has_point("points"), "dataset: sample ", s.id, " has no 'points'");
  const int64_t n = s.num_points();
  TORCH_CHECK(n > 0, "dataset: sample ", s.id, " has 0 points");
  for (const auto& [name, t] : s.point_data) {
    TORCH_CHECK(t.defined() && t.dim() == 2 && t.size(0) == n, "dataset: sample ", s.id,
                " point field '", name, "' has shape ", t.defined() ? t.sizes() : at::IntArrayRef{},
                ", expected (", n, ", C): one row per point");
  }
  auto is_target = [&](const std::string& name) {
    return std::find(target_names.begin(), target_names.end(), name) != target_names.end();
  };
  for (const auto& [name, channels] : required.point_channels) {
    const auto& t = s.point(name);
    TORCH_CHECK(t.size(1) == channels, "dataset: sample ", s.id, " point field '", name, "' has ",
                t.size(1), " channels, expected ", channels);
    if (allow_nonfinite_targets && is_target(name)) continue;
    if (torch::isfinite(t).all().item<bool>()) continue;
    const int64_t i = (~torch::isfinite(t)).any(1).nonzero()[0][0].item<int64_t>();
    const int64_t row = s.rows.defined() ? s.rows[i].item<int64_t>() : i;
    const auto values = t[i].to(torch::kDouble).contiguous();
    std::string text;
    for (int64_t c = 0; c < values.numel(); ++c) {
      text += (c ? ", " : "") + std::to_string(values[c].item<double>());
    }
    TORCH_CHECK(false, "dataset: sample ", s.id, " field '", name, "' row ", row,
                " is not finite (", text, ")");
  }
  for (const auto& [name, size] : required.global_sizes) {
    const auto& t = s.global(name);
    TORCH_CHECK(t.numel() == size, "dataset: sample ", s.id, " global '", name, "' has ", t.numel(),
                " values, expected ", size);
    TORCH_CHECK(torch::isfinite(t).all().item<bool>(), "dataset: sample ", s.id, " global '", name,
                "' is not finite");
  }
}

}  // namespace slipstream::aero
