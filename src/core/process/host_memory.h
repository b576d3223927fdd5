// The host memory a process can still take, for checks of a configuration
// against the machine before any work (an estimate beyond it is an error
// naming the key, not a std::bad_alloc after minutes of growth).
#pragma once

#include <cstdint>
#include <string>

namespace slipstream {

// /proc/meminfo's MemAvailable in bytes; 0 where it cannot be read.
uint64_t available_host_memory();

// This process's peak resident memory so far (getrusage's ru_maxrss).
uint64_t peak_rss_bytes();

// "12.3 GiB".
std::string format_gib(double bytes);

}  // namespace slipstream
