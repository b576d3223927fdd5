#include "commands/tables.h"

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

}  // namespace slipstream::app
