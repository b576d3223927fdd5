#include "commands/tables.h"

#include <cmath>
#include <cstdio>

namespace slipstream::app {

std::string format_kernel_table(const std::vector<KernelTime>& times, int steps, int top) {
  double total = 0.0;
  for (const auto& k : times) total += k.total_us;
  const double per = steps > 0 ? steps : 1;
  std::string s;
  char line[512];
  std::snprintf(line, sizeof line, "GPU time per step: %.2f ms in %zu kernel names\n",
                total / per / 1e3, times.size());
  s += line;
  std::snprintf(line, sizeof line, "%9s %7s %6s  %s\n", "ms/step", "calls", "share", "kernel");
  s += line;
  for (int i = 0; i < top && i < static_cast<int>(times.size()); ++i) {
    const auto& k = times[i];
    std::string name = k.name.size() > 110 ? k.name.substr(0, 107) + "..." : k.name;
    std::snprintf(line, sizeof line, "%9.3f %7.1f %5.1f%%  %s\n", k.total_us / per / 1e3,
                  k.calls / per, total > 0 ? 100.0 * k.total_us / total : 0.0, name.c_str());
    s += line;
  }
  return s;
}

std::string format_forces_table(
    const std::map<std::string, aero::CoefficientSummary>& coefficients) {
  std::string s;
  char line[256];
  std::snprintf(line, sizeof line, "%-5s %12s %12s %12s %8s\n", "coef", "pred mean", "true mean",
                "MAE", "R2");
  s += line;
  for (const auto& name : aero::coefficient_names()) {
    auto it = coefficients.find(name);
    if (it == coefficients.end()) continue;
    const auto& c = it->second;
    char r2[32];
    if (std::isnan(c.r2)) {
      std::snprintf(r2, sizeof r2, "%8s", "-");  // the truth does not vary: undefined
    } else {
      std::snprintf(r2, sizeof r2, "%8.4f", c.r2);
    }
    std::snprintf(line, sizeof line, "%-5s %12.5f %12.5f %12.5f %s\n", name.c_str(), c.pred_mean,
                  c.true_mean, c.mae, r2);
    s += line;
  }
  return s;
}

}  // namespace slipstream::app
