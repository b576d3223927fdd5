// The parametric Ahmed body: closed and outward at every slant the dataset
// draws, its volume the analytic one, its signed distance right at known
// points, and the Latin hypercube stratified and reproducible.
#include "aero/geometry/ahmed_body.h"
#include "support/test_support.h"

#include <gtest/gtest.h>
#include <torch/torch.h>

#include <algorithm>
#include <cmath>
#include <map>
#include <utility>

namespace slipstream::aero {
namespace {

double signed_volume(const TriangleMesh& m) {
  double v = 0;
  for (const auto& f : m.faces) {
    const auto& a = m.vertices[static_cast<size_t>(f[0])];
    const auto& b = m.vertices[static_cast<size_t>(f[1])];
    const auto& c = m.vertices[static_cast<size_t>(f[2])];
    v += a[0] * (b[1] * c[2] - b[2] * c[1]) - a[1] * (b[0] * c[2] - b[2] * c[0]) +
         a[2] * (b[0] * c[1] - b[1] * c[0]);
  }
  return v / 6.0;
}

TEST(AhmedBodyTest, ClosedOutwardAndOfTheAnalyticVolumeAtEverySlant) {
  for (double slant : {0.0, 12.5, 25.0, 35.0, 40.0}) {
    AhmedBody b;
    b.slant_deg = slant;
    const TriangleMesh m = ahmed_body_mesh(b, 0.01);
    EXPECT_NO_THROW(check_watertight(m)) << slant;
    // Every directed edge once: the faces agree on their orientation.
    std::map<std::pair<int64_t, int64_t>, int> directed;
    for (const auto& f : m.faces) {
      for (int e = 0; e < 3; ++e) ++directed[{f[e], f[(e + 1) % 3]}];
    }
    EXPECT_TRUE(std::all_of(directed.begin(), directed.end(), [](const auto& kv) {
      return kv.second == 1;
    })) << slant;
    const double exact = ahmed_body_volume(b);
    EXPECT_NEAR(signed_volume(m), exact, 2e-3 * exact) << slant;  // positive: outward
    EXPECT_GT(m.faces.size(), 5000u);
  }
  // The standard body at 25 degrees, by hand: the nose (0.189 x 0.088 x 0.1
  // + 2 x 0.277 x pi 0.01 / 4 + 8 x 0.001 / 3 = 0.008681), the box behind
  // it (0.944 x 0.389 x 0.288 = 0.105759), less the slant's wedge
  // (0.5 x 0.20120 x 0.09382 x 0.389 = 0.003672).
  EXPECT_NEAR(ahmed_body_volume(AhmedBody{}), 0.110768, 2e-6);
}

TEST(AhmedBodyTest, SignedDistanceIsRightAtKnownPoints) {
  AhmedBody b;  // 25 degrees
  const SignedDistance sdf(ahmed_body_mesh(b, 0.01));
  // Mid-body centre: 0.144 m below the roof, 0.1945 from the sides.
  // Above the roof at mid-length, behind the base, and below the underside.
  const auto points = torch::tensor(
      {{0.5, 0.0, 0.194}, {0.5, 0.0, 0.438}, {1.144, 0.0, 0.1}, {0.5, 0.1, 0.02}}, torch::kFloat);
  torch::Tensor d, n;
  sdf.query(points, d, n);
  EXPECT_NEAR(d[0][0].item<double>(), -0.144, 1e-4);
  EXPECT_NEAR(d[1][0].item<double>(), 0.1, 1e-4);
  EXPECT_NEAR(d[2][0].item<double>(), 0.1, 1e-4);
  EXPECT_NEAR(d[3][0].item<double>(), 0.03, 1e-4);
}

TEST(AhmedBodyTest, LatinHypercubeIsStratifiedAndReproducible) {
  const auto a = ahmed_latin_hypercube(30, 7), again = ahmed_latin_hypercube(30, 7);
  const auto other = ahmed_latin_hypercube(30, 8);
  ASSERT_EQ(a.size(), 30u);
  std::vector<int> slant_bins(30, 0), width_bins(30, 0);
  for (size_t i = 0; i < a.size(); ++i) {
    EXPECT_EQ(a[i].slant_deg, again[i].slant_deg);
    EXPECT_EQ(a[i].length, again[i].length);
    EXPECT_NO_THROW(check_ahmed_body(a[i]));
    ++slant_bins[static_cast<size_t>(a[i].slant_deg / 40.0 * 30)];
    ++width_bins[static_cast<size_t>((a[i].width / 0.389 - 0.9) / 0.2 * 30)];
    EXPECT_EQ(a[i].front_radius, 0.1);
  }
  // One case in each of the 30 bins of every column.
  EXPECT_EQ(*std::min_element(slant_bins.begin(), slant_bins.end()), 1);
  EXPECT_EQ(*std::min_element(width_bins.begin(), width_bins.end()), 1);
  EXPECT_NE(a[0].slant_deg, other[0].slant_deg);
}

TEST(AhmedBodyTest, BodiesThatCannotBeBuiltAreRefusedNamingTheParameter) {
  AhmedBody b;
  b.front_radius = 0.2;
  EXPECT_NE(testing::error_message_of([&] { ahmed_body_mesh(b); }).find("front_radius"),
            std::string::npos);
  b = AhmedBody{};
  b.slant_deg = 95;
  EXPECT_NE(testing::error_message_of([&] { ahmed_body_mesh(b); }).find("slant_deg"),
            std::string::npos);
  b = AhmedBody{};
  b.slant_length = 1.0;
  b.slant_deg = 60;
  EXPECT_NE(testing::error_message_of([&] { ahmed_body_mesh(b); }).find("drops"),
            std::string::npos);
}

}  // namespace
}  // namespace slipstream::aero
