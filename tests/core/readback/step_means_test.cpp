// The epoch summary's means: non-finite step values are left out and
// counted, a key with no finite value is NaN.
#include "core/readback/step_means.h"

#include <gtest/gtest.h>

#include <cmath>
#include <limits>

namespace slipstream {
namespace {

TEST(StepMeansTest, MeansLeaveOutAndCountNonFiniteSteps) {
  const double nan = std::numeric_limits<double>::quiet_NaN();
  StepMeans m;
  m.add({{"loss", 1.0}, {"nut_l2", nan}});
  m.add({{"loss", 3.0}, {"nut_l2", std::numeric_limits<double>::infinity()}});
  m.add({{"loss", nan}, {"nut_l2", nan}});
  const auto means = m.means();
  EXPECT_DOUBLE_EQ(means.at("loss"), 2.0);
  EXPECT_TRUE(std::isnan(means.at("nut_l2")));
  EXPECT_EQ(m.nonfinite("loss"), 1);
  EXPECT_EQ(m.nonfinite("nut_l2"), 3);
  EXPECT_EQ(m.nonfinite("absent"), 0);
}

TEST(StepMeansTest, StateRoundTripsExactlyThroughJson) {
  StepMeans m;
  m.add({{"loss", 0.1}, {"pressure_l2", 1.0 / 3.0}});
  m.add({{"loss", 0.2}, {"pressure_l2", std::numeric_limits<double>::quiet_NaN()}});
  const auto text = m.state().dump();
  StepMeans back = StepMeans::from_state(nlohmann::json::parse(text));
  back.add({{"loss", 0.3}, {"pressure_l2", 0.5}});
  m.add({{"loss", 0.3}, {"pressure_l2", 0.5}});
  EXPECT_EQ(back.means(), m.means());
  EXPECT_EQ(back.nonfinite("pressure_l2"), 1);
}

}  // namespace
}  // namespace slipstream
