// Summing a Chrome trace into device time per kernel (what `slipstream bench
// --profile` tabulates).
#include "core/device/kernel_profile.h"
#include "support/test_support.h"

#include <gtest/gtest.h>

#include <fstream>

namespace slipstream {
namespace {

TEST(KernelProfileTest, SumsGpuEventsByNameLongestFirstAndSkipsHostEvents) {
  testing::TempDir dir;
  const auto path = dir.file("trace.json");
  std::ofstream(path) << R"json({"traceEvents": [
    {"ph": "X", "cat": "kernel", "name": "gemm", "dur": 10.0},
    {"ph": "X", "cat": "kernel", "name": "softmax", "dur": 4.0},
    {"ph": "X", "cat": "kernel", "name": "gemm", "dur": 12.5},
    {"ph": "X", "cat": "gpu_memset", "name": "Memset (Device)", "dur": 1.0},
    {"ph": "X", "cat": "cuda_runtime", "name": "cudaLaunchKernel", "dur": 50.0},
    {"ph": "X", "cat": "cpu_op", "name": "aten::mm", "dur": 80.0}
  ]})json";
  const auto times = kernel_times_from_trace(path);
  ASSERT_EQ(times.size(), 3u);
  EXPECT_EQ(times[0].name, "gemm");
  EXPECT_EQ(times[0].calls, 2);
  EXPECT_DOUBLE_EQ(times[0].total_us, 22.5);
  EXPECT_EQ(times[1].name, "softmax");
  EXPECT_EQ(times[2].name, "Memset (Device)");
}

TEST(KernelProfileTest, UnreadableTraceNamesTheFile) {
  testing::TempDir dir;
  const auto missing = dir.file("none.json");
  EXPECT_NE(testing::error_message_of([&] { kernel_times_from_trace(missing); }).find(missing),
            std::string::npos);
  std::ofstream(dir.file("bad.json")) << "{not json";
  EXPECT_NE(testing::error_message_of([&] {
              kernel_times_from_trace(dir.file("bad.json"));
            }).find("bad.json"),
            std::string::npos);
}

}  // namespace
}  // namespace slipstream
