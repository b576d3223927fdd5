#include "core/process/host_memory.h"

#include <sys/resource.h>

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

uint64_t peak_rss_bytes() {
  rusage usage{};
  if (getrusage(RUSAGE_SELF, &usage) != 0) return 0;
  return static_cast<uint64_t>(usage.ru_maxrss) * 1024;  // KiB on Linux
}

std::string format_gib(double bytes) {
  char buf[64];
  std::snprintf(buf, sizeof(buf), "%.3g GiB", bytes / double(uint64_t{1} << 30));
  return buf;
}

}  // namespace slipstream
