#include "core/readback/step_means.h"

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

}  // namespace slipstream
