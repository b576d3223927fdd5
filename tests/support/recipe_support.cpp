#include "support/recipe_support.h"

#include "aero/data/synthetic.h"

namespace slipstream::testing {

aero::InputSpec volume_inputs() {
  return aero::InputSpec(
      {{"embedding", {{"points", "sdf", "sdf_normals"}, ""}}, {"fx", {{"U_inf"}, "embedding"}}});
}

aero::Sample synthetic_sample(int64_t index, int64_t points) {
  aero::SyntheticOptions o;
  o.points_per_sample = points;
  return aero::make_synthetic_sample(index, o);
}

aero::Config load_config(const std::vector<std::string>& overrides) {
  return aero::Config::load(std::string(SLIPSTREAM_SOURCE_DIR) + "/configs", overrides);
}

}  // namespace slipstream::testing
