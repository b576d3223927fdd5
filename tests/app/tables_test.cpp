// The kernel table `slipstream bench --profile` prints.
#include "commands/tables.h"

#include <gtest/gtest.h>

#include <cmath>

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

TEST(TablesTest, ForcesTableListsTheCoefficientsInTheirOrder) {
  std::map<std::string, aero::CoefficientSummary> c;
  c["CL"] = {0.1, 0.125, 0.025, 0.5, 4};
  c["CD"] = {0.3, 0.28, 0.02, 0.9876, 4};
  const auto table = format_forces_table(c);
  EXPECT_NE(table.find("CD         0.30000      0.28000      0.02000   0.9876"), std::string::npos)
      << table;
  EXPECT_LT(table.find("CD "), table.find("CL "));
  EXPECT_EQ(table.find("CMP"), std::string::npos) << table;
  c["CS"] = {0.0, 0.0, 0.0, std::nan(""), 4};  // a truth that does not vary: no R^2
  EXPECT_NE(format_forces_table(c).find("CS         0.00000      0.00000      0.00000        -"),
            std::string::npos)
      << format_forces_table(c);
}

}  // namespace
}  // namespace slipstream::app
