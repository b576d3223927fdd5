// A parallel loop on plain std::threads, for host work that must use every
// core whatever LibTorch's OpenMP runtime decides (on the 2-core CI machine,
// Debian's LibTorch ran at::parallel_for on one thread, OMP_NUM_THREADS set
// or not).
#pragma once

#include <cstdint>
#include <functional>

namespace slipstream {

// Calls fn(begin, end) over [0, n) in ranges of at least `grain`, on up to
// `threads` threads (0: the machine's cores), the calling thread one of
// them. Returns when every range is done; the first exception a range threw
// is rethrown then.
void parallel_ranges(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn,
                     int threads = 0);

}  // namespace slipstream
