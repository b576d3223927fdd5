#include "aero/data/transforms.h"

#include <torch/torch.h>

#include <cmath>

namespace slipstream::aero {

torch::Tensor subsample_indices(int64_t n, int64_t k, const std::string& mode, at::Generator& gen) {
  if (k <= 0 || k >= n) return {};
  if (mode == "block") {
    const int64_t start = torch::randint(n - k + 1, {1}, gen, torch::kLong).item<int64_t>();
    return torch::arange(start, start + k, torch::kLong);
  }
  return torch::randperm(n, gen, torch::TensorOptions().dtype(torch::kLong)).narrow(0, 0, k);
}

torch::Tensor rotate_z(const torch::Tensor& xyz, double radians) {
  const double c = std::cos(radians), s = std::sin(radians);
  auto r =
      torch::tensor({c, -s, 0.0, s, c, 0.0, 0.0, 0.0, 1.0}, xyz.options().dtype(torch::kDouble))
          .view({3, 3})
          .to(xyz.scalar_type());
  return torch::matmul(xyz, r.t());
}

bool turns_with_rotation(const std::string& name, const torch::Tensor& field,
                         const FieldSchema& schema) {
  if (name == "points") return true;
  if (const FieldSpec* f = schema.find(name)) return f->type == FieldType::kVector;
  return field.dim() == 2 && field.size(1) == 3;
}

void augment(std::map<std::string, torch::Tensor>& point,
             std::map<std::string, torch::Tensor>& global, const TransformOptions& options,
             const FieldSchema& schema, at::Generator& gen) {
  if (options.rotate_z_max_deg <= 0 && options.translate_max <= 0) return;
  auto draw = torch::empty({3}, torch::kDouble).uniform_(-1.0, 1.0, gen);
  const auto d = draw.accessor<double, 1>();
  if (options.rotate_z_max_deg > 0) {
    const double angle = d[0] * options.rotate_z_max_deg * M_PI / 180.0;
    for (auto& [name, field] : point) {
      if (turns_with_rotation(name, field, schema)) field = rotate_z(field, angle);
    }
    auto u = global.find("U_inf");
    if (u != global.end()) u->second = rotate_z(u->second.reshape({1, 3}), angle).reshape({3});
  }
  if (options.translate_max > 0) {
    auto& points = point.at("points");
    const auto shift = torch::tensor(
        {d[1] * options.translate_max, d[2] * options.translate_max, 0.0}, torch::kDouble);
    points = points + shift.to(points.scalar_type()).view({1, 3});
  }
}

}  // namespace slipstream::aero
