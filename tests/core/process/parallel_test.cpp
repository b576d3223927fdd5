// parallel_ranges: every index once, on several threads, and a range's
// exception reaches the caller.
#include "core/process/parallel.h"

#include <gtest/gtest.h>

#include <atomic>
#include <chrono>
#include <mutex>
#include <set>
#include <stdexcept>
#include <thread>
#include <vector>

namespace slipstream {
namespace {

TEST(ParallelRangesTest, EveryIndexOnceOnSeveralThreads) {
  std::vector<std::atomic<int>> seen(10007);
  std::mutex m;
  std::set<std::thread::id> threads;
  parallel_ranges(
      static_cast<int64_t>(seen.size()), 100,
      [&](int64_t begin, int64_t end) {
        for (int64_t i = begin; i < end; ++i) seen[static_cast<size_t>(i)]++;
        std::this_thread::sleep_for(std::chrono::milliseconds(1));  // work the others share
        std::lock_guard<std::mutex> lock(m);
        threads.insert(std::this_thread::get_id());
      },
      4);
  for (const auto& s : seen) ASSERT_EQ(s.load(), 1);
  EXPECT_GT(threads.size(), 1u);
  int calls = 0;
  parallel_ranges(
      5, 100, [&](int64_t b, int64_t e) { calls += (b == 0 && e == 5); }, 4);
  EXPECT_EQ(calls, 1);  // less than a grain: one range, here
  parallel_ranges(0, 100, [&](int64_t, int64_t) { ++calls; });
  EXPECT_EQ(calls, 1);
}

TEST(ParallelRangesTest, AnExceptionInARangeReachesTheCaller) {
  EXPECT_THROW(parallel_ranges(
                   1000, 10,
                   [](int64_t begin, int64_t) {
                     if (begin == 500) throw std::runtime_error("range 500");
                   },
                   3),
               std::runtime_error);
}

}  // namespace
}  // namespace slipstream
