#include "core/readback/step_means.h"

#include <c10/util/Exception.h>

#include <cmath>
#include <limits>

namespace slipstream {

void StepMeans::add(const NamedValues& values) {
  for (const auto& [key, v] : values) {
    Sum& s = sums_[key];
    if (std::isfinite(v)) {
      s.total += v;
      ++s.finite;
    } else {
      ++s.nonfinite;
    }
  }
}

std::map<std::string, double> StepMeans::means() const {
  std::map<std::string, double> out;
  for (const auto& [key, s] : sums_) {
    out[key] = s.finite > 0 ? s.total / static_cast<double>(s.finite)
                            : std::numeric_limits<double>::quiet_NaN();
  }
  return out;
}

int64_t StepMeans::nonfinite(const std::string& key) const {
  auto it = sums_.find(key);
  return it == sums_.end() ? 0 : it->second.nonfinite;
}

nlohmann::json StepMeans::state() const {
  nlohmann::json out = nlohmann::json::object();
  for (const auto& [key, s] : sums_) out[key] = {s.total, s.finite, s.nonfinite};
  return out;
}

StepMeans StepMeans::from_state(const nlohmann::json& state) {
  StepMeans m;
  if (state.is_null()) return m;
  TORCH_CHECK(state.is_object(), "step means: malformed state ", state.dump());
  for (const auto& [key, v] : state.items()) {
    TORCH_CHECK(v.is_array() && v.size() == 3, "step means: malformed entry '", key, "'");
    m.sums_[key] = Sum{v[0].get<double>(), v[1].get<int64_t>(), v[2].get<int64_t>()};
  }
  return m;
}

}  // namespace slipstream
