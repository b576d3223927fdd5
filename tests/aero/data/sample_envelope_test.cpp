// The training envelope: what a set of samples spans, and which descriptions
// of another sample fall outside it.
#include "aero/data/sample_envelope.h"
#include "aero/data/synthetic.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

namespace slipstream::aero {
namespace {

SampleEnvelope envelope_of_synthetic(int64_t count) {
  SyntheticOptions o;
  o.points_per_sample = 2000;
  SampleEnvelope e;
  for (int64_t i = 0; i < count; ++i) e.add(make_synthetic_sample(i, o));
  return e;
}

std::vector<std::string> names(const std::vector<OutOfRange>& outside) {
  std::vector<std::string> out;
  for (const auto& o : outside) out.push_back(o.name);
  return out;
}

TEST(SampleEnvelopeTest, DescribesExtentFreeStreamAndScalarGlobalsButNotTheCfdsResults) {
  SyntheticOptions o;
  o.points_per_sample = 500;
  Sample s = make_synthetic_sample(0, o);
  s.global_data["U_inf"] = torch::tensor({0.0, 2.0, 0.0});
  s.global_data["phi"] = torch::tensor({25.0}, torch::kDouble);
  s.global_data["CD_cfd"] = torch::tensor({0.3}, torch::kDouble);
  const auto d = describe_sample(s);
  EXPECT_NEAR(d.at("U_inf_speed"), 2.0, 1e-12);
  EXPECT_NEAR(d.at("U_inf_yaw_deg"), 90.0, 1e-9);
  EXPECT_NEAR(d.at("U_inf_pitch_deg"), 0.0, 1e-9);
  EXPECT_EQ(d.at("phi"), 25.0);
  EXPECT_EQ(d.count("CD_cfd"), 0u);
  EXPECT_EQ(d.count("L_ref"), 1u);
  const auto p = s.point("points").to(torch::kDouble);
  const auto x = s.point("points").to(torch::kDouble).select(1, 0);
  const auto q = torch::quantile(x, torch::tensor({0.01, 0.99}, torch::kDouble));
  EXPECT_NEAR(d.at("extent_x"), (q[1] - q[0]).item<double>(), 1e-12);
}

TEST(SampleEnvelopeTest, TheTrainingSamplesAreInsideAndAChangedOneIsNamedOutside) {
  const auto e = envelope_of_synthetic(12);
  EXPECT_EQ(e.samples(), 12);
  SyntheticOptions o;
  o.points_per_sample = 2000;
  for (int64_t i = 0; i < 12; ++i) {
    EXPECT_TRUE(e.outside(make_synthetic_sample(i, o)).empty()) << i;
  }
  Sample fast = make_synthetic_sample(3, o);
  fast.global_data["U_inf"] = fast.global("U_inf") * 3.0;
  EXPECT_EQ(names(e.outside(fast)), std::vector<std::string>{"U_inf_speed"});
  // A constant of the set allows round-off, not another value.
  Sample dense = make_synthetic_sample(3, o);
  dense.global_data["rho_inf"] = torch::tensor({1.0 + 1e-9}, torch::kDouble);
  EXPECT_TRUE(e.outside(dense).empty());
  dense.global_data["rho_inf"] = torch::tensor({1.2}, torch::kDouble);
  const auto out = e.outside(dense);
  ASSERT_EQ(names(out), std::vector<std::string>{"rho_inf"});
  EXPECT_EQ(out[0].min, 1.0);
  EXPECT_EQ(out[0].max, 1.0);
  EXPECT_NE(describe_out_of_range(out).find("rho_inf 1.2 (trained 1 to 1)"), std::string::npos)
      << describe_out_of_range(out);
  // A larger body (points spread 3x) is outside the extents.
  Sample big = make_synthetic_sample(3, o);
  big.point_data["points"] = big.point("points") * 3.0;
  EXPECT_EQ(names(e.outside(big)), (std::vector<std::string>{"extent_x", "extent_y", "extent_z"}));
}

TEST(SampleEnvelopeTest, AFewThousandRowsOfALargeSampleDescribeItAsAllItsRowsDo) {
  // Training reads a subset of each sample; inference sees every point.
  SyntheticOptions o;
  o.points_per_sample = 300000;
  const Sample whole = make_synthetic_sample(0, o);
  Sample part = whole;
  const auto rows = torch::randperm(whole.num_points(), torch::kLong).narrow(0, 0, 16384);
  for (auto& [name, t] : part.point_data) t = t.index_select(0, rows);
  SampleEnvelope e;
  e.add(part);
  EXPECT_TRUE(e.outside(whole).empty()) << describe_out_of_range(e.outside(whole));
}

TEST(SampleEnvelopeTest, KeepsOnlyWhatEverySampleHasAndRoundTripsThroughJson) {
  SyntheticOptions o;
  o.points_per_sample = 500;
  Sample a = make_synthetic_sample(0, o), b = make_synthetic_sample(1, o);
  a.global_data["phi"] = torch::tensor({5.0}, torch::kDouble);
  SampleEnvelope e;
  e.add(a);
  e.add(b);
  EXPECT_EQ(e.ranges().count("phi"), 0u);  // b has none: not the set's
  a.global_data["phi"] = torch::tensor({500.0}, torch::kDouble);
  EXPECT_TRUE(e.outside(a).empty());
  const auto back = SampleEnvelope::from_json(e.to_json());
  EXPECT_EQ(back.samples(), 2);
  EXPECT_EQ(back.ranges(), e.ranges());
  const auto msg = testing::error_message_of([] {
    SampleEnvelope::from_json({{"samples", 1}, {"ranges", {{"x", {1.0}}}}});
  });
  EXPECT_NE(msg.find("'x'"), std::string::npos) << msg;
}

}  // namespace
}  // namespace slipstream::aero
