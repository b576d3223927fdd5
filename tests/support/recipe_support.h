// Helpers the recipe's tests share: the volume Transolver's input spec, a
// small synthetic sample, and the configs directory of the source tree.
#pragma once

#include "aero/config/config.h"
#include "aero/data/input_spec.h"
#include "aero/data/sample.h"

#include <string>
#include <vector>

namespace slipstream::testing {

// embedding = [points, sdf, sdf_normals], fx = U_inf on every point.
aero::InputSpec volume_inputs();

// Synthetic sample `index` with `points` points (seed 1234).
aero::Sample synthetic_sample(int64_t index, int64_t points);

// configs/ of the source tree, loaded with `overrides`.
aero::Config load_config(const std::vector<std::string>& overrides);

}  // namespace slipstream::testing
