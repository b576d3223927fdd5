// The named target fields a model predicts, in channel order: each is a
// scalar (1 channel) or a vector (3 channels, components x, y, z).
// The recipe's default: velocity (vector), pressure (scalar), nut (scalar).
#pragma once

#include <cstdint>
#include <string>
#include <vector>

namespace slipstream::aero {

struct TargetField {
  std::string name;
  int64_t channels = 1;  // 1 (scalar) or 3 (vector)
  double loss_weight = 1.0;
};

std::vector<TargetField> default_target_fields();
int64_t total_channels(const std::vector<TargetField>& fields);

}  // namespace slipstream::aero
