#include "core/process/parallel.h"

#include <algorithm>
#include <atomic>
#include <exception>
#include <mutex>
#include <thread>
#include <vector>

namespace slipstream {

void parallel_ranges(int64_t n, int64_t grain, const std::function<void(int64_t, int64_t)>& fn,
                     int threads) {
  if (n <= 0) return;
  grain = std::max<int64_t>(grain, 1);
  const int64_t cores = threads > 0 ? threads : std::max(1u, std::thread::hardware_concurrency());
  const int64_t workers = std::min(cores, (n + grain - 1) / grain);
  if (workers <= 1) {
    fn(0, n);
    return;
  }
  // Ranges of `grain` handed out in turn, so that uneven work balances.
  std::atomic<int64_t> next{0};
  std::exception_ptr error;
  std::mutex error_mutex;
  const auto work = [&] {
    for (;;) {
      const int64_t begin = next.fetch_add(grain);
      if (begin >= n) return;
      try {
        fn(begin, std::min(n, begin + grain));
      } catch (...) {
        std::lock_guard<std::mutex> lock(error_mutex);
        if (!error) error = std::current_exception();
        next.store(n);
        return;
      }
    }
  };
  std::vector<std::thread> pool;
  pool.reserve(static_cast<size_t>(workers - 1));
  for (int64_t t = 1; t < workers; ++t) pool.emplace_back(work);
  work();
  for (auto& t : pool) t.join();
  if (error) std::rethrow_exception(error);
}

}  // namespace slipstream
