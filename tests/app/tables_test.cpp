// The kernel table `slipstream bench --profile` prints.
#include "commands/tables.h"

#include <gtest/gtest.h>

namespace slipstream::app {
namespace {

TEST(TablesTest, KernelTableShowsTheTopKernelsPerStepWithTheirShare) {
  const std::vector<KernelTime> times = {
      {"gemm", 2, 22.5}, {"softmax", 1, 4.0}, {"Memset (Device)", 1, 1.0}};
  const auto table = format_kernel_table(times, /*steps=*/2, /*top=*/2);
  EXPECT_NE(table.find("GPU time per step: 0.01 ms in 3 kernel names"), std::string::npos) << table;
  EXPECT_NE(table.find("0.011     1.0  81.8%  gemm"), std::string::npos) << table;
  EXPECT_NE(table.find("softmax"), std::string::npos) << table;
  EXPECT_EQ(table.find("Memset"), std::string::npos) << table;
}

}  // namespace
}  // namespace slipstream::app
