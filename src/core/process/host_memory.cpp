#include "core/process/host_memory.h"

#include <cstdio>
#include <fstream>
#include <sstream>

namespace slipstream {

uint64_t available_host_memory() {
  std::ifstream in("/proc/meminfo");
  for (std::string line; std::getline(in, line);) {
    if (line.rfind("MemAvailable:", 0) != 0) continue;
    std::istringstream fields(line.substr(13));
    uint64_t kib = 0;
    fields >> kib;
    return kib * 1024;
  }
  return 0;
}

std::string format_gib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3g GiB", bytes / double(uint64_t{1} << 30));
  return buf;
}

}  // namespace slipstream
