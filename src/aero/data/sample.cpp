#include "aero/data/sample.h"

#include <torch/torch.h>

namespace slipstream::aero {

void validate_sample(const Sample& s, const std::vector<std::string>& target_names) {
  auto need = [&](const torch::Tensor& t, const char* name, int64_t cols) {
    TORCH_CHECK(t.defined(), "dataset: sample ", s.id, " has no '", name, "'");
    TORCH_CHECK(t.dim() == 2 && t.size(1) == cols, "dataset: sample ", s.id, " field '", name,
                "' has shape ", t.sizes(), ", expected (N, ", cols, ")");
    TORCH_CHECK(t.size(0) == s.num_points(), "dataset: sample ", s.id, " field '", name,
                "' has ", t.size(0), " rows but the sample has ", s.num_points(), " points");
  };
  TORCH_CHECK(s.points.defined(), "dataset: sample ", s.id, " has no 'points'");
  TORCH_CHECK(s.num_points() > 0, "dataset: sample ", s.id, " has 0 points");
  need(s.points, "points", 3);
  need(s.sdf, "sdf", 1);
  need(s.sdf_normals, "sdf_normals", 3);
  TORCH_CHECK(s.u_inf.defined() && s.u_inf.numel() == 3, "dataset: sample ", s.id,
              " needs 'U_inf' with 3 values");
  TORCH_CHECK(torch::isfinite(s.points).all().item<bool>(), "dataset: sample ", s.id,
              " has non-finite (NaN or Inf) point coordinates");
  TORCH_CHECK(torch::isfinite(s.sdf).all().item<bool>(), "dataset: sample ", s.id,
              " has non-finite SDF values");
  TORCH_CHECK(torch::isfinite(s.u_inf).all().item<bool>(), "dataset: sample ", s.id,
              " has a non-finite U_inf");
  for (const auto& name : target_names) {
    auto it = s.targets.find(name);
    TORCH_CHECK(it != s.targets.end(), "dataset: sample ", s.id, " has no target '", name, "'");
    TORCH_CHECK(it->second.dim() == 2 && it->second.size(0) == s.num_points(), "dataset: sample ",
                s.id, " target '", name, "' has shape ", it->second.sizes(), ", expected ",
                s.num_points(), " rows");
  }
  if (s.volume.defined()) {
    TORCH_CHECK(s.volume.numel() == s.num_points(), "dataset: sample ", s.id, " has ",
                s.volume.numel(), " volumes for ", s.num_points(), " points");
  }
}

}  // namespace slipstream::aero
