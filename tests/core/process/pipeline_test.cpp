// run_pipeline (pipeline.h): each stage sees every item once, in order; the
// three stages overlap (three stages of 20 ms over 12 items take about 14
// stage times, not 36); the reader runs at most `depth` items ahead; an
// exception in any stage stops the others and reaches the caller, with no
// item after the failing one worked on or written.
#include "core/process/pipeline.h"

#include <gtest/gtest.h>

#include <algorithm>
#include <atomic>
#include <chrono>
#include <stdexcept>
#include <string>
#include <thread>
#include <vector>

namespace slipstream {
namespace {

using Clock = std::chrono::steady_clock;

TEST(PipelineTest, EachStageSeesEveryItemInOrder) {
  std::vector<int64_t> read, worked, written;
  run_pipeline<std::string>(
      50, 2,
      [&](int64_t i) {
        read.push_back(i);
        return std::to_string(i);
      },
      [&](int64_t i, std::string& s) {
        worked.push_back(i);
        s += "w";
      },
      [&](int64_t i, std::string& s) {
        EXPECT_EQ(s, std::to_string(i) + "w");
        written.push_back(i);
      });
  std::vector<int64_t> all(50);
  for (int64_t i = 0; i < 50; ++i) all[static_cast<size_t>(i)] = i;
  EXPECT_EQ(read, all);
  EXPECT_EQ(worked, all);
  EXPECT_EQ(written, all);
  run_pipeline<int>(
      0, 1, [](int64_t) -> int { throw std::runtime_error("no item to read"); },
      [](int64_t, int&) {}, [](int64_t, int&) {});
  EXPECT_THROW(run_pipeline<int>(
                   1, 0, [](int64_t) { return 0; }, [](int64_t, int&) {}, [](int64_t, int&) {}),
               std::invalid_argument);
}

TEST(PipelineTest, TheStagesOverlapAndTheReaderStaysWithinDepth) {
  const auto stage = std::chrono::milliseconds(20);
  std::atomic<int64_t> reads{0}, works{0};
  int64_t most_ahead = 0;
  const auto start = Clock::now();
  run_pipeline<int64_t>(
      12, 2,
      [&](int64_t i) {
        std::this_thread::sleep_for(stage);
        ++reads;
        return i;
      },
      [&](int64_t, int64_t&) {
        most_ahead = std::max(most_ahead, reads.load() - works.load());
        std::this_thread::sleep_for(stage);
        ++works;
      },
      [&](int64_t, int64_t&) { std::this_thread::sleep_for(stage); });
  const double seconds = std::chrono::duration<double>(Clock::now() - start).count();
  // Sequential: 36 stage times (0.72 s); overlapped: 12 + 2 (0.28 s).
  EXPECT_LT(seconds, 0.5) << "the stages did not overlap";
  // Read items not yet worked on, the one being taken included: depth + 1.
  EXPECT_LE(most_ahead, 3);
}

TEST(PipelineTest, AFailureInAnyStageStopsTheOthersAndReachesTheCaller) {
  for (const int failing : {0, 1, 2}) {
    std::atomic<int64_t> last_worked{-1}, last_written{-1};
    try {
      run_pipeline<int64_t>(
          1000, 2,
          [&](int64_t i) {
            if (failing == 0 && i == 5) throw std::runtime_error("read 5");
            return i;
          },
          [&](int64_t i, int64_t&) {
            if (failing == 1 && i == 5) throw std::runtime_error("work 5");
            last_worked = i;
          },
          [&](int64_t i, int64_t&) {
            if (failing == 2 && i == 5) throw std::runtime_error("write 5");
            last_written = i;
          });
      ADD_FAILURE() << "stage " << failing << ": no exception";
    } catch (const std::runtime_error& e) {
      const std::string what = e.what();
      EXPECT_EQ(what.back(), '5') << what;
    }
    // The failing item and what follows it are not written; the worker
    // stops within `depth` + 1 items of a failed writer.
    EXPECT_LT(last_written.load(), 5) << "stage " << failing;
    EXPECT_LT(last_worked.load(), failing == 2 ? 9 : 5) << "stage " << failing;
  }
}

}  // namespace
}  // namespace slipstream
