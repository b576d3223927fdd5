#include "aero/model/memory_estimate.h"

#include "core/process/host_memory.h"

#include <algorithm>

namespace slipstream::aero {

std::string MemoryEstimate::describe() const {
  return "about " + format_gib(total()) + " (weights, gradients and optimizer state " +
         format_gib(state_bytes) + "; what the forward keeps for the backward at " +
         std::to_string(points) + " points " + format_gib(activation_bytes) +
         "; the backward's working memory " + format_gib(working_bytes) + ")";
}

std::optional<MemoryEstimate> estimate_training_memory(const Config& config, int64_t num_parameters,
                                                       int64_t points, bool bf16,
                                                       bool fused_kernels,
                                                       const RecomputeOptions& recompute) {
  const std::string family = config.get<std::string>("model.name");
  if (family != "transolver" && family != "geotransolver") return std::nullopt;
  const double layers = static_cast<double>(config.get<int64_t>("model.n_layers"));
  const double hidden = static_cast<double>(config.get<int64_t>("model.n_hidden"));
  const double ratio = static_cast<double>(config.get<int64_t>("model.mlp_ratio"));
  const double heads = static_cast<double>(config.get<int64_t>("model.n_head"));
  const double slices = static_cast<double>(config.get<int64_t>("model.slice_num"));
  const double element = bf16 ? 2.0 : 4.0;
  const double attention = fused_kernels ? 0.0 : 3.0 * heads * slices;
  const double family_factor = family == "geotransolver" ? 1.5 : 1.0;
  const double block = ((7.0 + 2.0 * ratio) * hidden + attention) * family_factor;
  double per_point = 0;  // elements kept per point, over all blocks
  switch (recompute.mode) {
    case Recompute::kNone:
      per_point = layers * block;
      break;
    case Recompute::kAttention:
      per_point = layers * (3.0 + 2.0 * ratio) * hidden * family_factor;
      break;
    case Recompute::kBlock:
      per_point = layers * hidden + block;
      break;
  }
  MemoryEstimate e;
  e.points = points;
  const double n = static_cast<double>(points);
  e.activation_bytes = per_point * element * n;
  e.working_bytes = 2.0 * ratio * hidden * 4.0 * n;
  e.state_bytes = static_cast<double>(num_parameters) * (4.0 * 4.0 + (bf16 ? 2.0 : 0.0));
  return e;
}

}  // namespace slipstream::aero
